"""``toolfid run``'s input errors, each one line with exit 4 and before any model loads: labels that are not names
(nothing written outside --output), an --output that is a file or cannot be made, a second run into a folder in use
(the lock's holder named; a SIGKILLed holder blocks nothing), a truncated adapter file, a device this torch cannot
use, a dtype name torch does not have, a case field too large; an adapter made for another base warns in one line;
a prompt that does not fit the model's context is named with its length before anything is generated."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths

from .lm_eval_helpers import FIXTURE_TASK, toolfid_here

FIX = fixture_paths()


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a session (what loads a model) fails the test: these errors come before it."""
    from lm_eval_toolfid.run import runner

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a session was opened: the error came too late")

    monkeypatch.setattr(runner, "open_session", refuse)


def _run(tmp_path: Path, *extra: str, adapter: str | None = None, out: Path | None = None):
    args = ["run", "--base", FIX["base"], "--adapter", adapter or f"faithful={FIX['adapters']['faithful']}",
            "--task", FIXTURE_TASK, "--device", "cpu", "--limit", "2",
            "--output", str(out if out is not None else tmp_path / "out"), *extra]
    return toolfid_here(args, tmp_path / "home")


def _one_line_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 4 and len(lines) == 1 and lines[0].startswith("toolfid: error: "), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.mark.parametrize("label", ["../x", "a/b", "..", ".served", "../../../../tmp/x/ESC"])
def test_a_label_that_is_not_a_name_is_refused_and_nothing_is_written(tmp_path: Path, no_model: None,
                                                                     label: str) -> None:
    work = tmp_path / "work"
    out = work / "out"
    proc = _run(tmp_path, adapter=f"{label}={FIX['adapters']['faithful']}", out=out)
    _one_line_error(proc, repr(label), "is not a name", "--adapter NAME=PATH")
    assert not work.exists()  # not even --output


def test_labels_are_names_and_views_never_leave_the_output(tmp_path: Path) -> None:
    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.reporting.view_store import view_folder
    from lm_eval_toolfid.run.output import check_label, check_labels

    for good in ("faithful", "my adapter v2", "a.b-c_d", "r16", "ü-lora"):
        assert check_label(good) == good
    for bad in ("", " x", "x ", "a\\b", "a:b", ".hidden", "x\n"):
        with pytest.raises(ToolfidError):
            check_label(bad)
    with pytest.raises(ToolfidError, match="reserved"):
        check_labels(["base-again"])
    assert view_folder(tmp_path, "ad") == tmp_path / "ad"
    for bad in ("../x", "a/b", "..", "/tmp/x"):
        with pytest.raises(ToolfidError, match="would write outside"):
            view_folder(tmp_path, bad)


def test_an_output_that_is_a_file_or_cannot_be_made_is_refused_first(tmp_path: Path, no_model: None) -> None:
    taken = tmp_path / "results.txt"
    taken.write_text("mine\n")
    _one_line_error(_run(tmp_path, out=taken), "is a file, not a folder")
    assert taken.read_text() == "mine\n"
    _one_line_error(_run(tmp_path, out=taken / "sub"), "parent", "is a file")
    _one_line_error(_run(tmp_path, out=Path("/proc/toolfid-out")), "cannot make --output")


