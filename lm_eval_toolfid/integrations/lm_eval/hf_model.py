"""lm-eval's HFLM, generating this task's requests with toolfid's greedy engine (``toolfid-hf``).

``ToolfidHFLM`` differs from ``HFLM`` only for requests of the ``tool_use_fidelity`` tasks (their
doc has an ``expected_calls`` column) generated greedily: those go through
:class:`lm_eval_toolfid.engine.decoding.GreedyEngine` instead of ``model.generate``:

- every row stops on its own: at the model's EOS ids, at lm-eval's ``until`` strings, at
  ``max_gen_toks``, and — for cases answered by (at most) one call — at the end of that call
  (:class:`lm_eval_toolfid.integrations.lm_eval.stopping.RowStopper`; the scoring core answers those cases with
  the text up to the end of the first call, so outcomes equal a run that generated on);
- the whole view goes to the engine at once, which admits its rows in its scheduler's order (a shared prompt
  prefix's rows together, else longest first) and keeps a decode batch of ``batch_size`` rows full (``auto``:
  sized from free memory, :mod:`lm_eval_toolfid.integrations.lm_eval.batch_size`; out of memory, it halves the
  batch and says so);
- **verification**: a request that carries the base's answer (a *draft*) is checked in one forward
  pass instead of decoded token by token (docs/architecture.md, "The engine's stages"); drafts come from the base
  view of the same session (:attr:`ToolfidHFLM.drafts`, exact token ids, filled while :attr:`record_drafts` is
  on) or from the task (the request's :class:`~lm_eval_toolfid.integrations.lm_eval.hints.RequestHints`
  ``draft``: the stored base reference's text, re-tokenized).
  Whether a view verifies is :mod:`lm_eval_toolfid.integrations.lm_eval.verify_policy`'s rule: by default in float32,
  never by default in half precision (there a verified pass rounds differently from the base's decoding);
  the view's ``verify`` hint (metadata ``verify``) true forces it, false turns it off.

``_model_generate`` returns what lm-eval expects (context + continuation, padded), so lm-eval's own
decoding and ``until`` cut are unchanged. Each request gets ``Instance.toolfid_generation``: how
its tokens were obtained (accepted / verified / decoded, near ties), which the task summarises into
the view's provenance. Requests of other tasks, sampling, or a model the engine does not fit
(sliding-window caches, logits processors in the generation config) keep HFLM's path (with the
per-row stop at the end of the call where every request of the call allows it).

Registered as lm-eval model ``toolfid-hf`` (``toolfid lm-eval --model hf`` uses it); ``toolfid run``,
the demo and calibration load it directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils_hf import stop_sequences_criteria

from lm_eval_toolfid.integrations.lm_eval.batch_size import auto_batch_size, halve_on_oom, verify_logits_for
from lm_eval_toolfid.engine.decoding import (EngineConfig, EngineUnsupported, GreedyEngine, Row, engine_unsupported,
                                              near_tie_for)
from lm_eval_toolfid.engine.scheduler import drafting_stopped
from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper, eos_token_ids, make_stopping_criteria
from lm_eval_toolfid.integrations.lm_eval.verify_policy import VerifyChoice, choose_verify, combine_requests
from lm_eval_toolfid.integrations.lm_eval.generation_record import GenerationInfo, step_graphs_record
from lm_eval_toolfid.integrations.lm_eval.prompt_fit import check_prompts_fit
from lm_eval_toolfid.integrations.lm_eval.hints import RequestHints, hints_of
from lm_eval_toolfid.integrations.lm_eval.joint import (JointAnswer, JointRun, JointView, adapters_enabled,
                                                        joint_unsupported, views_that_fit)

log = logging.getLogger("lm_eval.toolfid")

_GREEDY_KEYS = {"do_sample", "temperature", "attention_mask"}
# generation-config settings that change greedy choices (logits processors): the engine applies none
_PROCESSOR_SETTINGS = ("repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
                       "bad_words_ids", "min_length", "min_new_tokens", "forced_bos_token_id",
                       "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
                       "exponential_decay_length_penalty", "num_beams", "guidance_scale", "watermarking_config",
                       "epsilon_cutoff", "eta_cutoff", "renormalize_logits", "remove_invalid_values")


def request_gen_kwargs(request: Any) -> dict[str, Any]:
    """A generate_until request's generation settings (``until``, ``max_gen_toks``, …); {} if none."""
    args = request.args
    return args[1] if len(args) > 1 and isinstance(args[1], dict) else {}


def single_call(request: Any) -> bool:
    """Whether a request is a tool_use_fidelity case answered by (at most) one call."""
    doc = getattr(request, "doc", None)
    if not isinstance(doc, dict) or "expected_calls" not in doc:
        return False
    try:
        return int(doc["expected_calls"]) <= 1
    except (TypeError, ValueError):
        return False


def is_toolfid_request(request: Any) -> bool:
    doc = getattr(request, "doc", None)
    return isinstance(doc, dict) and "expected_calls" in doc


