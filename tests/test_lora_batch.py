"""The stacked LoRA computation (``engine/lora_batch.py``): one computation per LoRA layer for every adapter of a pass.

On a tiny-width model of SmolLM2's depth (a ``LlamaForCausalLM`` config: 30 layers, random weights; r = 8 LoRAs on
q, k, v, o, gate, up and down made with PEFT), counted on the CPU with a ``TorchDispatchMode``:

- the guard: a decode step of the base + 10 adapters makes within 5% of the calls of the base + 1, and the engine's
  base step within 10% of a plain transformers forward with ``DynamicCache`` (a GPU step costs its launches);
- base rows and a B = 0 adapter's rows get the base's logits bit for bit, float32 and bfloat16; adapter rows PEFT's up
  to rounding; a forward reads nothing back to the host (no ``_local_scalar_dense``, no list made a tensor);
- the stack is built once and rebuilt when an adapter's weights change in place or an adapter is added; what it
  cannot represent (DoRA) goes to PEFT's mixed batch, said once;
- a single adapter's view computes its rows the same way as a joint run, and counts their near ties.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]


class _Never:
    """A stop rule that never stops (the budget ends the row)."""

    def push(self, token: int) -> str | None:
        return None


def _rows(views: list[str | None], max_new: int = 4) -> list[Any]:
    from lm_eval_toolfid.engine.rows import Row

    return [Row(prompt=p, stopper=_Never(), max_new=max_new, view=v) for p in PROMPTS for v in views]


def _syncs(counter: Any) -> dict[str, int]:
    return {k: v for k, v in counter.by_name.items() if k.endswith(("_local_scalar_dense", "lift_fresh"))}


def _tiny(layers: int, adapters: list[str], zero: bool) -> dict[str, Any]:
    """A tiny-width Llama of ``layers`` layers, plain and with r = 8 LoRAs (random B; ``zero``: one more, B = 0, as
    PEFT initialises it). The first adapter made by ``get_peft_model``, the others by PEFT's ``update_layer`` on each
    LoRA layer (what ``add_adapter`` does per layer, without its walk over every module per layer: 15 s at 30 layers)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=24, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=3,
                         num_key_value_heads=1, vocab_size=128, max_position_embeddings=128, tie_word_embeddings=True)
    base = LlamaForCausalLM(config).eval()
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS)
    model = get_peft_model(copy.deepcopy(base), lora, adapter_name=adapters[0])
    names = [*adapters, *(["zero"] if zero else [])]
    for name in names[1:]:
        model.peft_config[name] = lora
        for layer in model.modules():
            if isinstance(layer, LoraLayer):
                layer.update_layer(name, 8, 16, config=lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and ".zero." not in name:
                p.normal_(0, 0.05)
    return {"base": base, "model": model.eval(), "adapters": adapters}


@pytest.fixture(scope="module")
def deep() -> dict[str, Any]:
    """SmolLM2's depth (30 layers) at a tiny width, with ten adapters."""
    return _tiny(30, [f"a{k}" for k in range(10)], zero=False)


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    """Two layers, four adapters and a B = 0 one."""
    return _tiny(2, [f"a{k}" for k in range(4)], zero=True)


def _step_calls(model: Any, views: list[str | None]) -> int:
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine
    from lm_eval_toolfid.engine.step_cost import measure_steps

    import torch

    engine = GreedyEngine(model, 0, EngineConfig())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only wait for each other (seconds on a loaded machine)
    try:
        return measure_steps(engine, lambda: _rows(views), timing=False).calls_per_step
    finally:
        torch.set_num_threads(threads)


def test_a_decode_step_costs_the_same_calls_with_ten_adapters_as_with_one(deep: dict[str, Any]) -> None:
    import torch
    from transformers import DynamicCache

    from lm_eval_toolfid.engine.step_cost import call_counter

    tiny = deep
    model, adapters = tiny["model"], tiny["adapters"]
    one = _step_calls(model, [None, adapters[0]])
    ten = _step_calls(model, [None, *adapters])
    assert ten <= 1.05 * one, f"base + 10 adapters: {ten} calls a step, base + 1: {one}"
    base = _step_calls(tiny["base"], [None])
    with torch.inference_mode():  # a plain transformers decode step on the same rows
        ids = torch.tensor(PROMPTS)
        out = tiny["base"](input_ids=ids, past_key_values=DynamicCache(config=tiny["base"].config), use_cache=True)
        with call_counter() as counter:
            tiny["base"](input_ids=out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
    assert base <= 1.10 * counter.calls, f"the engine's base step: {base} calls, a plain forward: {counter.calls}"
    assert one <= 1.7 * base  # the LoRA computation: a few calls per layer, not a base step's worth per adapter


def _pass(model: Any, views: list[str | None], stack: bool = True) -> tuple[Any, bool]:
    import torch

    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.engine.model_runner import ModelFit, ModelRunner

    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]] * len(views))
    mask, positions = torch.ones_like(ids), torch.arange(ids.shape[1]).expand(len(views), -1)
    runner = ModelRunner(model, ModelFit.of(model), 0, EngineStats(), fold_gqa=False)
    with torch.inference_mode(), runner.routing(views, stack=stack) as stacked:
        return runner.forward(ids, mask, positions, None, ids.shape[1], views=views), stacked


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_base_and_zero_rows_are_the_base_bit_for_bit_and_adapter_rows_peft_up_to_rounding(tiny: dict[str, Any],
                                                                                          dtype: str) -> None:
    import torch

    model = copy.deepcopy(tiny["model"]).to(getattr(torch, dtype))
    views = [None, "zero", "a1", "a3", "zero", None]
    ours, stacked = _pass(model, views)
    peft, peft_stacked = _pass(model, views, stack=False)
    assert stacked and not peft_stacked
    for r in (1, 4, 5):  # every row shares the prompt: a base row, a B = 0 row
        assert torch.equal(ours[r], ours[0]), f"row {r} ({views[r]}) is not the base's, {dtype}"
    assert torch.equal(ours[0], peft[0])
    assert not torch.equal(ours[2], ours[0]) and not torch.equal(ours[2], ours[3])  # each adapter row its own delta
    tol = 1e-4 if dtype == "float32" else 0.25
    assert torch.allclose(ours, peft, atol=tol, rtol=0), (ours - peft).abs().max()


