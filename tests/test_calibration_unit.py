"""Null adapters and the null fit (pure parts; the end-to-end calibration is in test_calibration_e2e)."""

import hashlib
import json

import pytest

from lm_eval_toolfid.calibration.nulls import make_null_adapters, read_marker
from lm_eval_toolfid.calibration.adapters import update_norm as _update_norm
from lm_eval_toolfid.calibration.fit import NullRun, fit, load_calibration
from lm_eval_toolfid.calibration.adapters import adapter_shape
from lm_eval_toolfid.core.errors import ToolfidError


@pytest.fixture(scope="module")
def real_adapter(tmp_path_factory):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                              init_lora_weights=False))
    out = tmp_path_factory.mktemp("real") / "adapter"
    model.save_pretrained(out)
    return out


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_null_adapters_match_update_norms_and_reproduce(real_adapter, tmp_path):
    from safetensors.torch import load_file

    paths = make_null_adapters(real_adapter, runs=2, out=tmp_path / "a", seed=7, multipliers=(0.5, 1.0, 2.0))
    assert len(paths) == 6
    real = load_file(str(real_adapter / "adapter_model.safetensors"))
    for path in paths:
        marker = read_marker(path)
        null = load_file(str(path / "adapter_model.safetensors"))
        assert set(null) == set(real) and all(null[k].shape == real[k].shape for k in real)
        for a_key in (k for k in real if ".lora_A." in k):
            b_key = a_key.replace(".lora_A.", ".lora_B.")
            expected = marker["multiplier"] * _update_norm(real[a_key], real[b_key])
            assert _update_norm(null[a_key], null[b_key]) == pytest.approx(expected, rel=1e-4)
            assert not null[a_key].equal(real[a_key])  # a random direction, not the real one
        assert json.loads((path / "adapter_config.json").read_text()) == json.loads(
            (real_adapter / "adapter_config.json").read_text())
        assert adapter_shape(path)["hash"] == adapter_shape(real_adapter)["hash"]
    again = make_null_adapters(real_adapter, runs=2, out=tmp_path / "b", seed=7, multipliers=(0.5, 1.0, 2.0))
    assert [_digest(p) for p in paths] == [_digest(p) for p in again]
    other = make_null_adapters(real_adapter, runs=1, out=tmp_path / "c", seed=8, multipliers=(1.0,))
    assert _digest(other[0]) != _digest(paths[2])


