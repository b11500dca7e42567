"""Bad files → one clear line naming the file (and line), exit code 4, no traceback.

Case files, adapter folders (the real fixture adapter, damaged in specific ways), base model
folders and lm-eval results files; checked through the library and through the real CLI
(``toolfid`` main in-process, and once as a subprocess).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from lm_eval_toolfid.calibration.adapters import check_adapter, peft_loads_bin_weights_only
from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.cli import main
from lm_eval_toolfid.core.errors import ToolfidError, guard
from lm_eval_toolfid.reporting.results import load_results
from tests.lm_eval_helpers import BIN

FIX = fixture_paths()
BASE = FIX["base"]
FAITHFUL = FIX["adapters"]["faithful"]
TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                              "required": ["city"]}}
GOOD = {"id": "a", "prompt": "weather in Paris", "tools": [TOOL], "gold_tool_name": "get_weather"}


def one_line_error(func, *args) -> str:
    with pytest.raises(ToolfidError) as err:
        func(*args)
    message = str(err.value)
    assert "\n" not in message and message
    return message


def run_cli(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


# --- case files ------------------------------------------------------------------------------

def write(tmp_path, text: str | bytes, name="cases.jsonl"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


G = json.dumps(GOOD)


@pytest.mark.parametrize("text,line,needle", [
    (G + "\n{\"id\": \"b\", \"prompt\": \n", 2, "not valid JSON"),
    (G + "\n" + json.dumps({"id": "b", "tools": [TOOL], "gold_tool_name": "get_weather"}) + "\n", 2,
     "prompt: Field required"),
    (G + "\n\n" + json.dumps({**GOOD, "id": "b", "tools": [{"name": "get_weather", "parameters":
                                                           {"type": "object", "required": "city"}}]}), 3,
     "not a valid JSON Schema"),
    (G + "\n" + G + "\n", 2, "duplicate case id 'a' (first on line 1)"),
    (G + "\n" + "[" * 100_000 + "\n", 2, "nests too deeply"),
    (G.encode() + b"\n" + G.replace("Paris", "Par\xeds").encode("latin-1"), 2, "not UTF-8"),
])
def test_bad_case_lines_name_file_and_line(tmp_path, capsys, text, line, needle):
    path = write(tmp_path, text)
    message = one_line_error(load_cases, path)
    assert message.startswith(f"{path}:{line}: ") and needle in message
    rc, err = run_cli(capsys, "run", "--base", BASE, "--adapter", FAITHFUL, "--cases", str(path))
    assert rc == 4 and err.startswith(f"toolfid: error: {path}:{line}: ") and needle in err


@pytest.mark.parametrize("text", ["", "\n\n  \n", "// only a comment\n", "\ufeff\n"])
def test_empty_case_files(tmp_path, capsys, text):
    path = write(tmp_path, text)
    assert "no cases in file" in one_line_error(load_cases, path)
    rc, err = run_cli(capsys, "run", "--base", BASE, "--adapter", FAITHFUL, "--cases", str(path))
    assert rc == 4 and "no cases in file" in err


def test_missing_case_file_and_folder(tmp_path, capsys):
    assert "not found" in one_line_error(load_cases, tmp_path / "nope.jsonl")
    assert "is a directory" in one_line_error(load_cases, tmp_path)
    rc, err = run_cli(capsys, "run", "--base", BASE, "--adapter", FAITHFUL, "--cases", str(tmp_path / "x.jsonl"))
    assert rc == 4 and "case file not found" in err


def test_u2028_bom_crlf_and_blank_lines_load(tmp_path):
    weird = {**GOOD, "id": "b", "prompt": "line\u2028separator\u2029and\x85next"}
    raw = json.dumps(weird, ensure_ascii=False)  # U+2028 stays raw inside the JSON string
    assert "\u2028" in raw
    path = write(tmp_path, "\ufeff" + G + "\r\n\r\n   \n" + raw + "\r\n\n")
    cases = load_cases(path)
    assert [c.id for c in cases] == ["a", "b"]
    assert cases[1].prompt == "line\u2028separator\u2029and\x85next"
    # an error after those lines still names the right line: U+2028 did not count as a line break
    path = write(tmp_path, "\ufeff" + raw + "\n\n" + "{oops\n")
    assert one_line_error(load_cases, path).startswith(f"{path}:3: ")


# --- adapters ----------------------------------------------------------------------------------

@pytest.fixture()
def adapter(tmp_path):
    """A copy of the real fixture adapter, to damage."""
    return shutil.copytree(FAITHFUL, tmp_path / "adapter")


def test_the_real_fixture_adapters_pass():
    for path in FIX["adapters"].values():
        check_adapter(path, BASE)


def damage_cases():
    def no_dir(a):
        shutil.rmtree(a)

    def as_file(a):
        shutil.rmtree(a)
        a.write_text("x")

    def no_config(a):
        (a / "adapter_config.json").unlink()

    def bad_json(a):
        (a / "adapter_config.json").write_text('{\n  "peft_type": "LORA",\n  "r": 8,,\n}')

    def not_object(a):
        (a / "adapter_config.json").write_text("[1]")

    def no_peft_type(a):
        (a / "adapter_config.json").write_text('{"r": 8}')

    def no_weights(a):
        (a / "adapter_model.safetensors").unlink()

    def truncated(a):
        w = a / "adapter_model.safetensors"
        w.write_bytes(w.read_bytes()[:50])

    def garbage(a):
        (a / "adapter_model.safetensors").write_bytes(b"\xff" * 4096)

    return [
        (no_dir, "adapter directory not found"),
        (as_file, "is a file"),
        (no_config, "no adapter_config.json"),
        (bad_json, "adapter_config.json:3: adapter config is not valid JSON"),
        (not_object, "must be a JSON object"),
        (no_peft_type, "no peft_type"),
        (no_weights, "no adapter weights"),
        (truncated, "not a safetensors file"),
        (garbage, "not a safetensors file"),
    ]


@pytest.mark.parametrize("damage,needle", damage_cases(), ids=lambda x: getattr(x, "__name__", ""))
def test_broken_adapters_are_one_line(adapter, capsys, damage, needle):
    damage(adapter)
    assert needle in one_line_error(check_adapter, str(adapter), BASE)
    rc, err = run_cli(capsys, "run", "--base", BASE, "--adapter", str(adapter))
    assert rc == 4 and needle in err and err.count("\n") == 1
    rc, err = run_cli(capsys, "lm-eval", "--tasks", "tool_use_fidelity_fixture", "--model", "hf",
                      "--model_args", f"pretrained={BASE},peft={adapter}")
    assert rc == 4 and needle in err


def reshape(adapter, key_part: str, new_shape: tuple[int, int]):
    path = adapter / "adapter_model.safetensors"
    state = load_file(str(path))
    key = next(k for k in state if key_part in k)
    state[key] = torch.zeros(new_shape)
    save_file(state, str(path), metadata={"format": "pt"})
    return key


def test_adapter_for_another_base_is_refused_before_loading(adapter, capsys):
    reshape(adapter, "q_proj.lora_A", (8, 96))  # the fixture base has 64 hidden features
    message = one_line_error(check_adapter, str(adapter), BASE)
    assert "does not fit base" in message and "q_proj" in message and "96" in message and "64" in message
    rc, err = run_cli(capsys, "run", "--base", BASE, "--adapter", str(adapter))
    assert rc == 4 and "does not fit base" in err
    check_adapter(str(adapter))  # without a base there is nothing to compare with


def test_adapter_output_shape_and_unknown_modules(adapter, tmp_path):
    reshape(adapter, "down_proj.lora_B", (100, 8))
    assert "lora_B produces 100 output features" in one_line_error(check_adapter, str(adapter), BASE)
    other = shutil.copytree(FAITHFUL, tmp_path / "other")
    cfg = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**cfg, "target_modules": ["c_attn", "c_proj"]}))
    assert "name no module of the base" in one_line_error(check_adapter, str(other), BASE)
    state = load_file(str(other / "adapter_model.safetensors"))
    renamed = {k.replace("self_attn.q_proj", "attn.c_attn"): v for k, v in state.items()}
    save_file(renamed, str(other / "adapter_model.safetensors"), metadata={"format": "pt"})
    (other / "adapter_config.json").write_text(json.dumps(cfg))
    assert "which the base has no weight for" in one_line_error(check_adapter, str(other), BASE)


class Evil:
    """Unpickling this would create a marker file (stands in for arbitrary code)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickle_bin_adapters_never_run_code(adapter, tmp_path, capsys):
    marker = tmp_path / "pwned"
    (adapter / "adapter_model.safetensors").unlink()
    torch.save({"base_model.model.x.lora_A.weight": torch.zeros(2, 2), "payload": Evil(marker)},
               adapter / "adapter_model.bin")
    message = one_line_error(check_adapter, str(adapter), BASE)
    assert "refused" in message and "weights-only" in message
    rc, err = run_cli(capsys, "run", "--base", BASE, "--adapter", str(adapter))
    assert rc == 4 and "refused" in err
    assert not marker.exists()
    # PEFT itself (which lm-eval's HFLM calls) loads .bin weights-only as well in this version
    assert peft_loads_bin_weights_only()
    from peft.utils import load_peft_weights

    with pytest.raises(Exception, match="(?i)weights only load failed|unpickl"):
        load_peft_weights(str(adapter), device="cpu")
    assert not marker.exists()


