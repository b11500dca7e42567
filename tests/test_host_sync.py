"""No host round trip inside a forward pass (engine/model_runner.py ``ModelRunner.forward``): between a pass's inputs
and its logits nothing is read back to the host and no tensor is made from Python values, so a GPU never waits on
the host mid-pass and a decode step can be captured as a CUDA graph. Counted on the CPU with tests/host_sync.py's
``HostSyncs`` around every forward call of real engine runs: prompt passes (with shared prefixes) and decode steps,
plain and at a captured step's shapes, on the fixture model (base and one adapter) and on a tiny-width model of
SmolLM2's shape (30 layers, 9 query / 3 KV heads, its vocabulary)."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.host_sync import HostSyncs  # noqa: E402


def test_the_helper_sees_each_kind_of_host_round_trip() -> None:
    x = torch.randn(4, 3)
    trips = {"item": lambda: x[0, 0].item(), "int": lambda: int(x[0, 0]), "branch": lambda: 1 if x.sum() > 0 else 0,
             "tolist": lambda: x.tolist(), "list index": lambda: x[[0, 2]], "tensor of a list": lambda: torch.tensor([1])}
    for (name, trip), inference in itertools.product(trips.items(), (False, True)):
        with torch.inference_mode(inference), HostSyncs() as syncs:  # the engine runs in inference mode
            trip()
        assert len(syncs.found) == 1 and "test_host_sync.py" in syncs.found[0].where, (name, inference, syncs.found)
    with HostSyncs() as syncs:  # device-side work only
        idx = torch.arange(2)
        x[idx].index_copy_(0, idx, x[:2]).argmax(-1)
        torch.where(x > 0, x, torch.full_like(x, -1.0)).topk(2, dim=-1)
    assert syncs.found == []
    assert torch.Tensor.tolist.__name__ == "tolist"  # the wrapper is gone again


def _smollm2_shaped() -> tuple[Any, list[list[int]], int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=72, intermediate_size=96, num_hidden_layers=30, head_dim=64,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         max_position_embeddings=2048, rope_theta=100000.0)
    model = LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1)
    common = torch.randint(0, 49152, (40,), generator=gen).tolist()  # a shared prefix, as the cases' prompts share
    prompts = [common + torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (3, 17, 9, 30, 12, 5)]
    return model, prompts, 0


def _fixture() -> tuple[Any, list[list[int]], int]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import render_prompt
    from lm_eval_toolfid.prompts.settings import PromptSettings

    paths = fixture_paths()
    tok = AutoTokenizer.from_pretrained(paths["base"])
    model = AutoModelForCausalLM.from_pretrained(paths["base"])
    for i, (name, path) in enumerate(paths["adapters"].items()):
        if i == 0:
            model = PeftModel.from_pretrained(model, path, adapter_name=name)
        else:
            model.load_adapter(path, adapter_name=name)
    prompts = [tok(render_prompt(c, PromptSettings(demos=0)))["input_ids"] for c in load_cases("fixture")[:6]]
    return model.eval(), prompts, int(tok.pad_token_id or 0)


MODELS = {"fixture": _fixture, "smollm2-shaped": _smollm2_shaped}
_LOADED: dict[str, tuple[Any, list[list[int]], int]] = {}

PASSES = [pytest.param("fixture", "base", id="fixture-base"),
          pytest.param("fixture", "adapter", id="fixture-adapter", marks=pytest.mark.slow),
          pytest.param("smollm2-shaped", "base", id="smollm2-shaped-base", marks=pytest.mark.slow),
          pytest.param("fixture", "joint", id="fixture-joint", marks=pytest.mark.slow)]
"""The fixture's base in the quick tier; an adapter view, base and adapter rows in one pass (a joint run: the
stacked LoRA computation, engine/lora_batch.py) and SmolLM2's depth (30 layers) in the full suite."""


def _views(model: Any, which: str) -> tuple[Any, list[str | None]]:
    """The context to run in and the rows' views (a joint run: alternating base and adapter rows)."""
    adapters = list(getattr(model, "peft_config", {}))
    if which == "base":
        return (model.disable_adapter() if adapters else contextlib.nullcontext()), [None]
    if which == "adapter":
        model.set_adapter(adapters[0])
        return contextlib.nullcontext(), [None]
    return contextlib.nullcontext(), [None, adapters[0]]


WATCHED = 3
"""Forward calls of each kind watched per engine run: prompt passes (a shared prefix's, prompts on it, rows admitted
later) and decode steps."""


@pytest.mark.parametrize("model_name,view", PASSES)
def test_no_host_round_trip_inside_a_forward_pass(model_name: str, view: str) -> None:
    from bench._stand_in import Budget
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row
    from lm_eval_toolfid.engine.model_runner import ModelRunner

    if model_name not in _LOADED:
        _LOADED[model_name] = MODELS[model_name]()
    model, prompts, pad = _LOADED[model_name]
    context, views = _views(model, view)
    seen: dict[str, list[Any]] = {"prompt pass": [], "decode step": []}
    calls: dict[tuple[bool, str], int] = {}
    forward = ModelRunner.forward
    shapes = False

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        kind = "decode step" if kwargs.get("step") else "prompt pass"
        calls[shapes, kind] = calls.get((shapes, kind), 0) + 1
        if calls[shapes, kind] > WATCHED:  # the same code as the passes watched (the mode makes each op slow)
            return forward(self, *args, **kwargs)
        with HostSyncs() as syncs:
            out = forward(self, *args, **kwargs)
        seen[kind] += syncs.found
        return out

    outs = []
    with context, pytest.MonkeyPatch.context() as mp:
        mp.setattr(ModelRunner, "forward", counted)
        for shapes in (False, True):  # plain steps, and steps at a captured step's shapes
            rows = [Row(prompt=list(p), max_new=6, stopper=Budget(2 + i), view=views[i % len(views)])
                    for i, p in enumerate(prompts[:5])]
            # fold_gqa off: its one-off probe (engine/attention.py) would cost more than the test; it reads no tensor
            engine = GreedyEngine(model, pad, EngineConfig(max_batch=4, refill=1, min_shared=8, graph_shapes=shapes,
                                                           fold_gqa=False))
            outs.append([r.tokens for r in engine.run(rows)])
    for shapes in (False, True):  # a shared prefix, prompts on it, rows admitted later; steps
        assert calls[shapes, "prompt pass"] >= 3 and calls[shapes, "decode step"] > WATCHED, calls
    assert seen == {"prompt pass": [], "decode step": []}, "\n".join(map(str, seen["prompt pass"] + seen["decode step"]))
    assert outs[0] == outs[1]  # and the padded steps gave the same tokens
