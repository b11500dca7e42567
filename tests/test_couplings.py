"""Every private attribute of transformers, PEFT, lm-eval and jsonschema that the code relies on, named once.

The engine and the lm-eval seam reach past these libraries' public APIs in a few places (see each test's
docstring for the module that does). pyproject.toml bounds transformers and PEFT to the versions these
couplings are tested with; when a newer release drops or changes one, this file fails first, naming the
attribute and the installed version, instead of a run giving wrong answers somewhere deep in a view.
"""

from __future__ import annotations

import inspect

import pytest


def _version(dist: str) -> str:
    from importlib.metadata import version

    return f"{dist} {version(dist)}"


def test_peft_adapter_switches_used_by_joint_runs() -> None:
    """``integrations/lm_eval/joint.adapters_enabled`` flips ``PeftModel._adapters_disabled`` and each
    ``BaseTunerLayer``'s switch, so rows can name their adapter inside ``disable_adapter()``."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.cases.bundled import fixture_paths

    fix = fixture_paths()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(fix["base"]), fix["adapters"]["faithful"])
    where = _version("peft")
    assert getattr(model, "_adapters_disabled", None) is False, f"{where}: PeftModel._adapters_disabled is gone"
    with model.disable_adapter():
        assert model._adapters_disabled is True, f"{where}: disable_adapter() no longer sets _adapters_disabled"
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        assert layers and all(m.disable_adapters for m in layers), f"{where}: BaseTunerLayer.disable_adapters"
    assert callable(getattr(BaseTunerLayer, "enable_adapters", None)), f"{where}: BaseTunerLayer.enable_adapters"
    assert hasattr(model, "has_active_enabled_adapter"), f"{where}: PeftModel.has_active_enabled_adapter"


def test_transformers_cache_layer_the_slot_cache_subclasses() -> None:
    """``engine/slot_cache.py`` subclasses ``DynamicLayer`` and builds a ``Cache`` from its layers."""
    import torch
    from transformers.cache_utils import Cache, DynamicLayer

    from lm_eval_toolfid.engine.slot_cache import slot_cache_classes

    where = _version("transformers")
    assert "layers" in inspect.signature(Cache.__init__).parameters, f"{where}: Cache(layers=...) is gone"
    for name in ("get_seq_length", "get_mask_sizes", "update"):
        assert callable(getattr(DynamicLayer, name, None)), f"{where}: DynamicLayer.{name} is gone"
    slot_layer, slot_cache = slot_cache_classes()
    keys = torch.zeros(1, 2, 8, 4)
    layer = slot_layer(8, keys, keys.clone(), length=3)
    assert (layer.is_initialized, layer.get_seq_length(), tuple(layer.keys.shape)) == (True, 3, (1, 2, 3, 4)), where
    assert slot_cache([layer]).get_seq_length() == 3, f"{where}: Cache no longer asks its layers for their length"


def test_transformers_attention_registry_the_engine_patches() -> None:
    """``engine/attention.folded_gqa_attention`` swaps ``ALL_ATTENTION_FUNCTIONS["sdpa"]`` and reads its
    ``_local_mapping`` to restore it."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from lm_eval_toolfid.engine.attention import folded_gqa_attention

    where = _version("transformers")
    assert isinstance(getattr(ALL_ATTENTION_FUNCTIONS, "_local_mapping", None), dict), \
        f"{where}: ALL_ATTENTION_FUNCTIONS._local_mapping is gone"
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with folded_gqa_attention():
        assert getattr(ALL_ATTENTION_FUNCTIONS["sdpa"], "toolfid_folded", False), f"{where}: the patch did not take"
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original, f"{where}: the patch was not undone"


def test_hflm_calls_tok_batch_encode_before_model_generate_for_each_batch() -> None:
    """``integrations/lm_eval/hf_model.ToolfidHFLM`` saves a batch's strings in ``tok_batch_encode`` and reads
    them in ``_model_generate``, and rewrites ``batch_size_per_gpu``: lm-eval's HFLM must call the two in that
    order, once each per batch, and read that attribute."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from lm_eval_toolfid.cases.bundled import fixture_paths

    calls: list[str] = []

    class Recording(HFLM):
        def tok_batch_encode(self, strings, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
            calls.append(f"encode {len(strings)}")
            return super().tok_batch_encode(strings, *args, **kwargs)

        def _model_generate(self, context, max_length, stop, **kwargs):  # noqa: ANN001, ANN003, ANN201
            calls.append(f"generate {context.shape[0]}")
            return super()._model_generate(context, max_length, stop, **kwargs)

    lm = Recording(pretrained=fixture_paths()["base"], batch_size=2, device="cpu")
    where = _version("lm_eval")
    assert lm.batch_size_per_gpu == 2, f"{where}: HFLM.batch_size_per_gpu is gone"
    requests = [Instance("generate_until", {}, (f"call {i}:", {"until": ["\n"], "max_gen_toks": 4}), i)
                for i in range(3)]
    assert len(lm.generate_until(requests, disable_tqdm=True)) == 3
    assert calls == ["encode 2", "generate 2", "encode 1", "generate 1"], \
        f"{where}: HFLM no longer calls tok_batch_encode then _model_generate per batch: {calls}"


@pytest.mark.parametrize("module", ["_keywords", "_utils"])
def test_jsonschema_modules_whose_regex_the_schema_guard_replaces(module: str) -> None:
    """``core/schema.py`` gives jsonschema's ``_keywords`` and ``_utils`` a time-bounded ``re``."""
    import importlib

    from lm_eval_toolfid.core import schema

    mod = importlib.import_module(f"jsonschema.{module}")
    assert getattr(mod, "re", None) is schema._GUARDED_RE, \
        f"{_version('jsonschema')}: jsonschema.{module} no longer uses a module-level re (pattern guard off)"