@dataclass
class _Plan:
    """How one context of a generate_until call is generated."""

    call_end: bool
    verify: bool | None
    """The ``verify`` setting (None: not given; :func:`~lm_eval_toolfid.integrations.lm_eval.verify_policy.choose_verify`
    decides by the dtype)."""
    draft_text: str | None
    prefix: str = ""
    """What the scorer puts in front of the generation (plain-v3's primer): the stop rule reads it too."""
    check: bool = False
    """Let this row run on past its early stop (``check_stops``)."""

    @classmethod
    def of(cls, request: Any) -> _Plan:
        """From the hints the task attached (none: a request built otherwise, generated as one without settings)."""
        hints = hints_of(request) or RequestHints()
        return cls(call_end=single_call(request), verify=hints.view.verify, draft_text=hints.draft,
                   prefix=answer_prefix(request), check=hints.check_stop)


def answer_prefix(request: Any) -> str:
    """The text the scorer puts in front of this request's generation: what the task attached
    (:attr:`RequestHints.answer_prefix`), else the primer the prompt ends with (what every reader of
    lm-eval samples files restores)."""
    hints = hints_of(request)
    if hints is not None:
        return hints.answer_prefix
    from lm_eval_toolfid.prompts.plain import restore_primer

    return restore_primer(request.args[0], "")


def answer_key(max_new: int, stop: list[str], plan: _Plan) -> tuple[Any, ...]:
    """What an answer computed for one view must match to be another view's answer to the same prompt."""
    return (max_new, tuple(stop), plan.call_end, plan.prefix, plan.check, plan.verify)


def engine_blocker(model: Any, generation_kwargs: dict[str, Any]) -> str | None:
    """Why these generation settings are not plain greedy decoding (None when they are)."""
    extra = set(generation_kwargs) - _GREEDY_KEYS
    if extra:
        return f"generation kwargs {sorted(extra)}"
    if generation_kwargs.get("do_sample") or float(generation_kwargs.get("temperature") or 0.0) != 0.0:
        return "sampling"
    config = getattr(model, "generation_config", None)
    if config is not None:
        from transformers import GenerationConfig

        default = GenerationConfig()
        changed = [k for k in _PROCESSOR_SETTINGS if getattr(config, k, None) != getattr(default, k, None)]
        if changed:
            return f"generation config sets {changed}"
    return None


def _lm_eval_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return "(version unknown)"