def _hold_lock(out: Path) -> subprocess.Popen:
    """Another process holding ``out``'s lock (as a run would) until it is killed."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom lm_eval_toolfid.run.output import output_lock\n"
            "with output_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_into_a_folder_in_use_is_refused_and_a_killed_holder_blocks_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from lm_eval_toolfid.run import runner
    from lm_eval_toolfid.run.output import output_lock

    out = tmp_path / "out"
    holder = _hold_lock(out)
    try:
        reached: list[str] = []

        def opened(*args: object, **kwargs: object) -> None:
            reached.append("session")
            raise KeyboardInterrupt

        monkeypatch.setattr(runner, "open_session", opened)
        line = _one_line_error(_run(tmp_path, out=out), f"--output {out} is in use by toolfid run pid {holder.pid}",
                               f"on {socket.gethostname()}", "started 20")
        assert "another --output" in line and reached == []
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    assert str(holder.pid) in (out / ".toolfid.lock").read_text()  # a stale lock file, no holder: not in the way
    with output_lock(out):  # the kernel released the killed run's lock
        assert json.loads((out / ".toolfid.lock").read_text())["pid"] == os.getpid()
    proc = _run(tmp_path, "--resume", out=out)  # the run goes past the lock to its views (stopped there)
    assert proc.returncode == 130 and reached == ["session"], proc.stderr


def test_a_truncated_adapter_file_is_an_input_error_before_the_model_loads(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from lm_eval_toolfid.run.session import ModelSession

    adapter = tmp_path / "cut"
    shutil.copytree(FIX["adapters"]["faithful"], adapter)
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the adapter was checked")

    monkeypatch.setattr(ModelSession, "load", load)
    _one_line_error(_run(tmp_path, adapter=f"cut={adapter}"), str(weights), "truncated", "re-save")


def test_a_device_this_torch_cannot_use_and_an_unknown_dtype_are_input_errors(
        tmp_path: Path, no_model: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU-only torch (pip's default on Linux without a GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    proc = toolfid_here(["run", "--base", FIX["base"], "--adapter", FIX["adapters"]["faithful"], "--task",
                         FIXTURE_TASK, "--device", "cuda", "--output", str(tmp_path / "o")], tmp_path / "home")
    _one_line_error(proc, "--device cuda", "has no CUDA", "pip install torch --index-url", "--device cpu")
    proc = toolfid_here(["run", "--base", FIX["base"], "--adapter", FIX["adapters"]["faithful"], "--task",
                         FIXTURE_TASK, "--device", "gpu0", "--output", str(tmp_path / "o")], tmp_path / "home")
    _one_line_error(proc, "--device 'gpu0' is not a torch device")
    _one_line_error(_run(tmp_path, "--dtype", "bf16"), "--dtype 'bf16'", "auto, float32, bfloat16, float16")
    assert not (tmp_path / "o").exists()


def test_a_case_field_too_large_is_refused_with_its_line(tmp_path: Path) -> None:
    from lm_eval_toolfid.cases.limits import MAX_FIELD_CHARS, MAX_LINE_CHARS
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.core.errors import ToolfidError

    rows = [json.loads(x) for x in Path(FIX["cases"]).read_text().splitlines() if x.strip()][:2]
    path = tmp_path / "cases.jsonl"
    rows[1]["prompt"] = "x" * (MAX_FIELD_CHARS + 1)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ToolfidError, match=rf"{path}:2: prompt is {MAX_FIELD_CHARS + 1:,} characters long"):
        load_cases(path)
    rows[1]["prompt"] = "short"
    rows[1]["tools"][0]["description"] = "y" * (MAX_FIELD_CHARS + 1)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ToolfidError, match=r":2: tools\[0\].description is"):
        load_cases(path)
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"id": "big", "pad": "z" * MAX_LINE_CHARS}) + "\n")
    with pytest.raises(ToolfidError, match=r":2: the case is [\d,]+ characters long"):
        load_cases(path)


def test_an_adapter_made_for_another_base_warns_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from lm_eval_toolfid.calibration.adapters import check_adapter

    caplog.set_level(logging.WARNING, logger="lm_eval.toolfid")
    check_adapter(FIX["adapters"]["faithful"], FIX["base"])  # its config names the fixture base
    assert caplog.records == []
    other = tmp_path / "other"
    shutil.copytree(FIX["adapters"]["faithful"], other)
    config = json.loads((other / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "Qwen/Qwen2.5-0.5B"
    (other / "adapter_config.json").write_text(json.dumps(config))
    check_adapter(other, FIX["base"])  # the shapes fit: the run goes on
    check_adapter(FIX["adapters"]["faithful"], "HuggingFaceTB/SmolLM2-135M")  # a hub id compares by its name
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines
    assert "was made for base 'Qwen/Qwen2.5-0.5B'" in lines[0] and "compared 'qwen2.5-0.5b' with 'base' / " \
        "'toolfid-fixture-base'" in lines[0], lines[0]
    assert "'toolfid-fixture-base'" in lines[1] and "'smollm2-135m'" in lines[1], lines[1]


def test_prompts_too_long_for_the_context_are_named_with_their_lengths() -> None:
    from types import SimpleNamespace

    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.integrations.lm_eval.prompt_fit import check_prompts_fit

    def request(cid: str, words: int, budget: int = 128) -> SimpleNamespace:
        return SimpleNamespace(args=(" ".join(["w"] * words), {"max_gen_toks": budget}), doc={"id": cid})

    encode = str.split
    check_prompts_fit([request("a", 1920), request("b", 10)], encode, 2048, 256)  # 1920 + 128 fits exactly
    with pytest.raises(ToolfidError) as exc:
        check_prompts_fit([request("a", 1921), request("b", 10), request("c", 5000, 64)], encode, 2048, 256)
    assert str(exc.value).startswith("2 case(s) do not fit the model's context of 2,048 tokens: a (1,921 prompt + "
                                     "128 generated tokens), c (5,000 prompt + 64 generated tokens); shorten")


@pytest.mark.slow  # loads the fixture model through lm-eval's HFLM
def test_weights_safetensors_cannot_read_are_an_input_error_when_the_model_loads(tmp_path: Path) -> None:
    """Past the header checks (the sizes add up) but not a file safetensors reads (a tensor's offsets leave a gap):
    one line naming the adapter, not an internal error."""
    from lm_eval_toolfid.calibration.adapters import check_adapter
    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.run.session import ModelSession

    adapter = tmp_path / "gap"
    shutil.copytree(FIX["adapters"]["faithful"], adapter)
    weights = adapter / "adapter_model.safetensors"
    data = weights.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    first = min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    start, end = header[first]["data_offsets"]
    header[first]["data_offsets"] = [start + 4, end]  # a gap before the first tensor; its shape no longer matches
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    weights.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])
    # the header alone looks fine; reading the tensors (the check for non-finite values) finds it, before loading
    with pytest.raises(ToolfidError, match=rf"the weights of .*{adapter.name}.* cannot be read .*re-save it"):
        check_adapter(adapter, FIX["base"])
    with pytest.raises(ToolfidError, match=rf"the weights of .*{adapter.name}.* cannot be read .*re-save it"):
        ModelSession(FIX["base"]).load({"gap": str(adapter)})
