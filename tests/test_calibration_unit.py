"""Null adapters and the null fit (pure parts; the end-to-end calibration is in test_calibration_e2e)."""

import hashlib
import json

import pytest

from lm_eval_toolfid.calibrate import make_null_adapters, read_marker, _update_norm
from lm_eval_toolfid.calibration import NullRun, adapter_shape, fit, load_calibration
from lm_eval_toolfid.errors import ToolfidError


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


def test_malformed_calibration_files(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[]")
    with pytest.raises(ToolfidError, match="not a toolfid calibration"):
        load_calibration(path)
    with pytest.raises(ToolfidError, match="cannot read"):
        load_calibration(tmp_path / "missing.json")
