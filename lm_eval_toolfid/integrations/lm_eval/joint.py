"""Views decoded together: the base and its adapters in one engine run, each row carrying its view.

A session that evaluates several views of one loaded model (``toolfid run``: the base, then every adapter)
hands the model a :class:`JointRun`. The first of those views to generate runs the engine once for its own
rows *and* the rows of the views after it, each row under its own adapter (the engine's one LoRA
computation per layer for every adapter, ``engine/lora_batch.py``, or PEFT's mixed-batch ``adapter_names`` where that
cannot represent them: the LoRA delta is applied per row, base rows add nothing), so every decode step serves
every view; the answers of the other views wait in the :class:`JointRun` until their own ``simple_evaluate``
asks for them. Each view is still an ordinary lm-eval evaluation (results, samples, reference, resume as
before); only where its tokens were computed changes.

What may go together (:meth:`JointRun.group`):

- the base and the adapter views that *decode* (half precision by default, or ``--no-verify``): one run;
- adapter views that *verify* the base's answers (float32 by default) need those answers first: they run
  together after the base view, each row checking the base's tokens under its own adapter;
- as many views as memory holds (:func:`views_that_fit`): the KV of every view's rows must fit at once;
  more views run in groups, and the run says so (``--views-together N`` caps a group; 1: one view at a time).

Answers equal each view run alone: in float32 token for token (a row's arithmetic does not depend on the
other rows of its batch; tested on the fixture's adapters and on SmolLM2); in half precision a base row and a
zero-delta adapter row share their kernels and agree bit for bit, while a real adapter's delta, applied to its
sub-batch, can round otherwise than alone: such differences sit at counted near ties.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence


@dataclass(frozen=True)
class JointView:
    """One view of a joint run."""

    label: str
    adapter: str | None
    """The PEFT adapter name its rows run under (None: the base, no delta)."""
    verify: bool | None = None
    """The view's ``verify`` setting (None: the dtype decides)."""
    verifies: bool = False
    """Whether its rows check the base's answers (then it waits for the base view)."""


@dataclass(frozen=True)
class JointAnswer:
    """One view's answer to one prompt, computed while another view generated."""

    key: tuple[Any, ...]
    """What the request must match to take it (budget, stop strings, the row's plan)."""
    tokens: list[int]
    info: Any
    """Its :class:`~lm_eval_toolfid.integrations.lm_eval.generation_record.GenerationInfo`."""
    check_text: str | None = None


@dataclass
class JointRun:
    """The views a session evaluates together, and the answers computed ahead for those not yet evaluated."""

    views: list[JointView]
    most: int | None = None
    """At most this many views in one engine run (``--views-together``; None: as many as memory holds)."""
    current: str | None = None
    """The label of the view being evaluated (set by the session)."""
    answers: dict[str, dict[str, JointAnswer]] = field(default_factory=dict)
    """label -> context -> answer."""
    groups: list[list[str]] = field(default_factory=list)
    """The labels of each engine run, in order."""
    notes: list[str] = field(default_factory=list)
    """Why views went in more than one group (one line each)."""
    computed: dict[str, set[str]] = field(default_factory=dict)
    """label -> the requests (contexts) whose answers an engine run has computed for that view. A view is done
    with a batch of requests when all of them are here, not after its first engine run: lm-eval generates a
    view's requests in one batch per distinct generation settings (a case with its own ``max_new_tokens`` makes
    another), and each batch is decoded together with the views after it."""

    def view(self, label: str | None) -> JointView | None:
        return next((v for v in self.views if v.label == label), None)

    def take(self, label: str, strings: Sequence[str], keys: Sequence[tuple[Any, ...]]) -> list[JointAnswer] | None:
        """The answers computed ahead for view ``label``, if every request has one with a matching key."""
        held = self.answers.get(label)
        if not held:
            return None
        found = [held.get(s) for s in strings]
        if any(a is None or a.key != k for a, k in zip(found, keys)):
            return None
        for s in set(strings):  # a prompt asked twice (lm-eval's padding of a rank's share, two cases alike): once
            del held[s]
        return found  # type: ignore[return-value]

    def pending(self, strings: Sequence[str]) -> list[JointView]:
        """The views whose answers to these requests no engine run has computed yet."""
        wanted = set(strings)
        return [v for v in self.views if not wanted <= self.computed.get(v.label, set())]

    def group(self, fits: int, strings: Sequence[str]) -> list[JointView]:
        """The current view and the views not computed yet for these requests that may go with it, at most
        ``fits`` (and :attr:`most`): a group with the base takes no view that verifies the base's answers.
        The views in the group are marked computed for ``strings``."""
        first = self.view(self.current)
        assert first is not None
        pending = {v.label for v in self.pending(strings)}
        cap = max(1, min(fits, self.most or fits))
        group = [first]
        for v in self.views:
            if len(group) >= cap:
                break
            if v is first or v.label not in pending:
                continue
            if v.verifies and any(g.adapter is None for g in group):
                continue
            if v.adapter is None and any(g.verifies for g in group):
                continue
            group.append(v)
        labels = [v.label for v in group]
        if labels not in self.groups:  # one entry per distinct group (a group serves each batch of settings)
            self.groups.append(labels)
        for v in group:
            self.computed.setdefault(v.label, set()).update(strings)
        return group


