"""``toolfid run --backend vllm``: base + many LoRA adapters in ONE vLLM engine, one batched generate.

NOT TESTED HERE: this environment has no GPU and no vLLM. The engine-independent half (collect
every view's requests, generate them all at once, replay each view through lm-eval so scoring,
pairing and the verdict are exactly the task's) is tested with a Hugging Face stand-in engine in
tests/test_vllm_backend.py; the vLLM calls themselves (``LLM``, ``LoRARequest``, ``SamplingParams``)
follow lm-eval's own ``--model vllm`` class and have not been run.

How it works:

1. ``collect_requests``: each view's lm-eval requests (prompt, generation kwargs) are built by
   the task itself (``build_all_requests``), so prompts are byte-identical to a CLI run.
2. ``generate_all``: one call with every (prompt, view) pair; with vLLM each prompt carries its
   view's ``LoRARequest`` (``None`` for the base), so the engine batches the base and all adapters
   together (multi-LoRA batching, ``max_loras`` adapters resident at once).
3. ``ReplayLM``: each view is then an ordinary ``simple_evaluate`` whose LM answers from those
   generations; the base view runs first and writes the reference the adapter views pair with,
   as in the two-run ``lm_eval`` flow. Texts are post-processed exactly like lm-eval's vLLM class
   (cut at the ``until`` strings), so outcomes match ``lm_eval --model vllm`` runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable, Sequence

from lm_eval_toolfid.cases.bundled import tasks_path
from lm_eval_toolfid.core.errors import ToolfidError

# (view label, adapter path or None for the base) and (prompt, gen_kwargs) -> generated text
View = tuple[str, str | None]
GenerateAll = Callable[[list[tuple[str, dict[str, Any], View]]], list[str]]


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ToolfidError("--backend vllm needs vLLM (and a CUDA GPU): pip install vllm, or use --backend hf")


def _task_manager(model_args: dict[str, Any], metadata: dict[str, Any]) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(tasks_path()), include_defaults=False, metadata={**model_args, **metadata})


def collect_requests(task: str, model_args: dict[str, Any], metadata: dict[str, Any]) -> list[tuple[str, dict]]:
    """The (context, gen_kwargs) of every request the task makes for one view, in task order."""
    task_obj = _task_manager(model_args, metadata).load([task])["tasks"][task]
    task_obj.build_all_requests(rank=0, world_size=1)
    return [(inst.args[0], dict(inst.args[1])) for inst in task_obj.instances]


class ReplayLM:
    """An lm-eval LM that answers ``generate_until`` from texts generated beforehand."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from lm_eval.api.model import LM

        class _Replay(LM):
            def __init__(self, texts: dict[str, str]) -> None:
                super().__init__()
                self.texts = texts

            def generate_until(self, requests: Any, disable_tqdm: bool = False) -> list[str]:
                missing = [r.args[0][:60] for r in requests if r.args[0] not in self.texts]
                if missing:
                    raise ToolfidError(f"no prefetched generation for {len(missing)} request(s), e.g. {missing[0]!r}")
                return [self.texts[r.args[0]] for r in requests]

            def loglikelihood(self, requests: Any, disable_tqdm: bool = False) -> Any:
                raise ToolfidError("tool_use_fidelity only generates; loglikelihood is not available here")

            loglikelihood_rolling = loglikelihood

        return _Replay(*args, **kwargs)


def run_views_prefetched(base: str, adapters: dict[str, str], task: str, metadata: dict[str, Any],
                         generate_all: GenerateAll, out_dir: Path | None = None) -> tuple[Any, list[Any]]:
    """Base view + every adapter view from ONE ``generate_all`` call; returns runner.ViewResult objects."""
    import lm_eval.evaluator
    from lm_eval import simple_evaluate

    from lm_eval_toolfid.reporting.view_store import ViewResult, save_view

    lm_eval.evaluator.get_git_commit_hash = lambda: None
    views: list[View] = [("base", None)] + [(name, path) for name, path in adapters.items()]
    model_args = {"pretrained": base}
    batch: list[tuple[str, dict[str, Any], View]] = []
    for view in views:
        args = dict(model_args, **({"peft": view[1]} if view[1] else {}))
        batch += [(ctx, gen, view) for ctx, gen in collect_requests(task, args, metadata)]
    texts = generate_all(batch)
    if len(texts) != len(batch):
        raise ToolfidError(f"backend returned {len(texts)} generations for {len(batch)} requests")
    per_view: dict[View, dict[str, str]] = {v: {} for v in views}
    for (ctx, _, view), text in zip(batch, texts):
        per_view[view][ctx] = text

    results = []
    for view in views:
        label, adapter = view
        args = dict(model_args, **({"peft": adapter} if adapter else {}))
        out = simple_evaluate(model=ReplayLM(per_view[view]), model_args=args, tasks=[task],
                              task_manager=_task_manager(args, metadata), log_samples=True, bootstrap_iters=0)
        if out is None:
            raise ToolfidError("lm-eval returned no results")
        samples = out.pop("samples", {}).get(task, [])
        result = ViewResult(label=label, adapter=adapter, results=out, samples=samples)
        if out_dir is not None:
            result.path = save_view(result, out_dir)
        results.append(result)
    return results[0], results[1:]


def vllm_generate_all(base: str, adapters: dict[str, str], max_lora_rank: int = 64,
                      **engine_kwargs: Any) -> GenerateAll:
    """A ``generate_all`` backed by one vLLM engine with every adapter as a ``LoRARequest`` (untested here)."""
    require_vllm()
    from lm_eval.models.utils import postprocess_generated_text
    from lm_eval.models.vllm_causallms import VLLM
    from vllm.lora.request import LoRARequest

    first = next(iter(adapters.values()))
    lm = VLLM(pretrained=base, lora_local_path=first, max_lora_rank=max_lora_rank,
              max_loras=min(len(adapters), engine_kwargs.pop("max_loras", 8)), **engine_kwargs)
    lora_ids = {path: LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(adapters.items())}
    eos = lm.tokenizer.decode(lm.eot_token_id) or getattr(lm.tokenizer, "eos_token", None)

    def generate_all(batch: Sequence[tuple[str, dict[str, Any], View]]) -> list[str]:
        from vllm import SamplingParams, TokensPrompt

        prompts, params, loras, untils = [], [], [], []
        for (ctx, gen, (_, adapter)), toks in zip(batch, lm.tok_encode([b[0] for b in batch])):
            kwargs, until, max_gen_toks = lm.modify_gen_kwargs(gen, eos=eos, default_max_gen_toks=lm.max_gen_toks)
            toks = toks[-(lm.max_length - max_gen_toks):]
            prompts.append(TokensPrompt(prompt_token_ids=toks))
            params.append(SamplingParams(max_tokens=max_gen_toks, stop=until, **kwargs))
            loras.append(lora_ids[adapter] if adapter else None)
            untils.append(until)
        outputs = lm.model.generate(prompts, sampling_params=params, lora_request=loras, use_tqdm=True)
        return [postprocess_generated_text(o.outputs[0].text, until, None) for o, until in zip(outputs, untils)]

    return generate_all


def run_views_vllm(base: str, adapters: dict[str, str], task: str, metadata: dict[str, Any],
                   out_dir: Path | None = None, max_lora_rank: int = 64, **engine_kwargs: Any) -> tuple[Any, list[Any]]:
    """``toolfid run --backend vllm``: what C's runner calls (untested here: no GPU)."""
    return run_views_prefetched(base, adapters, task, metadata,
                                vllm_generate_all(base, adapters, max_lora_rank, **engine_kwargs), out_dir)