def test_plain_tensor_bin_adapters_are_accepted(adapter):
    state = load_file(str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_model.safetensors").unlink()
    torch.save(state, adapter / "adapter_model.bin")
    check_adapter(str(adapter), BASE)
    reshape_bin = {k: (torch.zeros(8, 96) if "q_proj.lora_A" in k else v) for k, v in state.items()}
    torch.save(reshape_bin, adapter / "adapter_model.bin")
    assert "does not fit base" in one_line_error(check_adapter, str(adapter), BASE)


# --- base model folders ------------------------------------------------------------------------

def test_bad_base_folders(tmp_path, capsys):
    rc, err = run_cli(capsys, "run", "--base", str(tmp_path / "nope"), "--adapter", FAITHFUL)
    assert rc == 4 and "base model not found" in err
    base = shutil.copytree(BASE, tmp_path / "base")
    (base / "config.json").write_text('{"model_type": "llama",\n oops}')
    rc, err = run_cli(capsys, "run", "--base", str(base), "--adapter", FAITHFUL)
    assert rc == 4 and f"{base / 'config.json'}:2: model config is not valid JSON" in err
    (base / "config.json").unlink()
    rc, err = run_cli(capsys, "run", "--base", str(base), "--adapter", FAITHFUL)
    assert rc == 4 and "has no config.json" in err


# --- results files -----------------------------------------------------------------------------

@pytest.mark.parametrize("content,needle", [
    ('{"results": {"tool_use_fidelity": {}', "not valid JSON"),
    ("", "not valid JSON"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
    ('[1, 2]', "not lm-eval results"),
    ('{"config": {}}', "not lm-eval results"),
    ('{"results": {"hellaswag": {"acc,none": 0.5}}}', "no tool_use_fidelity task in these results (tasks: hellaswag)"),
])
def test_bad_results_files(tmp_path, capsys, content, needle):
    path = write(tmp_path, content, "results_2026.json")
    message = one_line_error(load_results, path)
    assert message.startswith(str(path)) and needle in message
    rc, err = run_cli(capsys, "score", str(path), "--calibration", str(tmp_path / "cal.json"))
    assert rc == 4 and needle in err


def test_missing_results(tmp_path, capsys):
    assert "results file not found" in one_line_error(load_results, tmp_path / "r.json")
    assert "no results*.json under" in one_line_error(load_results, tmp_path)
    rc, err = run_cli(capsys, "score", str(tmp_path), "--calibration", "c.json")
    assert rc == 4 and "no results*.json" in err


# --- the CLI top level ---------------------------------------------------------------------------

def test_guard_exit_codes(capsys):
    def user():
        raise ToolfidError("bad.jsonl:3: something\nwith a second line")

    def bug():
        raise RuntimeError("boom")

    def interrupted():
        raise KeyboardInterrupt

    assert guard(user) == 4
    assert capsys.readouterr().err == "toolfid: error: bad.jsonl:3: something with a second line\n"
    assert guard(bug) == 5
    assert capsys.readouterr().err == ("toolfid: internal error: RuntimeError: boom "
                                       "(rerun with --debug for the traceback)\n")
    assert guard(interrupted) == 130
    assert capsys.readouterr().err == "toolfid: interrupted\n"
    assert guard(lambda: 1) == 1 and guard(lambda: None) == 0
    with pytest.raises(RuntimeError):
        guard(bug, debug=True)


def test_debug_flag_shows_the_exception(tmp_path):
    with pytest.raises(ToolfidError, match="results file not found"):
        main(["--debug", "score", str(tmp_path / "r.json"), "--calibration", "c.json"])


def test_real_console_script_prints_one_line(tmp_path):
    bad = tmp_path / "cases.jsonl"
    bad.write_text(G + "\n{nope\n", encoding="utf-8")
    proc = subprocess.run([str(BIN / "toolfid"), "run", "--base", BASE, "--adapter", FAITHFUL, "--cases", str(bad)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4
    assert proc.stderr.strip().splitlines()[-1].startswith(f"toolfid: error: {bad}:2: not valid JSON")
    assert "Traceback" not in proc.stderr