def views_that_fit(free_rows: int | None, rows_per_view: int, views: int) -> int:
    """How many views' rows fit in memory at once (``free_rows``: rows whose KV the free memory holds; None:
    unknown, all of them)."""
    if free_rows is None:
        return views
    return max(1, min(views, free_rows // max(1, rows_per_view)))


def joint_unsupported(model: Any, adapters: Sequence[str], stored: Sequence[str] = ()) -> str | None:
    """Why the adapters of ``model`` cannot share a batch (None: they can): each must be a plain LoRA
    (PEFT's mixed batches take no DoRA, no other adapter type), none merged; ``stored``: adapters the engine read
    into its store (plain LoRAs by construction)."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict):
        return "the model has no PEFT adapters"
    for name in adapters:
        config = configs.get(name)
        if config is None and name in stored:
            continue
        if config is None:
            return f"adapter {name!r} is not loaded"
        kind = str(getattr(config, "peft_type", "")).rsplit(".", 1)[-1]
        if kind != "LORA":
            return f"adapter {name!r} is {kind or 'not a LoRA'} (PEFT mixes LoRA adapters only)"
        if getattr(config, "use_dora", False):
            return f"adapter {name!r} uses DoRA (PEFT's mixed batches do not)"
    for module in model.modules():
        if getattr(module, "merged", False):
            return "an adapter is merged into the weights"
    return None


@contextlib.contextmanager
def adapters_enabled(model: Any) -> Iterator[None]:
    """PEFT's adapter layers on for a joint run (a base view runs inside ``disable_adapter()``; a joint run names
    each row's adapter, ``__base__`` for the base's rows), restored after. Inside ``disable_adapter()`` PEFT drops
    ``adapter_names`` without a word and every row would get the active adapter: both PEFT's flag and the layers'
    are switched, and a model still refusing mixed batches is an error, never a silent wrong answer."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # no PEFT: nothing to enable
        yield
        return
    off = [m for m in model.modules() if isinstance(m, BaseTunerLayer) and m.disable_adapters]
    flag = getattr(model, "_adapters_disabled", None)
    for m in off:
        m.enable_adapters(True)
    if flag:
        model._adapters_disabled = False
    try:
        if not getattr(model, "has_active_enabled_adapter", True):
            raise RuntimeError("PEFT would ignore the rows' adapter names (no active, enabled adapter)")
        yield
    finally:
        if flag:
            model._adapters_disabled = flag
        for m in off:
            m.enable_adapters(False)
