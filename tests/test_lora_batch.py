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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_pass_named_on_the_host_skips_what_its_rows_need_not_compute_bit_for_bit(tiny: dict[str, Any],
                                                                                   dtype: str) -> None:
    """A prompt or verification pass names its rows' adapters on the host: where no row has a delta (B = 0 rows, base
    rows) a layer computes nothing of the LoRA, where every row has one it skips the ``where``; the answers are those
    of the per-row ``where`` a decode step (which a CUDA graph replays for other rows) keeps."""
    import torch

    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.engine.model_runner import ModelFit, ModelRunner
    from lm_eval_toolfid.engine.step_cost import call_counter

    model = copy.deepcopy(tiny["model"]).to(getattr(torch, dtype))
    runner = ModelRunner(model, ModelFit.of(model), 0, EngineStats(), fold_gqa=False)
    layers = 7 * 2
    for views, bmm, where in ((["zero", None, "zero"], 0, 0), (["a1", "a2", "a3"], 2 * layers, 0),
                              ([None, "a1", "zero"], 2 * layers, layers)):
        ids = torch.tensor([[3, 1, 4, 1, 5]] * len(views))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                  "position_ids": torch.arange(ids.shape[1]).expand(len(views), -1)}
        with torch.inference_mode(), runner.routing(views) as stacked:
            assert stacked
            runner.adapters.route(views, runner.view_ids(views))  # a prompt pass: named on the host
            assert runner.lora.current.known is not None
            with call_counter() as named:
                by_name = model(**inputs).logits
            runner.adapters.route(views, runner.view_ids(views), step=True)  # a decode step: per row on the device
            assert runner.lora.current.known is None
            with call_counter() as counted:
                per_row = model(**inputs).logits
        assert torch.equal(by_name, per_row), (views, dtype)
        assert named.by_name.get("aten.bmm", 0) + named.by_name.get("aten.baddbmm", 0) == bmm, views
        assert named.by_name.get("aten.where", 0) - counted.by_name.get("aten.where", 0) == where - layers, views
        assert _syncs(named) == _syncs(counted)


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
    assert first.names == ("a0", "a1", "a2", "a3", "zero") and first.classes == (8,) and len(first.layers) == 2 * 7
    with torch.no_grad():  # a null calibration swaps weights into an adapter in place
        model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["a1"].weight.mul_(2)
    swapped = lora_stack(model, layers)
    assert swapped is not first
    model.add_adapter("late", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    grown = lora_stack(model, lora_layers(model))
    assert grown is not swapped and grown.names[-1] == "late" and grown.classes == (8,)


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


def _add(model: Any, name: str, rank: int, seed: int) -> None:
    """One more LoRA on every target, random B, through PEFT's ``update_layer`` (as :func:`_tiny` adds them)."""
    import torch
    from peft import LoraConfig
    from peft.tuners.lora import LoraLayer

    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS)
    model.peft_config[name] = config
    for layer in model.modules():
        if isinstance(layer, LoraLayer):
            layer.update_layer(name, rank, 2 * rank, config=config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if f"lora_B.{name}." in key:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model.eval()


def _decode_flops(model: Any, views: list[str | None]) -> float:
    """FLOPs of one decode-shaped pass (one position a row) of ``views``' rows, per row (torch's FlopCounterMode)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.engine.model_runner import ModelFit, ModelRunner

    ids = torch.tensor([[5]] * len(views))
    mask, positions = torch.ones_like(ids), torch.zeros_like(ids)
    runner = ModelRunner(model, ModelFit.of(model), 0, EngineStats(), fold_gqa=False)
    with torch.inference_mode(), runner.routing(views):
        assert runner.lora is not None
        with FlopCounterMode(display=False) as counter:
            runner.forward(ids, mask, positions, None, 1, step=True, views=views)
    return counter.get_total_flops() / len(views)


def test_a_rows_flops_are_flat_in_the_number_of_adapters_and_a_wide_one_costs_only_its_own_rows() -> None:
    """FLOPs per decode row-step with 16 adapters loaded within 10% of one loaded (each row computes its own
    adapter's blocks, not every adapter's); an r = 64 adapter loaded beside r = 8 ones widens none of their rows."""
    one = _tiny(2, ["a0"], zero=False)["model"]
    sixteen = _tiny(2, [f"a{k}" for k in range(16)], zero=False)["model"]
    flat_one = _decode_flops(one, ["a0"] * 8)
    flat_16 = _decode_flops(sixteen, [f"a{k}" for k in range(16)][:8])
    assert flat_16 <= 1.10 * flat_one, (flat_16, flat_one)
    _add(sixteen, "wide", 64, seed=1)
    assert _decode_flops(sixteen, [f"a{k}" for k in range(8)]) == flat_16  # their rows: their own rank class
    assert _decode_flops(sixteen, ["wide"] * 8) > 2 * flat_16  # its own rows pay for its width


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_pass_named_on_the_host_computes_each_rank_class_on_its_own_rows_only(dtype: str) -> None:
    """A prompt or verification pass mixing r = 8 and r = 64 adapters (and base rows): each row pays only its own
    class's products (FLOPs of the mixed pass = those of each class's rows alone), and gets the logits it gets when
    the r = 64 rows are r = 8 ones instead (the same batch shape: the base's GEMM alike) and in a decode step's
    per-row computation of the same pass, bit for bit."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.engine.model_runner import ModelFit, ModelRunner

    model = _tiny(2, ["a0", "a1"], zero=False)["model"]
    _add(model, "wide", 64, seed=1)
    model = model.to(getattr(torch, dtype))
    runner = ModelRunner(model, ModelFit.of(model), 0, EngineStats(), fold_gqa=False)
    views_all = ["a0", "a1", "wide", None]

    def run(views: list[str | None], step: bool = False) -> tuple[Any, float]:
        ids = torch.tensor([[3, 1, 4, 1, 5]] * len(views))
        mask, positions = torch.ones_like(ids), torch.arange(ids.shape[1]).expand(len(views), -1)
        with torch.inference_mode(), runner.routing(views_all), FlopCounterMode(display=False) as counter:
            index = runner.view_ids(views) if step else None
            logits = runner.forward(ids, mask, positions, None, ids.shape[1], step=step, views=views, view_index=index)
        return logits, counter.get_total_flops()

    narrow, wide, base = ["a0", "a1", "a0"], ["wide", "wide"], [None]
    mixed = ["a0", "wide", None, "a1", "wide", "a0"]
    logits, flops = run(mixed)
    alone = {tuple(v): run(v) for v in (narrow, wide, base)}
    assert flops == sum(f for _, f in alone.values()), (flops, {k: f for k, (_, f) in alone.items()})
    swapped, _ = run(["a0", "a1", None, "a1", "a0", "a0"])  # the r = 64 rows replaced by r = 8 ones
    for row in (0, 2, 3, 5):
        assert torch.equal(logits[row], swapped[row]), (mixed[row], dtype)
    per_row, step_flops = run(mixed, step=True)  # a decode step: every class for every row, decided on the device
    assert torch.equal(logits, per_row) and step_flops > flops


def test_a_rows_logits_do_not_depend_on_the_other_adapters_loaded_in_any_dtype(tiny: dict[str, Any]) -> None:
    """The same rows with two adapters loaded and with seven (another rank class among them): bit for bit the same
    logits, float32 and bfloat16 (the stack's size never changes a row's arithmetic)."""
    import torch

    for dtype in (torch.float32, torch.bfloat16):
        few = copy.deepcopy(tiny["model"]).to(dtype)
        for name in ("a2", "a3", "zero"):
            few.delete_adapter(name)
        many = copy.deepcopy(tiny["model"])
        _add(many, "wide", 32, seed=2)
        _add(many, "other", 8, seed=3)
        many = many.to(dtype)
        views = [None, "a0", "a1", "a0"]
        assert torch.equal(_pass(few, views)[0], _pass(many, views)[0]), dtype


def test_a_nan_in_one_adapter_reaches_no_other_row(tiny: dict[str, Any]) -> None:
    """An adapter with a NaN in one weight: its own rows are NaN, every other row (the base, other adapters, B = 0)
    is what it is without that adapter, bit for bit."""
    import torch

    clean = tiny["model"]
    poisoned = copy.deepcopy(clean)
    with torch.no_grad():
        poisoned.base_model.model.model.layers[0].self_attn.q_proj.lora_B["a3"].weight[0, 0] = float("nan")
    views = [None, "a1", "a3", "zero", "a2"]
    ours, clean_rows = _pass(poisoned, views)[0], _pass(clean, views)[0]
    assert torch.isnan(ours[2]).any()
    for r in (0, 1, 3, 4):
        assert torch.equal(ours[r], clean_rows[r]), views[r]


def test_in_bfloat16_the_lora_arithmetic_rounds_once_as_peft_does(tiny: dict[str, Any]) -> None:
    """One bfloat16 LoRA layer, PEFT's forward (adapter weights in float32, ``autocast_adapter_dtype``) against the
    gathered one: the delta computed in float32 and rounded once, so nearly every output is PEFT's own (the issue
    measured 44% differing when the stack held the weights in bfloat16)."""
    import torch
    from peft import PeftModel

    from lm_eval_toolfid.engine.lora_batch import BatchedLora, lora_layers, lora_stack

    model = copy.deepcopy(tiny["model"]).to(torch.bfloat16)
    for m in lora_layers(model):  # what PEFT's from_pretrained does to a half-precision model's adapter weights
        for name in m.lora_A:
            m.lora_A[name].float()
            m.lora_B[name].float()
    assert isinstance(model, PeftModel)
    layer = model.base_model.model.model.layers[0].mlp.down_proj
    x = torch.randn(4, 16, layer.in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    model.set_adapter("a1")
    with torch.inference_mode():
        peft = layer(x)
        layers = lora_layers(model)
        batched = BatchedLora(lora_stack(model, layers), layers)
        with batched.installed():
            batched.select(["a1"] * 4)
            ours = layer(x)
    model.set_adapter("a0")
    differ = (ours != peft).float().mean().item()
    assert differ < 0.05, differ


def test_adapters_read_into_the_engines_store_compute_as_peft_loaded_ones(tiny: dict[str, Any], tmp_path) -> None:
    """Adapters read straight from their PEFT folders into the engine's store (no ``load_adapter``) give the same
    logits, bit for bit, as the same adapters loaded by PEFT, in a joint pass and alone; a path that runs PEFT's
    own forward (its mixed batch) has them loaded into PEFT first, and gives the same logits again."""
    import torch

    from lm_eval_toolfid.engine.adapter_store import store_of, store_unsupported

    tiny["model"].save_pretrained(tmp_path, selected_adapters=["a1", "a2", "zero"])
    peft = copy.deepcopy(tiny["model"])
    peft.delete_adapter("a3")
    stored = copy.deepcopy(peft)
    for name in ("a1", "a2", "zero"):
        stored.delete_adapter(name)
    store = store_of(stored, create=True)
    for name in ("a1", "a2", "zero"):
        assert store_unsupported(str(tmp_path / name), stored) is None
        store.add(name, str(tmp_path / name), stored)
    assert set(stored.peft_config) == {"a0"}
    views = [None, "a1", "a2", "zero", "a0"]
    ours, stacked = _pass(stored, views)
    assert stacked and torch.equal(ours, _pass(peft, views)[0])
    store.active = "a2"  # one adapter's view (ModelSession.activate of a stored adapter)
    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.engine.model_runner import ModelFit, ModelRunner

    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    runner = ModelRunner(stored, ModelFit.of(stored), 0, EngineStats(), fold_gqa=False)
    with torch.inference_mode(), runner.routing(None) as alone:
        logits = runner.forward(ids, torch.ones_like(ids), torch.arange(8)[None], None, 8)
    assert alone and torch.equal(logits[0], ours[2])
    mixed, stacked = _pass(stored, views, stack=False)  # PEFT's mixed batch: the stored adapters loaded into PEFT
    assert not stacked and set(stored.peft_config) == {"a0", "a1", "a2", "zero"} and not store.adapters
    assert torch.allclose(mixed, ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize("config,why", [({"use_dora": True}, "it sets use_dora"),
                                        ({"modules_to_save": ["lm_head"]}, "it sets modules_to_save"),
                                        ({"target_modules": ["lm_head"]}, "lm_head"),
                                        ({"bias": "lora_only"}, "trains biases")])
def test_what_the_store_cannot_represent_is_named(tiny: dict[str, Any], tmp_path, config: dict, why: str) -> None:
    from peft import LoraConfig, get_peft_model

    from lm_eval_toolfid.engine.adapter_store import store_unsupported

    settings = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], **config}
    get_peft_model(copy.deepcopy(tiny["base"]), LoraConfig(**settings)).save_pretrained(tmp_path / "x")
    assert why in str(store_unsupported(str(tmp_path / "x"), tiny["model"]))


def test_the_stores_scalings_are_peft_s_for_every_recipe(tmp_path) -> None:
    """Rank and alpha patterns, rsLoRA, a subset of layers, another rank: the stack built from adapters read into the
    store holds exactly the weights and scalings of the stack built from the same adapters loaded by PEFT."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.engine.adapter_store import store_of
    from lm_eval_toolfid.engine.lora_batch import lora_layers, lora_stack

    base = fixture_paths()["base"]
    recipes = {"first": {"r": 8, "lora_alpha": 16, "target_modules": TARGETS},
               "patterns": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"],
                            "rank_pattern": {"down_proj": 16}, "alpha_pattern": {"layers.1.self_attn.q_proj": 3}},
               "rslora": {"r": 16, "lora_alpha": 8, "use_rslora": True, "target_modules": ["k_proj", "o_proj"]},
               "some_layers": {"r": 2, "lora_alpha": 5, "target_modules": ["up_proj"], "layers_to_transform": [1]}}
    torch.manual_seed(0)
    for name, settings in recipes.items():
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(**settings))
        with torch.no_grad():
            for key, p in model.named_parameters():
                if "lora_B" in key:
                    p.normal_(0, 0.1)
        model.save_pretrained(tmp_path / name)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "first")
    stored = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "first")
    for name in list(recipes)[1:]:
        peft.load_adapter(tmp_path / name, adapter_name=name)
        store_of(stored, create=True).add(name, str(tmp_path / name), stored)
    ours, theirs = lora_stack(stored, lora_layers(stored)), lora_stack(peft, lora_layers(peft))
    assert ours.names == theirs.names and ours.classes == theirs.classes == (8, 16)
    assert torch.equal(ours.live, theirs.live)
    for mine, peers in zip(lora_layers(stored), lora_layers(peft)):
        a, b = ours.layers[id(mine)], theirs.layers[id(peers)]
        assert a.pattern == b.pattern and len(a.groups) == len(b.groups)
        for g, h in zip(a.groups, b.groups):
            assert g.cls == h.cls and torch.equal(g.A, h.A) and torch.equal(g.B, h.B)