def test_broken_like_adapter_is_a_one_line_error(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{oops")
    with pytest.raises(ToolfidError, match="not valid JSON"):
        make_null_adapters(tmp_path, runs=1, out=tmp_path / "o")


def runs(values, mult=1.0, n=50, delta=-0.5):
    return [NullRun(name=f"n{i}", seed=i, multiplier=mult, n_cases=n,
                    metrics={"json_valid_rate": v, "parse_rate": v, "hallucination_rate": 0.0,
                             "validity_delta": v + delta}) for i, v in enumerate(values)]


def test_degenerate_null_is_floored_and_z_is_finite(tmp_path):
    cal = fit(runs([0.0] * 8), {"case_set": "x"})
    f = cal.reference_fit["json_valid_rate"]
    assert f.std == 0.0 and f.floor_used and f.std_used > 0
    # Jeffreys: pooled rate 0.5/401 over 400 trials, SE for one run of 50 cases
    p = 0.5 / 401
    assert f.std_used == pytest.approx((p * (1 - p) / 50) ** 0.5)
    assert 0 < cal.z(0.9) < float("inf")
    path = tmp_path / "c.json"
    path.write_text(cal.to_json())
    assert load_calibration(path).z(0.9) == cal.z(0.9)


def test_spread_null_uses_sample_std_and_per_multiplier_profile():
    cal = fit(runs([0.1, 0.5, 0.3, 0.7]) + runs([0.8, 0.9], mult=0.5), {})
    f = cal.reference_fit["json_valid_rate"]
    assert not f.floor_used and f.mean == pytest.approx(0.4)
    assert set(cal.z_profile(0.9)) == {"0.5", "1"}


def test_fit_refuses_unpaired_null_runs():
    bad = [NullRun(name="n", seed=0, multiplier=1.0, n_cases=5, metrics={"json_valid_rate": 0.0})]
    with pytest.raises(ToolfidError, match="validity_delta"):
        fit(bad, {})


def _run(i, valid, halluc, n=10, mult=1.0):
    """A paired null run; ``halluc`` None: it made no valid call, so its hallucination_rate is undefined (absent)."""
    metrics = {"json_valid_rate": valid, "parse_rate": 0.5, "validity_delta": valid - 0.5}
    if halluc is not None:
        metrics["hallucination_rate"] = halluc
    return NullRun(name=f"null_{i:02d}", seed=i, multiplier=mult, n_cases=n, metrics=metrics)


def test_a_null_with_no_valid_call_is_left_out_of_the_hallucination_fit_only(tmp_path):
    """One null run that makes no valid call has no hallucination_rate (a rate over valid calls): the calibration is
    still fitted and written, hallucination_rate over the two runs that define it (n=2, the third named), its
    binomial floor pooled over those two runs' valid calls only; every other metric over all three."""
    from lm_eval_toolfid.core.stats import binomial_se, jeffreys_rate

    cal = fit([_run(0, 0.4, 0.25), _run(1, 0.2, 0.5), _run(2, 0.0, None)], {"case_set": "x"})
    h = cal.fits["1"]["hallucination_rate"]
    assert (h.n, h.values, h.undefined) == (2, [0.25, 0.5], ["null_02"])
    assert h.mean == pytest.approx(0.375)
    # valid calls: 4 and 2, hallucinated 1 and 1: Jeffreys (2 + ½)/(6 + 1), one run of 3 valid calls on average
    assert h.floor == pytest.approx(binomial_se(jeffreys_rate(2, 6), 3))
    for metric in ("json_valid_rate", "parse_rate", "validity_delta"):
        assert cal.fits["1"][metric].n == 3 and cal.fits["1"][metric].undefined == []
    assert cal.fits["1"]["json_valid_rate"].mean == pytest.approx(0.2)
    path = tmp_path / "c.json"
    path.write_text(cal.to_json())
    assert "NaN" not in path.read_text()
    loaded = load_calibration(path)
    assert loaded.fits == cal.fits and loaded.z(0.5) == cal.z(0.5)
    null = loaded.compare(_summary(0.5, 10))
    assert null.k == 3 and null.z == pytest.approx(cal.z(0.5, n=10)) and 0 < null.z < float("inf")
    # a file written before fits could leave runs out (no "undefined" field) still loads
    old = json.loads(fit(runs([0.0, 0.1, 0.2]), {}).to_json())
    for fits in old["fits"].values():
        for f in fits.values():
            f.pop("undefined")
    path.write_text(json.dumps(old))
    assert load_calibration(path).fits["1"]["hallucination_rate"].n == 3


def test_a_metric_undefined_in_every_null_run_has_no_fit(real_adapter, tmp_path, capsys):
    """No null makes a valid call (a small case set, K=1 at each multiplier): hallucination_rate has no fit at any
    multiplier, written as JSON null (no 0, no NaN); the file loads, z, the rank p and the z profile (json_valid_rate)
    stand, and ``toolfid calibrate`` says which metric has no fit."""
    from lm_eval_toolfid.cli import main

    cal = fit([_run(i, 0.0, None, n=2, mult=m) for i, m in enumerate((0.5, 1.0, 2.0))], {"case_set": "x"})
    assert all(fits["hallucination_rate"] is None for fits in cal.fits.values())
    payload = json.loads(cal.to_json())
    assert all(fits["hallucination_rate"] is None for fits in payload["fits"].values())
    assert "NaN" not in cal.to_json()
    path = tmp_path / "c.json"
    path.write_text(cal.to_json())
    loaded = load_calibration(path)
    null = loaded.compare(_summary(0.5, 2))
    assert null.k == 1 and null.degenerate and 0 < null.z < float("inf")
    assert set(loaded.z_profile(0.5)) == {"0.5", "1", "2"}
    # the same through lm-eval results files without the metric, fitted and printed by toolfid calibrate
    nulls = make_null_adapters(real_adapter, runs=1, out=tmp_path / "nulls", multipliers=(1.0,))
    result = _results_for(nulls[0], 0.0)
    result["results"]["tool_use_fidelity"].pop("hallucination_rate,none")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "results_1.json").write_text(json.dumps(result))
    assert main(["calibrate", "--from-results", str(tmp_path / "runs"), "--output", str(tmp_path / "cal.json")]) == 0
    assert "hallucination_rate no fit (defined in no null run)" in capsys.readouterr().out
    assert load_calibration(tmp_path / "cal.json").fits["1"]["hallucination_rate"] is None


def test_malformed_calibration_files(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[]")
    with pytest.raises(ToolfidError, match="not a toolfid calibration"):
        load_calibration(path)
    with pytest.raises(ToolfidError, match="cannot read"):
        load_calibration(tmp_path / "missing.json")


# --- every tensor kind: embedding LoRA, DoRA magnitudes, modules_to_save, trainable biases ----

@pytest.fixture(scope="module")
def rich_adapter(tmp_path_factory):
    """A real PEFT adapter with DoRA, embedding LoRA, modules_to_save and trainable biases, and its base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    root = tmp_path_factory.mktemp("rich")
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, attention_bias=True, tie_word_embeddings=False)
    base = LlamaForCausalLM(cfg)
    base.save_pretrained(root / "base")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "embed_tokens"],
                                            use_dora=True, modules_to_save=["lm_head"], bias="lora_only",
                                            init_lora_weights=False))
    dora_at_init = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_magnitude_vector" in n}
    with torch.no_grad():  # stand-in for training: move every trainable tensor away from its initial value
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    model.save_pretrained(root / "adapter")
    return root / "adapter", root / "base", dora_at_init


def _base_state(base_dir):
    from safetensors.torch import load_file
    return load_file(str(base_dir / "model.safetensors"))


def test_dora_magnitude_convention_matches_peft(rich_adapter):
    """PEFT initialises a DoRA magnitude to the column norm of W + ΔW; _dora_norm must use the same axes."""
    import torch

    from lm_eval_toolfid.calibration.nulls import _dora_norm

    adapter, base_dir, at_init = rich_adapter
    assert at_init, "the fixture has DoRA magnitudes"
    # at init, before the fake training step, ΔW was random: rebuild it from a fresh model with the same seed
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaForCausalLM.config_class.from_pretrained(base_dir)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "embed_tokens"], use_dora=True,
        modules_to_save=["lm_head"], bias="lora_only", init_lora_weights=False))
    for layer_name in ("model.layers.0.self_attn.q_proj", "model.embed_tokens"):
        layer = model.base_model.model.get_submodule(layer_name)
        w = layer.base_layer.weight.detach().double()
        if hasattr(layer, "lora_embedding_A") and "default" in layer.lora_embedding_A:
            delta = (layer.lora_embedding_B["default"] @ layer.lora_embedding_A["default"]).T.double()
            embedding = True
        else:
            delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).double()
            embedding = False
        expected = layer.lora_magnitude_vector["default"].weight.detach().double().flatten()
        got = _dora_norm(w + layer.scaling["default"] * delta, embedding, False)
        assert torch.allclose(got, expected, rtol=1e-5), layer_name


def test_null_adapters_randomise_every_tensor_kind(rich_adapter, tmp_path):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from lm_eval_toolfid.calibration.nulls import _base_key, _dora_norm

    adapter, base_dir, _ = rich_adapter
    real = load_file(str(adapter / "adapter_model.safetensors"))
    kinds = {"lora_embedding_A", "lora_magnitude_vector", "lm_head.weight", "base_layer.bias", "lora_A.weight"}
    assert all(any(kind in k for k in real) for kind in kinds), sorted(real)
    base = _base_state(base_dir)
    paths = make_null_adapters(adapter, runs=1, out=tmp_path / "n", seed=3, multipliers=(0.5, 2.0), base=str(base_dir))
    for path in paths:
        mult = read_marker(path)["multiplier"]
        null = load_file(str(path / "adapter_model.safetensors"))
        assert set(null) == set(real) and all(null[k].shape == real[k].shape for k in real)
        for key in real:
            base_t = base.get(_base_key(key))
            if base_t is not None and base_t.shape == real[key].shape and real[key].equal(base_t):
                assert null[key].equal(base_t), key  # a frozen copy of a base tensor (saved embedding layer) stays
                continue
            assert not null[key].equal(real[key]), key
            if ".lora_A." in key or ".lora_embedding_A" in key:
                b_key = key.replace("_A", "_B")
                assert _update_norm(null[key], null[b_key]) == pytest.approx(
                    mult * _update_norm(real[key], real[b_key]), rel=1e-4)
            elif "lora_magnitude_vector" in key:
                expected = _dora_norm(base[_base_key(key)], "embed_tokens" in key, False).float()
                assert torch.allclose(null[key], expected, rtol=1e-5), key
            elif ".lora_" not in key:  # modules_to_save copy or trainable bias: base + noise of the learned norm
                learned = float((real[key].double() - base_t.double()).norm())
                assert float((null[key].double() - base_t.double()).norm()) == pytest.approx(mult * learned, rel=1e-4)
    # PEFT loads a null onto the base and runs it
    model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir), paths[0])
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_null_adapters_refuse_what_they_cannot_randomise(rich_adapter, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    adapter, base_dir, _ = rich_adapter
    with pytest.raises(ToolfidError, match="need the base model's weights; pass --base"):
        make_null_adapters(adapter, runs=1, out=tmp_path / "a")  # no base given, none in adapter_config
    odd = tmp_path / "odd"
    shutil.copytree(adapter, odd)
    state = load_file(str(odd / "adapter_model.safetensors"))
    state["base_model.model.model.layers.0.self_attn.q_proj.lora_T"] = torch.ones(3)
    save_file(state, str(odd / "adapter_model.safetensors"))
    with pytest.raises(ToolfidError, match="lora_T is of a kind null adapters cannot randomise"):
        make_null_adapters(odd, runs=1, out=tmp_path / "b", base=str(base_dir))
    other_base = tmp_path / "other-base"
    from transformers import LlamaConfig, LlamaForCausalLM
    LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, attention_bias=True,
                                 tie_word_embeddings=False)).save_pretrained(other_base)
    with pytest.raises(ToolfidError, match="wrong base model"):
        make_null_adapters(adapter, runs=1, out=tmp_path / "c", base=str(other_base))


# --- compatibility: the update norm ------------------------------------------------------

def _scaled_copy(src, dst, factor):
    """A same-shape adapter whose every LoRA update is ``factor`` × the source's (B scaled)."""
    import shutil

    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    state = load_file(str(dst / "adapter_model.safetensors"))
    save_file({k: v * factor if ".lora_B." in k else v for k, v in state.items()}, str(dst / "adapter_model.safetensors"))
    return dst


def _calibration_for(adapter, values=(0.0, 0.1, 0.2), n=50):
    from lm_eval_toolfid.calibration.adapters import adapter_update_norm
    prov = {"case_set": "cs", "prompt": "p", "generation": {}, "base": {"pretrained": "b", "fingerprint": "f"},
            "adapter_shape": adapter_shape(adapter)["hash"], "adapter_update_norm": adapter_update_norm(adapter)}
    return fit(runs(list(values), n=n), prov)


def _key():
    from lm_eval_toolfid.pairing.identity import RunKey
    return RunKey(base={"pretrained": "b", "fingerprint": "f"}, case_set="cs", prompt="p", generation={})


def test_calibration_is_refused_for_a_same_shape_adapter_of_another_norm(real_adapter, tmp_path):
    cal = _calibration_for(real_adapter)
    cal.check_compatible(_key(), str(real_adapter))
    cal.check_compatible(_key(), str(_scaled_copy(real_adapter, tmp_path / "near", 1.05)))  # within 10%
    far = _scaled_copy(real_adapter, tmp_path / "far", 1.5)
    assert adapter_shape(far)["hash"] == adapter_shape(real_adapter)["hash"]
    with pytest.raises(ToolfidError, match=r"update norm .*\+50%.*calibrate --adapter .*far"):
        cal.check_compatible(_key(), str(far))
    old = cal.model_copy(update={"provenance": {k: v for k, v in cal.provenance.items() if k != "adapter_update_norm"}})
    with pytest.raises(ToolfidError, match="records no adapter update norm"):
        old.check_compatible(_key(), str(real_adapter))


def test_null_markers_record_the_real_update_norm(real_adapter, tmp_path):
    from lm_eval_toolfid.calibration.adapters import adapter_update_norm
    path = make_null_adapters(real_adapter, runs=1, out=tmp_path, multipliers=(2.0,))[0]
    assert read_marker(path)["like_update_norm"] == pytest.approx(adapter_update_norm(real_adapter))
    assert adapter_update_norm(path) == pytest.approx(2 * adapter_update_norm(real_adapter), rel=1e-4)


# --- rank p and the honest z spread --------------------------------------------------------

def _summary(rate, n=50):
    from lm_eval_toolfid.core.records import Summary
    return Summary(n=n, n_relevant=n, metrics={"json_valid_rate": rate, "parse_rate": rate,
                                               "hallucination_rate": 0.0}, outcome_counts={})


def test_rank_p_counts_nulls_at_or_above_the_adapter():
    values = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8] + [0.05] * 10 + [0.9]  # K = 20
    cal = fit(runs(values), {})
    for x in (0.0, 0.35, 0.9, 0.95):
        expected = (1 + sum(v >= x for v in values)) / (len(values) + 1)
        assert cal.compare(_summary(x)).rank_p == pytest.approx(expected)
    best = cal.compare(_summary(0.95))
    assert best.k == 20 and best.rank_p == pytest.approx(1 / 21) and best.rank_note is None and not best.degenerate
    assert cal.compare(_summary(0.0)).rank_p == 1.0  # tied with the worst null: no evidence at all


def test_rank_note_says_when_k_is_too_small_and_alpha_is_settable():
    cal = fit(runs([0.1, 0.3, 0.2]), {})
    null = cal.compare(_summary(0.9))
    assert null.k == 3 and null.rank_p == pytest.approx(0.25)
    assert "K=3 null runs cannot show p ≤ 0.05; use ≥ 19" in null.rank_note
    assert cal.compare(_summary(0.9), alpha=0.25).rank_note is None
    assert "use ≥ 99" in cal.compare(_summary(0.9), alpha=0.01).rank_note


def test_one_valid_case_against_an_all_zero_null_is_not_significant():
    """The old floor gave z ≈ 4 for 1/268 valid against 8 all-zero nulls; the adapter is one more draw."""
    n = 268
    cal = fit(runs([0.0] * 8, n=n), {})
    one = cal.compare(_summary(1 / n, n))
    assert one.degenerate and "null degenerate: all 8 ×1 null runs scored 0.000" in one.rank_note
    assert 0 < one.z < 3 and one.rank_p == pytest.approx(1 / 9)
    old_floor = cal.reference_fit["json_valid_rate"].std_used  # binomial SE at the null's pooled rate alone
    assert (1 / n) / old_floor > 3  # what the old z said
    assert one.null_std >= old_floor * (1 + 1 / 8) ** 0.5
    z = [cal.z(k / n, n=n) for k in range(0, 30)]
    assert z == sorted(z) and z[-1] > 3  # more valid cases, more evidence: many do clear the gate


def test_spread_null_z_is_a_predictive_z():
    values = [0.1, 0.5, 0.3, 0.7]
    cal = fit(runs(values, n=400), {})
    f = cal.reference_fit["json_valid_rate"]
    assert not f.floor_used
    assert cal.z(0.9, n=400) == pytest.approx((0.9 - 0.4) / (f.std * (1 + 1 / 4) ** 0.5))


# --- malformed calibration files and null markers -------------------------------------------

def _good_calibration_payload():
    return json.loads(fit(runs([0.0, 0.1, 0.2]), {"case_set": "x"}).to_json())


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.pop("fits"), "malformed calibration file .*fits"),
    (lambda p: p.update(runs=[]), r"K=0"),
    (lambda p: p["fits"]["1"]["json_valid_rate"].update(std_used=float("nan")), "NaN"),
    (lambda p: p["fits"]["1"]["json_valid_rate"].update(values=[], n=0), "K=0 with 0 values"),
    (lambda p: p["fits"]["1"].pop("validity_delta"), "lacks the validity_delta fit"),
    (lambda p: p.update(fits={}), "no fits"),
    (lambda p: p.update(fits={"abc": p["fits"]["1"]}), "not a number"),
    (lambda p: p["runs"].pop(), "2 null runs listed for K=3"),
    (lambda p: p["runs"][0].update(n_cases=0), "n_cases=0"),
    (lambda p: p.update(format="toolfid-calibration/0"), "not a toolfid calibration"),
    (lambda p: p["fits"]["1"].update(json_valid_rate=None), "json_valid_rate: no fit .*every paired null run"),
    (lambda p: p["fits"]["1"].update(hallucination_rate=None), "no fit .*although 3 null run.s. define it"),
    (lambda p: p["fits"]["1"]["hallucination_rate"].update(undefined=["n0"]), "1 named undefined; 3 of the 3"),
])
def test_damaged_calibration_is_one_line(tmp_path, damage, message):
    payload = _good_calibration_payload()
    damage(payload)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ToolfidError, match=message) as err:
        load_calibration(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_truncated_calibration_is_one_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(_good_calibration_payload().__repr__()[:50])
    with pytest.raises(ToolfidError, match="cannot read calibration"):
        load_calibration(path)


@pytest.mark.parametrize("content, message", [
    ("{oops", "unreadable null-adapter marker"),
    ("[1]", "not a JSON object"),
    ('{"seed": 0, "run_seed": 1, "multiplier": 1.0, "like_shape": "x"}', "'like_update_norm' is missing"),
    ('{"seed": 0, "run_seed": "1", "multiplier": 1.0, "like_shape": "x", "like_update_norm": 1}', "'run_seed' is not"),
    ('{"seed": 0, "run_seed": 1, "multiplier": -1, "like_shape": "x", "like_update_norm": 1}', "negative"),
])
def test_damaged_null_marker_is_one_line(tmp_path, content, message):
    from lm_eval_toolfid.calibration.nulls import NULL_MARKER
    (tmp_path / NULL_MARKER).write_text(content)
    with pytest.raises(ToolfidError, match=message):
        read_marker(tmp_path)


# --- --from-results: de-duplication and skipping --------------------------------------------

def _results_for(adapter, rate, task="tool_use_fidelity", date=1.0):
    """An lm-eval results dict of the shape the task writes (metrics + configs.<task>.metadata.toolfid)."""
    key = {"base": {"pretrained": "b", "fingerprint": "f"}, "case_set": "cs", "prompt": "p", "generation": {}}
    return {"results": {task: {"alias": task, "json_valid_rate,none": rate, "parse_rate,none": rate,
                               "hallucination_rate,none": 0.0, "validity_delta,none": rate - 0.5}},
            "configs": {task: {"metadata": {"toolfid": {"adapter": str(adapter), "run_key": key, "n_cases": 40}}}},
            "n-samples": {task: {"effective": 40}}, "date": date}


def test_from_results_counts_each_null_run_once_and_skips_the_rest(real_adapter, tmp_path):
    from lm_eval_toolfid.calibration.posthoc import calibrate_from_results, scan_results

    nulls = make_null_adapters(real_adapter, runs=3, out=tmp_path / "nulls", multipliers=(1.0,))
    runs_dir = tmp_path / "runs"
    for i, null in enumerate(nulls):
        (runs_dir / null.name).mkdir(parents=True)
        (runs_dir / null.name / "results_2026.json").write_text(json.dumps(_results_for(null, 0.1 * i)))
    first = runs_dir / nulls[0].name / "results_2026.json"
    (runs_dir / "copy").mkdir()
    (runs_dir / "copy" / "results_copy.json").write_text(first.read_text())  # same run, another file
    (runs_dir / nulls[1].name / "results_2026.scored.json").write_text(first.read_text())
    (runs_dir / "hellaswag").mkdir()
    (runs_dir / "hellaswag" / "results_h.json").write_text(json.dumps(
        {"results": {"hellaswag": {"acc,none": 0.3}}, "configs": {"hellaswag": {}}}))
    (runs_dir / "base").mkdir()
    (runs_dir / "base" / "results_b.json").write_text(json.dumps(_results_for("", 0.5)).replace('"adapter": ""',
                                                                                               '"adapter": null'))
    (runs_dir / "ordinary").mkdir()
    (runs_dir / "ordinary" / "results_o.json").write_text(json.dumps(_results_for(real_adapter, 0.9)))
    (runs_dir / "broken").mkdir()
    (runs_dir / "broken" / "results_x.json").write_text("{not json")
    # overlapping paths: the folder, one of its files, and the folder again through another spelling
    paths = [str(runs_dir), str(first), str(runs_dir / "copy" / ".." / nulls[2].name)]
    scan = scan_results(paths)
    assert len(scan.used) == 3
    assert {k: len(v) for k, v in scan.skipped.items()} == {
        "duplicate null run": 1, "scored": 1, "other task or unreadable": 2, "base run": 1, "not a null adapter": 1}
    assert scan.describe().startswith("used 3 null-run results file(s); skipped 6")
    cal = calibrate_from_results(paths, tmp_path / "cal.json")
    assert cal.fits["1"]["json_valid_rate"].n == 3
    assert sorted(cal.fits["1"]["json_valid_rate"].values) == pytest.approx([0.0, 0.1, 0.2])
    assert load_calibration(tmp_path / "cal.json").provenance["adapter_update_norm"] > 0


def test_alpha_outside_0_1_is_one_line():
    cal = fit(runs([0.1, 0.3, 0.2]), {})
    with pytest.raises(ToolfidError, match="alpha must be between 0 and 1"):
        cal.compare(_summary(0.5), alpha=0.0)