def test_a_stacked_forward_reads_nothing_back_to_the_host(tiny: dict[str, Any]) -> None:
    import torch

    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.engine.model_runner import ModelFit, ModelRunner
    from lm_eval_toolfid.engine.step_cost import call_counter

    model = tiny["model"]
    views = [None, "a1", "a2", "zero"]
    ids = torch.tensor([[5]] * len(views))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.zeros_like(ids)}
    runner = ModelRunner(model, ModelFit.of(model), 0, EngineStats(), fold_gqa=False)
    with torch.inference_mode():
        with model.disable_adapter(), call_counter() as plain:
            model(**inputs)
        with runner.routing(views) as stacked:
            assert stacked and runner.lora is not None
            runner.lora.select(runner.view_index(views))  # the rows' index, already on the device
            with call_counter() as counter:
                model(**inputs)
    assert _syncs(counter) == _syncs(plain), (_syncs(counter), _syncs(plain))  # the LoRA layers add none
    assert counter.by_name.get("aten.where", 0) == 7 * 2 + plain.by_name.get("aten.where", 0)


def test_the_stack_is_built_once_and_rebuilt_when_the_adapters_change(tiny: dict[str, Any]) -> None:
    import torch
    from peft import LoraConfig

    from lm_eval_toolfid.engine.lora_batch import lora_layers, lora_stack

    model = copy.deepcopy(tiny["model"])
    layers = lora_layers(model)
    first = lora_stack(model, layers)
    assert lora_stack(model, layers) is first
    assert first.names == ("a0", "a1", "a2", "a3", "zero") and first.rank == 8 and len(first.layers) == 2 * 7
    with torch.no_grad():  # a null calibration swaps weights into an adapter in place
        model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["a1"].weight.mul_(2)
    swapped = lora_stack(model, layers)
    assert swapped is not first
    model.add_adapter("late", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    grown = lora_stack(model, lora_layers(model))
    assert grown is not swapped and grown.names[-1] == "late" and grown.rank == 8


def test_what_the_stack_cannot_represent_goes_to_pefts_mixed_batch_said_once(tiny: dict[str, Any],
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    import torch
    from peft import LoraConfig

    import lm_eval_toolfid.engine.lora_batch as lb

    model = copy.deepcopy(tiny["model"])
    model.add_adapter("dora", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True))
    model.eval()
    lb._said.clear()
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        ours, stacked = _pass(model, [None, "a1"])
        _pass(model, [None, "a1"])
    assert not stacked
    said = [r.getMessage() for r in caplog.records if "one adapter at a time" in r.getMessage()]
    assert len(said) == 1 and "'dora'" in said[0], said
    peft, _ = _pass(model, [None, "a1"], stack=False)
    assert torch.equal(ours, peft)


def test_one_adapters_view_computes_its_rows_as_a_joint_run_and_counts_their_near_ties(tiny: dict[str, Any]) -> None:
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine

    model = tiny["model"]
    config = EngineConfig(near_tie=1e9)  # every token a near tie: the count must follow the rows that can differ
    joint = GreedyEngine(model, 0, config).run(_rows([None, "a2"], max_new=5))
    model.set_adapter("a2")
    try:
        alone = GreedyEngine(model, 0, config).run(_rows([None], max_new=5))
        with model.disable_adapter():
            base = GreedyEngine(model, 0, config).run(_rows([None], max_new=5))
    finally:
        model.set_adapter("a0")
    assert [r.tokens for r in alone] == [r.tokens for r in joint[1::2]]
    assert [r.tokens for r in base] == [r.tokens for r in joint[0::2]]
    assert all(r.lora and r.lora_near_ties == 5 for r in [*alone, *joint[1::2]])
    assert not any(r.lora or r.lora_near_ties for r in [*base, *joint[0::2]])


def test_stacked_rows_near_ties_are_summed_and_shown() -> None:
    """A view's stacked adapter rows: their near ties summed into its generation record and printed (``--verbose``)
    beside the other near ties, never silent."""
    from types import SimpleNamespace

    from lm_eval_toolfid.integrations.lm_eval.generation_record import GenerationInfo, summarize_generation
    from lm_eval_toolfid.reporting.screen import verification_note

    rows = [GenerationInfo(engine="toolfid", tokens=5, lora_stacked=True, lora_near_ties=n) for n in (0, 2, 1)]
    gen = summarize_generation(rows, verify=False)
    assert (gen["rows_lora_stacked"], gen["lora_near_tie_tokens"], gen["lora_near_tie_cases"]) == (3, 3, 2)
    assert "lora_near_tie_tokens" not in summarize_generation([GenerationInfo(engine="toolfid", tokens=5)], False)
    note = verification_note([SimpleNamespace(label="prose", toolfid={"generation": gen})])
    assert "near ties in adapter rows" in note and "prose 3 token(s) in 2 case(s)" in note, note