@register_model("toolfid-hf")
class ToolfidHFLM(HFLM):
    """HFLM whose tool_use_fidelity requests go through toolfid's greedy engine (plain or verified)."""

    stop_at_call_end: bool = True
    use_engine: bool = True
    """False: transformers' generate in lm-eval's batches, with the per-row stop at the end of the call
    (the path before the engine; benchmarks compare the two)."""
    record_drafts: bool = False
    """While on, each generated row's tokens are stored in :attr:`drafts` (the base view of a session)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        graphs = kwargs.pop("cuda_graphs", False)
        super().__init__(*args, **kwargs)
        self._share_cases()
        self.cuda_graphs = graphs in (True, 1, "on", "true", "True")
        """Model arg ``cuda_graphs`` (``toolfid run --cuda-graphs on``): decode steps captured and replayed on a CUDA
        device (:mod:`lm_eval_toolfid.engine.step_graphs`); elsewhere ignored, said in one line."""
        if self.cuda_graphs and self.device.type != "cuda":
            log.warning("toolfid: --cuda-graphs on ignored: the model is on %s (CUDA graphs need a CUDA device)",
                        self.device.type)
            self.cuda_graphs = False
        self.drafts: dict[str, list[int]] = {}
        """context text -> the base's generated token ids (filled while ``record_drafts``)."""
        self.oom_halvings = 0
        self.engine_seconds = 0.0
        """Seconds spent in the engine (benchmarks split a view's time with it)."""
        self.engine_stats: Any = None
        self.row_hook: Any = None
        """Called ``(tokens, seconds)`` as each engine row finishes (``toolfid run``'s progress line)."""
        self._plans: dict[str, _Plan] = {}
        self._share_prefixes = True
        """Metadata ``prefix_cache`` of the view being generated (False if any of its requests says so)."""
        self._row_info: dict[str, GenerationInfo] = {}
        self._check_texts: dict[str, str] = {}
        """context -> the generation run on without the early stop (rows marked for ``check_stops``)."""
        self._batch_strings: list[str] | None = None
        """The strings of the batch lm-eval is generating: ``tok_batch_encode`` saves them for ``_model_generate``
        (HFLM calls the two in that order per batch: tests/test_couplings.py)."""
        self._stop_now = False
        self._engine_batch: int | str | None = None
        """The batch size asked for, while a whole view goes to the engine as one lm-eval batch."""
        self._engine_unsupported: str | None = None
        """Why this model cannot use the engine (None: it can), once :attr:`_engine_checked`."""
        self._engine_checked = False
        self._warned_fallback = False
        self._warned_call_order = False
        self._last_engine: Any = None
        """The engine of the latest run (its stats and near-tie bound)."""
        self.joint: JointRun | None = None
        """Views evaluated together (set by the session): the first of them to generate computes the others'
        answers in the same engine run (:mod:`~lm_eval_toolfid.integrations.lm_eval.joint`)."""
        self.view_label: str | None = None
        """The label of the view being evaluated (set by the session; None: a plain lm-eval run)."""
        self.shards: Any = None
        self.reused_tokens = 0
        """Tokens this model handed back that an earlier run's ranks computed (``--resume`` from their shards): not
        generated here, so a tokens-per-second figure leaves them out."""
        self._from_shards: set[tuple[str | None, str]] = set()
        """Where the answers of each engine run are kept until their views are saved, and read back by ``--resume``
        (set by the session: :class:`lm_eval_toolfid.run.shards.ShardStore`; None: nowhere)."""

    def _share_cases(self) -> None:
        """Under a launcher's ranks (``torchrun``: the process group joined) where HFLM does not split the cases
        itself (it does so only with several GPUs, one per rank): each rank takes its share of every view's requests
        (lm-eval's ``rank``/``world_size``) and lm-eval gathers the answers to rank 0, which scores them."""
        import torch.distributed as dist

        self._own_ranks = False
        if self.world_size > 1 or not (dist.is_available() and dist.is_initialized()):
            return
        if dist.get_world_size() > 1:
            self._rank, self._world_size = dist.get_rank(), dist.get_world_size()
            self._own_ranks = True

    def all_gather(self, tensor: Any) -> Any:
        """lm-eval's all-gather (each rank's request count): over the launcher's process group where the ranks are
        this model's own (:meth:`_share_cases`), else HFLM's."""
        if not getattr(self, "_own_ranks", False):
            return super().all_gather(tensor)
        import torch
        import torch.distributed as dist

        parts = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> Any:
        """lm-eval's gather of samples and metric values to rank 0, as one process has them: each value in its
        case's order, every metric any rank emitted (:mod:`~lm_eval_toolfid.integrations.lm_eval.data_parallel`)."""
        if self.world_size <= 1:
            return super().gather_object(obj, dst)
        from lm_eval_toolfid.integrations.lm_eval import data_parallel as dp

        metrics = dp.is_metrics(obj)
        gathered = super().gather_object(dp.with_positions(obj) if metrics else obj, dst)
        if not isinstance(gathered, list):
            return gathered
        if not metrics:
            return dp.merge_samples(gathered)
        merged = dp.merge_metrics(gathered)
        dp.cover_missing(merged[0])
        return merged

    def barrier(self) -> None:
        if not getattr(self, "_own_ranks", False):
            return super().barrier()
        import torch.distributed as dist

        dist.barrier()

    # -- lm-eval entry point -----------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        ours = [r for r in requests if is_toolfid_request(r)]
        check_prompts_fit(ours, self.tok_encode, int(self.max_length), int(self.max_gen_toks))  # before generating
        self._plans = {}
        views = {hints.view for hints in map(hints_of, ours) if hints is not None}
        self._share_prefixes = all(view.prefix_cache for view in views)
        for r in ours:
            context = r.args[0]
            plan = _Plan.of(r)
            seen = self._plans.get(context)
            if seen is not None:  # the same prompt twice: the cautious choice of both
                if seen.prefix != plan.prefix:  # the same prompt scored two ways: no early stop for it
                    plan.call_end = False
                plan = _Plan(seen.call_end and plan.call_end, combine_requests(seen.verify, plan.verify),
                             seen.draft_text or plan.draft_text, plan.prefix if plan.call_end else "",
                             seen.check or plan.check)
            self._plans[context] = plan
        self._row_info = {}
        self._check_texts = {}
        self._stop_now = self.stop_at_call_end and bool(requests) and len(ours) == len(requests)
        whole_view = (self.use_engine and bool(requests) and len(ours) == len(requests)
                      and self._engine_fits(requests) is None)
        saved = self.batch_size_per_gpu
        if whole_view:  # every request to the engine at once: it batches and schedules them itself
            self._engine_batch = saved
            self.batch_size_per_gpu = max(1, len(requests))
        else:
            self._engine_batch = None
            if str(saved).startswith("auto") and requests:
                # lm-eval's own auto detection prints to stdout (breaking --json) and runs a forward pass at
                # the model's whole context (32k tokens for Qwen2.5: over 20 GB on CPU): size from memory instead
                self.batch_size_per_gpu = self._auto_rows(requests)
        try:
            return super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self.batch_size_per_gpu = saved
            self._stop_now = False
            self._batch_strings = None
            for r in ours:
                info = self._row_info.get(r.args[0])
                if info is not None:
                    r.toolfid_generation = info
                if r.args[0] in self._check_texts:
                    r.toolfid_unstopped = self._check_texts[r.args[0]]

    def _auto_rows(self, requests: list[Any]) -> int:
        """``auto`` for lm-eval's generate path: the rows the free memory holds (prompt + generation budget)."""
        lengths = []
        for r in requests:
            kwargs = request_gen_kwargs(r)
            budget = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            lengths.append(min(self.max_length, len(self.tok_encode(r.args[0])) + budget))
        return auto_batch_size(self.model, self.device, lengths)

    def _engine_fits(self, requests: list[Any]) -> str | None:
        """Why these requests will not go to the engine (None: they will), decided before batching."""
        if not self._engine_checked:  # the model is final only once lm-eval has loaded it (and its adapter)
            self._engine_unsupported, self._engine_checked = engine_unsupported(self.model), True
        if self._engine_unsupported:
            return self._engine_unsupported
        for r in requests:
            kwargs = request_gen_kwargs(r)
            why = engine_blocker(self.model, {k: v for k, v in kwargs.items() if k not in ("until", "max_gen_toks")})
            if why:
                return why
        return None

    # -- adapters ------------------------------------------------------------------------------

    def attach_adapter(self, name: str, path: str, peft: bool = True) -> bool:
        """One more adapter on the loaded ``PeftModel`` (after the one lm-eval's ``peft=`` loaded): read into the
        engine's adapter store (:mod:`~lm_eval_toolfid.engine.adapter_store`: milliseconds) where the engine computes
        every row with the gathered LoRA (the engine on, the model and the first adapter fit it) and the store can
        represent it; otherwise through PEFT's ``load_adapter`` (``peft`` False: not at all). Returns whether it was
        stored."""
        from lm_eval_toolfid.engine.adapter_store import store_of, store_unsupported
        from lm_eval_toolfid.engine.lora_batch import lora_layers, stack_unsupported

        model = self.model
        why = ("the engine is off" if not self.use_engine else engine_unsupported(model)
               or stack_unsupported(model, lora_layers(model)))
        if why is None:
            why = store_unsupported(path, model)
        if why is None:
            store_of(model, create=True).add(name, path, model)  # type: ignore[union-attr]
            return True
        if peft:
            log.info("toolfid: adapter %r loaded through PEFT: %s", name, why)
            model.load_adapter(path, adapter_name=name)
        return False

    def detach_adapters(self, names: list[str]) -> None:
        """Stored adapters dropped from the engine's store (a null calibration's, once run)."""
        from lm_eval_toolfid.engine.adapter_store import store_of

        store = store_of(self.model)
        for name in names:
            if store is not None:
                store.adapters.pop(name, None)
                if store.active == name:
                    store.active = None

    def adapter_memory(self) -> str | None:
        """The adapters' memory in one line, the gathered LoRA stack built now (so the batch estimate that follows
        sees it): how many the engine's store holds and their bytes, the stack's bytes and device. None where the
        engine does not gather them (PEFT computes the rows)."""
        from lm_eval_toolfid.engine.adapter_store import store_of
        from lm_eval_toolfid.engine.lora_batch import lora_layers, lora_stack, stack_unsupported

        layers = lora_layers(self.model)
        if not self.use_engine or not layers or stack_unsupported(self.model, layers) is not None:
            return None
        stack = lora_stack(self.model, layers)
        store = store_of(self.model)
        stored = list(store.adapters.values()) if store is not None else []
        seen: set[int] = set()
        stored_bytes = 0
        for adapter in stored:  # identical files share their tensors: counted once
            for a, b, _ in adapter.modules.values():
                for t in (a, b):
                    if id(t) not in seen:
                        seen.add(id(t))
                        stored_bytes += t.numel() * t.element_size()
        stack_bytes = sum(t.numel() * t.element_size() for layer in stack.layers.values()
                          for group in layer.groups for t in (group.A, group.B))
        return (f"adapters: {len(stack.names)} gathered per LoRA layer ({len(stored)} read into the engine's store, "
                f"{stored_bytes / 2**20:.1f} MiB on the host; the gathered stack {stack_bytes / 2**20:.1f} MiB on "
                f"{stack.device}, rank classes {', '.join(map(str, stack.classes))})")

    def joint_unsupported(self, names: list[str]) -> str | None:
        """Why these adapters cannot share a batch (:func:`~lm_eval_toolfid.integrations.lm_eval.joint.joint_unsupported`,
        the engine's stored adapters counted as loaded)."""
        from lm_eval_toolfid.engine.adapter_store import stored_names

        return joint_unsupported(self.model, names, stored_names(self.model))

    def activate(self, name: str) -> None:
        """``name`` the adapter the next view runs: PEFT's active adapter, or a stored one (the engine computes it;
        PEFT's active adapter stays as it is)."""
        from lm_eval_toolfid.engine.adapter_store import store_of

        store = store_of(self.model)
        if store is not None and name in store.adapters:
            store.active = name
            return
        if store is not None:
            store.active = None
        self.model.set_adapter(name)

    def get_model_info(self) -> dict:
        """lm-eval's model info, asked once per view: counting a PEFT model's parameters walks every module (a
        millisecond a view with a hundred adapters), so it is kept while the model and its PEFT adapters stay the
        same (the engine's stored adapters add no parameter)."""
        model = self._model
        key = (id(model), tuple(getattr(model, "peft_config", None) or ()), str(getattr(model, "dtype", "")),
               getattr(self, "revision", None), getattr(self, "pretrained", None), getattr(self, "peft", None),
               getattr(self, "delta", None))
        held = self.__dict__.get("_toolfid_model_info")
        if held is None or held[0] != key:
            held = self.__dict__["_toolfid_model_info"] = (key, super().get_model_info())
        return dict(held[1])

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs: Any) -> list[int]:
        """HFLM's ``tok_encode``, each string tokenized once per model (every view of a run asks its prompts again:
        a hundred views tokenized the same twelve prompts a hundred times)."""
        key = (string, add_special_tokens, left_truncate_len, tuple(sorted(kwargs.items())))
        cache = self.__dict__.setdefault("_encoded", {})
        found = cache.get(key)
        if found is None:
            if len(cache) >= 16_384:
                cache.clear()
            found = cache[key] = tuple(super().tok_encode(string, add_special_tokens, left_truncate_len, **kwargs))
        return list(found)

    def tok_batch_encode(self, strings: list[str], *args: Any, **kwargs: Any) -> Any:
        self._batch_strings = list(strings)  # _model_generate's rows, in order
        key = (tuple(strings), args, tuple(sorted(kwargs.items())))
        cache = self.__dict__.setdefault("_batch_encoded", {})
        found = cache.get(key)
        if found is None:  # a view's batch is every other view's batch: tokenized once, handed out as copies
            if len(cache) >= 256:
                cache.clear()
            found = cache[key] = super().tok_batch_encode(strings, *args, **kwargs)
        return tuple(t.clone() for t in found)

    # -- generation ---------------------------------------------------------------------------

    def _model_generate(self, context: Any, max_length: int, stop: list[str], **generation_kwargs: Any) -> Any:
        strings = self._batch_strings
        plans = [self._plans.get(s) for s in strings] if strings and len(strings) == context.shape[0] else []
        if self.use_engine and self._plans and not plans and not self._warned_call_order:
            self._warned_call_order = True  # lm-eval changed how it hands a batch over: say so, never silently
            log.warning("toolfid: lm-eval %s generated a batch without handing over its prompts first "
                        "(tok_batch_encode, then _model_generate): generating with transformers' generate; "
                        "tests/test_couplings.py names this coupling", _lm_eval_version())
        if self.use_engine and plans and all(p is not None for p in plans):
            why_not = engine_blocker(self.model, generation_kwargs)
            if why_not is None:
                try:
                    return self._engine_generate(context, max_length, stop, strings, plans,  # type: ignore[arg-type]
                                                 generation_kwargs.get("attention_mask"))
                except EngineUnsupported as exc:
                    why_not = str(exc)
            self._note_fallback(strings, why_not)  # type: ignore[arg-type]
        return self._generate_in_batches(context, max_length, stop, **generation_kwargs)

    def _generate_in_batches(self, context: Any, max_length: int, stop: list[str], **generation_kwargs: Any) -> Any:
        """transformers' generate, in chunks of the batch size when lm-eval handed over the whole view (an adapter
        the engine stored is loaded into PEFT first: generate runs PEFT's forward)."""
        import torch

        from lm_eval_toolfid.engine.adapter_store import store_of
        from lm_eval_toolfid.engine.lora_batch import lora_layers

        store = store_of(self.model)
        if store is not None and store.active and not any(m.disable_adapters for m in lora_layers(self.model)):
            store.materialize(self.model, [store.active])

        strings = self._batch_strings if self._batch_strings and len(self._batch_strings) == context.shape[0] else None

        def one(ctx: Any, rows: slice, **kw: Any) -> Any:
            texts = strings[rows] if strings is not None else []
            plans = [self._plans.get(s) for s in texts]
            if not self._stop_now or not plans or any(p is None for p in plans):
                return super(ToolfidHFLM, self)._model_generate(ctx, max_length, stop, **kw)
            return self._generate_with_call_end(ctx, max_length, stop, texts, plans, **kw)  # type: ignore[arg-type]

        size = self._engine_batch
        if size is None or (isinstance(size, int) and size >= context.shape[0]):
            return one(context, slice(None), **generation_kwargs)
        if not isinstance(size, int):
            size = auto_batch_size(self.model, self.device, [max_length] * context.shape[0])
        mask = generation_kwargs.pop("attention_mask", None)
        pad = self.pad_id()
        out = torch.full((context.shape[0], max_length), pad, dtype=context.dtype, device=context.device)
        for i in range(0, context.shape[0], size):
            kw = dict(generation_kwargs, **({"attention_mask": mask[i:i + size]} if mask is not None else {}))
            chunk = one(context[i:i + size], slice(i, i + size), **kw)
            out[i:i + size, :chunk.shape[1]] = chunk
        return out

    def _note_fallback(self, strings: list[str], why: str) -> None:
        if not self._warned_fallback:
            self._warned_fallback = True
            log.info("toolfid: generating with transformers' generate (%s)", why)
        for s in strings:
            self._row_info[s] = GenerationInfo(engine="generate", reason=why)

    def _generate_with_call_end(self, context: Any, max_length: int, stop: list[str], strings: list[str],
                                plans: list[_Plan], **generation_kwargs: Any) -> Any:
        """transformers' generate with each row stopped by the engine's rule (:class:`RowStopper`); rows to
        check (``check_stops``) are generated once more with lm-eval's own stopping only."""
        import torch

        checks = [i for i, plan in enumerate(plans) if plan.check]
        if checks:
            idx = torch.tensor(checks, device=context.device)
            kw = {k: (v[idx] if k == "attention_mask" and v is not None else v) for k, v in generation_kwargs.items()}
            full = super()._model_generate(context[idx], max_length, stop, **kw)
            for j, i in enumerate(checks):
                self._check_texts[strings[i]] = self._as_lm_eval_text(full[j, context.shape[1]:].tolist(), stop)

        generation_kwargs["temperature"] = generation_kwargs.get("temperature", 0.0)
        do_sample = generation_kwargs.get("do_sample")
        if (temp := generation_kwargs.get("temperature")) == 0.0 and do_sample is None:
            generation_kwargs["do_sample"] = do_sample = False
        if do_sample is False and temp == 0.0:
            generation_kwargs.pop("temperature", None)
        criteria = stop_sequences_criteria(self.tokenizer, stop, context.shape[1], context.shape[0])
        criteria.append(make_stopping_criteria(self.tokenizer, context.shape[1], context.shape[0], stop,
                                               prefixes=[p.prefix for p in plans],
                                               call_end=[p.call_end and self.stop_at_call_end for p in plans]))
        with torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                            enabled=self.mixed_precision_dtype is not None):
            return self.model.generate(input_ids=context, max_length=max_length, stopping_criteria=criteria,
                                       pad_token_id=self.tokenizer.pad_token_id, use_cache=True,
                                       **generation_kwargs)

    def _engine_generate(self, context: Any, max_length: int, stop: list[str], strings: list[str],
                         plans: list[_Plan], attention_mask: Any) -> Any:
        import torch

        max_new = max(0, int(max_length) - context.shape[1])
        keys = [answer_key(max_new, stop, plan) for plan in plans]
        joint = self.joint
        current = joint.view(joint.current) if joint is not None else None
        label = current.label if current is not None else self.view_label
        if joint is not None and current is not None:
            found = joint.take(current.label, strings, keys)
            if found is not None:  # computed while an earlier view of the run generated
                self._count_reused(label, strings, [a.tokens for a in found])
                return self._assemble(context, max_new, strings, plans, stop,
                                      [(a.tokens, a.info, a.check_text) for a in found])
        stored = self._stored(label, strings, keys, self.record_drafts if current is None else current.adapter is None)
        if all(a is not None for a in stored):  # --resume: a rank's shard holds every answer
            self._count_reused(label, strings, [a[0] for a in stored])  # type: ignore[index]
            return self._assemble(context, max_new, strings, plans, stop, stored)  # type: ignore[arg-type]
        mask = attention_mask if attention_mask is not None else torch.ones_like(context)
        prompts = [row[m.bool()].tolist() for row, m in zip(context.cpu(), mask.cpu())]
        lanes: list[JointView | None] = [None]
        note = None
        if joint is not None and current is not None:
            fits = self._views_that_fit(prompts, max_new, joint, strings)
            note = joint.notes[-1] if joint.notes else None
            lanes = list(joint.group(fits, strings))
        lane_keys = [keys] + [[answer_key(max_new, stop, plan if lane.adapter is None
                                          else dataclasses.replace(plan, verify=lane.verify)) for plan in plans]
                              for lane in lanes[1:] if lane is not None]
        lane_stored = [stored] + [self._stored(lane.label if lane is not None else None, strings, lk,
                                               lane is not None and lane.adapter is None)
                                  for lane, lk in zip(lanes[1:], lane_keys[1:])]
        need = [i for i in range(len(strings)) if any(found[i] is None for found in lane_stored)]
        computed = self._run_lanes(lanes, [prompts[i] for i in need], max_new, stop, [strings[i] for i in need],
                                   [plans[i] for i in need], note) if need else [[] for _ in lanes]
        answers = []
        for found, fresh in zip(lane_stored, computed):
            merged = list(found)
            for j, i in enumerate(need):
                merged[i] = found[i] or fresh[j]
            answers.append(merged)
        if self.shards is not None and need:  # this engine run's answers on disk before any rank hands them on
            self.shards.keep({lane.label if lane is not None else label: {
                strings[i]: (lane_keys[k][i], *fresh[j]) for j, i in enumerate(need)}
                for k, (lane, fresh) in enumerate(zip(lanes, computed))
                if (lane.label if lane is not None else label) is not None})
        mine = answers[0]
        self._count_reused(label, strings, [a[0] for a in mine])
        for lane, lane_answers, keys_of_lane in zip(lanes[1:], answers[1:], lane_keys[1:]):
            assert joint is not None and lane is not None
            held = joint.answers.setdefault(lane.label, {})
            for s, key, (tokens, info, check) in zip(strings, keys_of_lane, lane_answers):  # the lane's own settings
                held[s] = JointAnswer(key, tokens, info, check)
        return self._assemble(context, max_new, strings, plans, stop, mine)

    def _stored(self, label: str | None, strings: list[str], keys: list[tuple[Any, ...]],
                base_lane: bool) -> list[tuple[list[int], GenerationInfo, str | None] | None]:
        """Per request: its answer from a shard a rank left (``--resume``: :attr:`shards`), or None; a base lane's
        stored tokens become the drafts adapter views verify, as if decoded here."""
        if self.shards is None:
            return [None] * len(strings)
        found = self.shards.lookup(label, strings, keys)
        out: list[tuple[list[int], GenerationInfo, str | None] | None] = []
        for s, answer in zip(strings, found):
            if answer is None:
                out.append(None)
                continue
            if base_lane:
                self.drafts[s] = list(answer.tokens)
            self._from_shards.add((label, s))
            out.append((list(answer.tokens), answer.info, answer.check_text))
        return out

    def _count_reused(self, label: str | None, strings: list[str], tokens: list[list[int]]) -> None:
        """The tokens handed back for view ``label`` that came from a shard (not generated in this process)."""
        if self._from_shards:
            self.reused_tokens += sum(len(t) for s, t in zip(strings, tokens) if (label, s) in self._from_shards)

    def _views_that_fit(self, prompts: list[list[int]], max_new: int, joint: JointRun, strings: list[str]) -> int:
        """How many views' rows the free memory holds at once (the KV of every row of each)."""
        from lm_eval_toolfid.integrations.lm_eval.batch_size import rows_in_memory

        fits = views_that_fit(rows_in_memory(self.model, self.device, [len(p) + max_new for p in prompts]),
                              len(prompts), len(joint.views))
        pending = joint.pending(strings)
        if fits < len(pending) and (joint.most is None or fits < joint.most):
            joint.notes.append(f"views decoded {fits} at a time: the free memory holds the KV of about "
                               f"{fits * len(prompts)}-{(fits + 1) * len(prompts) - 1} rows and a view has "
                               f"{len(prompts)}")
            log.warning("toolfid: %s", joint.notes[-1])
        return fits

    def _run_lanes(self, lanes: list[JointView | None], prompts: list[list[int]], max_new: int, stop: list[str],
                   strings: list[str], plans: list[_Plan],
                   note: str | None = None) -> list[list[tuple[list[int], GenerationInfo, str | None]]]:
        """One engine run for every lane's rows (a lane: one view of a joint run; None: the model as it is, the
        one lane of a view generated alone). Returns per lane, per request: (answer tokens, generation record,
        run-on text for ``check_stops``)."""
        import torch

        eos = eos_token_ids(self.model, self.tokenizer)
        call_end = self.stop_at_call_end
        joint = len(lanes) > 1
        specs = []  # per lane: (plans as the lane runs them, verify choices, drafts, draft sources)
        for lane in lanes:
            lane_plans = [plan if lane is None or lane.adapter is None else dataclasses.replace(plan, verify=lane.verify)
                          for plan in plans]
            choices = [self.verify_choice(plan.verify) for plan in lane_plans]
            base_lane = self.record_drafts if lane is None else lane.adapter is None
            drafted = [([], None) if base_lane else self._draft_for(s, plan, choice)
                       for s, plan, choice in zip(strings, lane_plans, choices)]
            specs.append((lane_plans, choices, drafted, base_lane))

        def make_rows() -> list[Row]:
            # a prompt's rows of every lane side by side (they share their passes); check_stops: a checked row runs
            # on past its early stop, to where lm-eval's generation ends
            return [Row(prompt=p, max_new=max_new, draft=spec[2][i][0], view=lane.adapter if joint and lane else None,
                        stopper=RowStopper(self.tokenizer, eos, stop, max_new,
                                           call_end=call_end and spec[0][i].call_end, prefix=spec[0][i].prefix),
                        run_on=RowStopper(self.tokenizer, eos, stop, max_new) if spec[0][i].check else None)
                    for i, p in enumerate(prompts) for lane, spec in zip(lanes, specs)]

        requested = self._engine_batch if self._engine_batch is not None else self.batch_size_per_gpu
        batch = requested if isinstance(requested, int) else auto_batch_size(
            self.model, self.device, [len(p) + max_new for p in prompts] * len(lanes), graphs=self.cuda_graphs)
        pad_id = self.pad_id(eos)

        def autocast() -> Any:
            return torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                  enabled=self.mixed_precision_dtype is not None)

        started = time.monotonic()

        def on_done(_index: int, result: Any) -> None:
            if self.row_hook is not None:
                self.row_hook(len(result.tokens), time.monotonic() - started)

        def run(max_batch: int, prefill_tokens: int) -> list[Any]:
            mixed = self.mixed_precision_dtype  # autocast: the logits come in that dtype, not the weights'
            config = EngineConfig(max_batch=max_batch, prefill_tokens=prefill_tokens,
                                  verify_logits=verify_logits_for(self.device, prefill_tokens),
                                  share_prefixes=self._share_prefixes, cuda_graphs=self.cuda_graphs,
                                  near_tie=near_tie_for(mixed) if mixed is not None else None)
            engine = GreedyEngine(self.model, pad_id, config, autocast=autocast)
            self._last_engine = engine
            return engine.run(make_rows(), on_done=on_done)

        with adapters_enabled(self.model) if joint else contextlib.nullcontext():
            results, used, halvings = halve_on_oom(run, batch, device=self.device)
        self.oom_halvings += halvings
        self.engine_stats = self._last_engine.stats
        self.engine_seconds += time.monotonic() - started
        labels = [lane.label for lane in lanes if lane is not None]
        out = []
        engine = self._last_engine
        for k, (lane, (lane_plans, choices, drafted, base_lane)) in enumerate(zip(lanes, specs)):
            answers = []
            for i, s in enumerate(strings):
                res, plan, choice, (_, source) = results[i * len(lanes) + k], lane_plans[i], choices[i], drafted[i]
                tokens = res.answer
                if base_lane:  # the base's tokens: what adapter views of this session verify
                    self.drafts[s] = list(tokens)
                info = GenerationInfo(
                    engine="toolfid", verify=choice.verify, verify_reason=choice.reason,
                    verify_requested=plan.verify, draft_source=source, draft_tokens=res.draft_len,
                    tokens=len(tokens), accepted=res.accepted, verified=res.verified,
                    decoded=res.decoded, near_ties=res.near_ties, finish=res.finish,
                    prompt_tokens=len(prompts[i]), prompt_tokens_shared=res.shared,
                    shared_near_ties=res.shared_near_ties, near_tie_tolerance=engine.near_tie,
                    decode_batch=used, oom_halvings=halvings, draft_dropped=res.draft_dropped,
                    drafting_stopped=drafting_stopped(engine, lane.adapter if joint and lane else None),
                    views_together=tuple(labels) if joint else (),
                    joint_near_ties=res.joint_near_ties if joint else 0,
                    views_together_note=note if joint else None, step_graphs=step_graphs_record(engine.stats),
                    lora_stacked=res.lora, lora_near_ties=res.lora_near_ties,
                )
                answers.append((list(tokens), info, self._as_lm_eval_text(res.tokens, stop) if plan.check else None))
            out.append(answers)
        return out

    def _assemble(self, context: Any, max_new: int, strings: list[str], plans: list[_Plan], stop: list[str],
                  answers: list[tuple[list[int], GenerationInfo, str | None]]) -> Any:
        """What lm-eval expects back (context + answer, padded), each row's generation record kept for the task."""
        import torch

        pad_id = self.pad_id()
        out = torch.full((context.shape[0], context.shape[1] + max_new), pad_id, dtype=context.dtype)
        out[:, :context.shape[1]] = context.cpu()
        for i, (s, (tokens, info, check)) in enumerate(zip(strings, answers)):
            if tokens:
                out[i, context.shape[1]:context.shape[1] + len(tokens)] = torch.tensor(tokens, dtype=context.dtype)
            if check is not None:
                self._check_texts[s] = check
            self._row_info[s] = info
        return out.to(context.device)

    def _as_lm_eval_text(self, tokens: list[int], stop: list[str]) -> str:
        """Generated tokens as lm-eval's HFLM returns them (decoded, cut at the first ``until`` string)."""
        from lm_eval.models.utils import postprocess_generated_text

        think = getattr(self, "think_end_token", None)
        return postprocess_generated_text(self.tok_decode(tokens), stop, think if isinstance(think, str) else None)

    def pad_id(self, eos: list[int] | None = None) -> int:
        """The id that pads rows (engine batches, generated rows of unequal length): the tokenizer's pad token,
        else its first EOS id, else 0. (lm-eval's HFLM gives a tokenizer without one a pad token when it loads,
        so the fallbacks are for tokenizers set otherwise.)"""
        if self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        eos = eos_token_ids(self.model, self.tokenizer) if eos is None else eos
        return eos[0] if eos else 0

    def compute_dtype(self) -> Any:
        """The dtype the logits are computed in: lm-eval's autocast dtype when set, else the weights'."""
        if self.mixed_precision_dtype is not None:
            return self.mixed_precision_dtype
        dtype = getattr(self.model, "dtype", None)
        return dtype if dtype is not None else next(self.model.parameters()).dtype

    def verify_choice(self, requested: bool | None) -> VerifyChoice:
        """Whether a row with this ``verify`` setting checks the base's answer or decodes (and why)."""
        return choose_verify(requested, self.compute_dtype())

    def _draft_for(self, context: str, plan: _Plan, choice: VerifyChoice) -> tuple[list[int], str | None]:
        """The base's tokens for this context, and where they came from (None: no draft)."""
        if not choice.verify or self.record_drafts:
            return [], None
        if context in self.drafts:
            return self.drafts[context], "session"
        if plan.draft_text:
            return self.tokenizer(plan.draft_text, add_special_tokens=False)["input_ids"], "reference"
        return [], None