def test_a_batch_generated_without_its_prompts_is_a_warning_not_a_silent_fallback(caplog) -> None:
    """If lm-eval stopped calling ``tok_batch_encode`` before ``_model_generate``, ``ToolfidHFLM`` cannot match
    the batch to its requests' plans: it says so once (naming lm-eval's version) and answers with transformers'
    generate, the plain path."""
    import logging

    import torch

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    lm = ToolfidHFLM(pretrained=fixture_paths()["base"], batch_size=1, device="cpu")
    lm._plans = {"a request of this view": object()}  # the view has requests; the batch came without its prompts
    lm._batch_strings = None
    context = torch.tensor([lm.tok_encode("call 1:")])
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        out = lm._model_generate(context, context.shape[1] + 3, ["\n"])
        lm._model_generate(context, context.shape[1] + 3, ["\n"])
    warned = [r.getMessage() for r in caplog.records if "without handing over its prompts" in r.getMessage()]
    assert len(warned) == 1 and _version("lm_eval").split()[1] in warned[0], warned
    assert out.shape[0] == 1 and out.shape[1] > context.shape[1]


def test_peft_mixed_batch_layers_take_the_rows_adapters_from_the_engines_hooks() -> None:
    """``engine/model_runner.ModelRunner.routing`` gives PEFT's LoRA layers each row's adapter through pre-forward
    hooks registered once per run, where PEFT's ``adapter_names=`` registers them on every pass: the layers
    (``LoraLayer``, ``AuxiliaryTrainingWrapper``) must still be found and take ``adapter_names``, and a mixed batch
    must give the logits of the same pass with PEFT's own ``adapter_names=``, bit for bit."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.engine.model_runner import ModelFit, ModelRunner
    from lm_eval_toolfid.engine.routing import mixed_batch_layers

    fix = fixture_paths()
    where = _version("peft")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(fix["base"]), fix["adapters"]["faithful"],
                                      adapter_name="faithful")
    model.load_adapter(fix["adapters"]["broken"], adapter_name="broken")
    model.eval()
    layers = mixed_batch_layers(model)
    assert layers, f"{where}: no LoraLayer / AuxiliaryTrainingWrapper found"
    assert all("adapter_names" in inspect.signature(m.forward).parameters
               or any(p.kind is p.VAR_KEYWORD for p in inspect.signature(m.forward).parameters.values())
               for m in layers), f"{where}: a LoRA layer's forward no longer takes adapter_names"
    ids = torch.tensor([[1, 5, 9, 13, 17]] * 3)
    mask, positions = torch.ones_like(ids), torch.arange(5).expand(3, 5)
    views = [None, "faithful", "broken"]
    with torch.inference_mode():
        runner = ModelRunner(model, ModelFit.of(model), 0, EngineStats(), fold_gqa=False)
        peft_logits = runner.forward(ids, mask, positions, None, 1, views=views)  # PEFT's adapter_names= per pass
        with runner.routing(views, stack=False) as stacked:  # PEFT's mixed batch (the stacked one: test_lora_batch)
            assert runner.adapters._hooked and not stacked
            ours = runner.forward(ids, mask, positions, None, 1, views=views)
        assert not runner.adapters._hooked and not any(m._forward_pre_hooks for m in layers)  # nothing left behind
    assert torch.equal(ours, peft_logits), f"{where}: hooked mixed batch differs from adapter_names="
    assert not torch.equal(ours[0], ours[1]) and not torch.equal(ours[1], ours[2])  # each row ran its own adapter


def test_peft_lora_layer_attributes_the_stacked_computation_reads() -> None:
    """``engine/lora_batch.py`` stacks each ``peft.tuners.lora.layer.Linear``'s adapters from its ``base_layer``,
    ``lora_A``/``lora_B`` weights (``[r, in]``, ``[out, r]``), ``scaling``, ``lora_variant`` (DoRA and kin),
    ``lora_dropout``, ``merged``, ``fan_in_fan_out``, ``in_features``/``out_features`` and ``active_adapters``, and
    replaces the layer's ``forward`` for a run by an instance attribute that PEFT's layers must call through."""
    import torch
    from peft import PeftModel
    from peft.tuners.lora.layer import Linear
    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.cases.bundled import fixture_paths

    fix = fixture_paths()
    where = _version("peft")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(fix["base"]), fix["adapters"]["faithful"])
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    assert layers, f"{where}: no peft.tuners.lora.layer.Linear"
    m = layers[0]
    a, b = m.lora_A["default"].weight, m.lora_B["default"].weight
    assert isinstance(m.base_layer, torch.nn.Linear), f"{where}: LoRA Linear.base_layer"
    assert a.shape == (m.r["default"], m.in_features) and b.shape == (m.out_features, m.r["default"]), where
    assert isinstance(m.scaling["default"], float) and isinstance(m.lora_variant, dict), where
    assert m.merged is False and m.fan_in_fan_out is False and list(m.active_adapters) == ["default"], where
    assert isinstance(m.lora_dropout["default"], (torch.nn.Identity, torch.nn.Dropout)), where
    m.forward = lambda x, *a, **k: torch.zeros(1)  # what BatchedLora.installed does
    try:
        assert torch.equal(m(torch.ones(1, m.in_features)), torch.zeros(1)), f"{where}: a layer's forward not called"
    finally:
        del m.forward
