"""Input and environment errors are exit 4 in one line, never exit 1 (what ``--gate`` gives a failed adapter) or
exit 5 (a bug): the task's errors raised inside lm-eval, a lock file that is a link or a folder, labels that do not
fit the filesystem or name what PEFT uses itself, ``--limit 0``, a full disk."""

from __future__ import annotations

import errno
import json
import os

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.core.errors import EXIT_INPUT, ToolfidError, disk_full, guard
from lm_eval_toolfid.run.output import LOCK_FILE, check_labels, output_lock

from .lm_eval_helpers import FIXTURE_TASK, toolfid_here

FIX = fixture_paths()


def test_the_tasks_one_line_errors_keep_their_exit_code(capsys) -> None:
    """``toolfid run`` runs its views through lm-eval, where the task ends a bad run with ``SystemExit(str)``: the
    guard prints it and returns its code (4), where Python would exit 1."""
    def task_error() -> int:
        out = SystemExit("tool_use_fidelity: bad task setting demos: Input should be less than or equal to 8")
        out.toolfid_exit_code = EXIT_INPUT  # type: ignore[attr-defined]
        raise out

    assert guard(task_error) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("toolfid: error: tool_use_fidelity: bad task setting demos")
    with pytest.raises(SystemExit):  # any other SystemExit passes through
        guard(lambda: (_ for _ in ()).throw(SystemExit(3)))


def test_a_bad_task_setting_in_toolfid_run_is_exit_4(tmp_path) -> None:
    proc = toolfid_here(["run", "--base", FIX["base"], "--adapter", f"a={FIX['adapters']['faithful']}", "--demos",
                         "500", "--limit", "2", "--output", tmp_path / "out"], tmp_path / "home")
    assert proc.returncode == EXIT_INPUT, proc.stderr[-2000:]
    assert "demos" in proc.stderr and "Traceback" not in proc.stderr
    assert "loading" not in proc.stderr  # known from the arguments: refused before the model loads


def test_the_lock_is_never_written_through_a_link_or_into_a_folder(tmp_path) -> None:
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(outside)
    with pytest.raises(ToolfidError, match="lock file .* is a link; remove it"):
        with output_lock(out):
            pass
    assert outside.read_text() == "keep me"
    (out / LOCK_FILE).unlink()
    (out / LOCK_FILE).mkdir()
    with pytest.raises(ToolfidError, match="is a folder; remove it"):
        with output_lock(out):
            pass
    (out / LOCK_FILE).rmdir()
    with output_lock(out):  # a plain file: held, and it says who holds it
        assert '"pid"' in (out / LOCK_FILE).read_text()


@pytest.mark.parametrize("label,why", [("a" * 256, "bytes"), ("é" * 120, "bytes"), ("Base", "reserved"),
                                       ("DEFAULT", "reserved"), ("__base__", "not a name|reserved")])
def test_labels_that_do_not_fit_or_are_taken_are_refused(label, why) -> None:
    with pytest.raises(ToolfidError, match=why):
        check_labels([label])


def test_a_label_at_the_limit_is_a_name() -> None:
    check_labels(["a" * 235])


@pytest.mark.parametrize("limit", ["0", "-3", "none"])
def test_lm_eval_limit_that_selects_nothing_is_exit_4(tmp_path, limit) -> None:
    proc = toolfid_here(["lm-eval", "--tasks", "tool_use_fidelity_fixture", "--model", "hf", "--model_args",
                         f"pretrained={FIX['base']}", "--limit", limit, "--output_path", tmp_path], tmp_path)
    assert proc.returncode == EXIT_INPUT and "selects no case" in proc.stderr, proc.stderr[-2000:]


def test_a_full_disk_is_one_line_naming_the_file_and_exit_4(tmp_path, capsys) -> None:
    path = tmp_path / "out" / "samples.jsonl"

    def write() -> int:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        except OSError as exc:
            raise RuntimeError("while saving the view") from exc

    assert guard(write) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no space left writing {path}" in err and "--resume" in err
    assert disk_full(ValueError("x")) is None


def _nan_adapter(tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    adapter = tmp_path / "nan"
    shutil.copytree(FIX["adapters"]["faithful"], adapter)
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    name = sorted(weights)[3]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(adapter / "adapter_model.safetensors"))
    return adapter, name


def test_an_adapter_with_non_finite_weights_is_refused_naming_the_tensor(tmp_path) -> None:
    adapter, name = _nan_adapter(tmp_path)
    for args in (["run", "--base", FIX["base"], "--adapter", f"nan={adapter}", "--output", tmp_path / "out"],
                 ["lm-eval", "--tasks", "tool_use_fidelity_fixture", "--model", "hf", "--model_args",
                  f"pretrained={FIX['base']},peft={adapter}", "--output_path", tmp_path / "lm"]):
        proc = toolfid_here(args, tmp_path / "home")
        assert proc.returncode == EXIT_INPUT, proc.stderr[-2000:]
        assert f"tensor {name} holds NaN or infinite values" in proc.stderr and "Traceback" not in proc.stderr


def test_a_prefix_tuning_adapter_is_refused_by_the_engine_in_one_line(tmp_path) -> None:
    """PEFT loads a prefix-tuning adapter and generates with it; toolfid run's engine cannot: exit 4 before loading,
    naming what runs it."""
    from peft import PrefixTuningConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(FIX["base"]),
                           PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4))
    model.save_pretrained(tmp_path / "prefix")
    proc = toolfid_here(["run", "--base", FIX["base"], "--adapter", f"p={tmp_path / 'prefix'}", "--output",
                         tmp_path / "out"], tmp_path / "home")
    assert proc.returncode == EXIT_INPUT, proc.stderr[-2000:]
    assert "prefix tuning" in proc.stderr and "lm_eval --model hf" in proc.stderr
    assert "loading" not in proc.stderr  # refused before the model loads


def _tiny_base(tmp_path, **overrides):
    """A tiny random Qwen2 (attention biases, embeddings untied) with the fixture's tokenizer: a base of another
    shape than the fixture's, made in a second."""
    import shutil

    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                            "tie_word_embeddings": False, **overrides})
    base = tmp_path / "qwen-tiny"
    Qwen2ForCausalLM(config).save_pretrained(base)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (FIX_BASE := __import__("pathlib").Path(FIX["base"]) / name).is_file():
            shutil.copy(FIX_BASE, base / name)
    return base


def _lora(base, out, **config):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **config))
    model.save_pretrained(out)
    return out


def test_an_adapter_that_rewrites_the_base_or_needs_its_own_modules_is_refused_up_front(tmp_path) -> None:
    """PEFT writes a ``bias="all"`` adapter's biases into the base's own layers (the base view would not be the base);
    ``modules_to_save`` on tied embeddings cannot be evaluated as saved; ``modules_to_save`` beside other views is
    not applied to its rows: each is exit 4 before loading, in one line naming the adapter and what it has."""
    qwen = _tiny_base(tmp_path)
    cases = [
        (qwen, _lora(qwen, tmp_path / "bias", bias="all"), [], "trains the base's own biases"),
        (FIX["base"], _lora(FIX["base"], tmp_path / "saved_tied", modules_to_save=["lm_head"]), ["--views-together", "1"],
         "tied"),
        (qwen, _lora(qwen, tmp_path / "saved", modules_to_save=["lm_head"]), [], "--views-together 1"),
    ]
    for base, adapter, extra, why in cases:
        proc = toolfid_here(["run", "--base", base, "--adapter", f"a={adapter}", "--output", tmp_path / "out",
                             *extra], tmp_path / "home")
        assert proc.returncode == EXIT_INPUT, (why, proc.stderr[-2000:])
        assert why in proc.stderr and str(adapter) in proc.stderr and "loading" not in proc.stderr, proc.stderr
    # a LoRA whose base has no biases to train saves none: nothing is written into the base, and it runs
    from lm_eval_toolfid.calibration.adapters import check_engine_adapter

    check_engine_adapter(_lora(FIX["base"], tmp_path / "bias_none_there", bias="all"), FIX["base"])
    check_engine_adapter(tmp_path / "saved", qwen, alone=True)  # alone: its own modules apply to its rows


@pytest.mark.parametrize("text,cases", [("metadata:\n  cases: default\n", "default"),
                                        ("metadata:\n  cases: x.jsonl  # the set of release 3\n", "x.jsonl"),
                                        ('metadata:\n  cases: "my cases.jsonl"  # quoted\n', "my cases.jsonl"),
                                        ("metadata:\n  cases: 'a#b.jsonl'\n", "a#b.jsonl"), ("task: t\n", None)])
def test_a_task_yamls_cases_setting_is_read_with_a_comment_after_it(text, cases) -> None:
    """``--resume`` keys a view by the digest of the cases its task's YAML names: a trailing comment there must not
    hide them (edits to the case file would go unnoticed)."""
    from lm_eval_toolfid.run.resume import yaml_cases

    assert yaml_cases(text) == cases


def test_a_misspelt_task_setting_is_refused_not_ignored(tmp_path) -> None:
    """``--metadata '{"validity_delta_flor": -0.1}'`` would leave the floor at its default and gate on it: a key
    that is a near-miss of a task setting (and no model argument lm-eval knows) is exit 4, naming the setting."""
    proc = toolfid_here(["lm-eval", "--tasks", "tool_use_fidelity_fixture", "--model", "hf", "--model_args",
                         f"pretrained={FIX['base']}", "--metadata", '{"validity_delta_flor": -0.1}', "--limit", "2",
                         "--output_path", tmp_path], tmp_path)
    assert proc.returncode == EXIT_INPUT, proc.stderr[-2000:]
    assert "did you mean 'validity_delta_floor'" in proc.stderr and "Traceback" not in proc.stderr
    from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings

    assert TaskSettings.from_metadata({"revision": "main", "max_length": 9}).model_args  # model args pass


def test_an_unwritable_reference_folder_is_named_with_what_to_do(tmp_path) -> None:
    """A base run cannot store its reference in a folder that cannot be made (here: under a file); the adapter run's
    UNDECIDED names the folder and what to do, not "run the base first" (it was run). The base run's side (its
    results kept, one warning) is tests/test_lm_eval_cli.py's."""
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.integrations.lm_eval.fidelity_run import FidelityRun
    from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings
    from lm_eval_toolfid.pairing.identity import RunKey

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    settings = TaskSettings.from_metadata({"pretrained": FIX["base"], "peft": FIX["adapters"]["faithful"],
                                           "reference_dir": str(blocker / "refs")})
    run = FidelityRun(settings, {c.id: c for c in load_cases("fixture")[:2]})
    run.resolve(RunKey(base={"fingerprint": "f"}, case_set=run.case_set, prompt="p", generation={}), {})
    assert "cannot be written" in run.provenance["pairing"] and "set reference_dir" in run.provenance["pairing"]
    writable = FidelityRun(settings.model_copy(update={"raw": {"reference_dir": str(tmp_path / "refs")}}),
                           {c.id: c for c in load_cases("fixture")[:2]})
    writable.resolve(RunKey(base={"fingerprint": "f"}, case_set=run.case_set, prompt="p", generation={}), {})
    assert "cannot be written" not in writable.provenance["pairing"]


@pytest.mark.slow
def test_an_adapter_with_its_own_modules_run_alone_is_the_adapter_given_and_the_base_is_the_base(tmp_path) -> None:
    """A LoRA that saves its own ``lm_head`` (``modules_to_save``, changed from the base's), run alone
    (``--views-together 1``) beside a B = 0 LoRA: its answers are plain PEFT's (``lm_eval --model hf peft=``) case by
    case, the B = 0 view's are the base view's, and the base view's are those of a run without any adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from .lm_eval_helpers import lm_eval_here, read_run

    qwen = _tiny_base(tmp_path, vocab_size=2048)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(qwen), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modules_to_save" in name or "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.5)
    model.save_pretrained(tmp_path / "saved")
    zero = _lora(qwen, tmp_path / "zero")  # PEFT's initialisation: B = 0
    home, limit = tmp_path / "home", ["--limit", "6"]
    proc = toolfid_here(["run", "--base", qwen, "--adapter", f"saved={tmp_path / 'saved'}", "--adapter",
                         f"zero={zero}", "--views-together", "1", "--task", FIXTURE_TASK, "--output", tmp_path / "out",
                         "--device", "cpu",
                         "--json", *limit], home)
    assert proc.returncode == 0, proc.stderr[-2000:]

    def answers(path):
        return {s["doc"]["id"]: s["resps"][0][0] for s in map(json.loads, path.read_text().splitlines())}

    ours = {label: answers(tmp_path / "out" / label / "samples.jsonl") for label in ("base", "saved", "zero")}
    assert ours["zero"] == ours["base"]
    for model_args, label in ((f"pretrained={qwen},peft={tmp_path / 'saved'}", "saved"), (f"pretrained={qwen}", "base")):
        run = lm_eval_here(model_args, tmp_path / f"plain_{label}", tmp_path / "home_plain", extra=limit)
        assert run.returncode == 0, run.stderr[-2000:]
        plain = {s["doc"]["id"]: s["resps"][0][0] for s in read_run(tmp_path / f"plain_{label}")[1]}
        assert ours[label] == plain, label
    assert ours["saved"] != ours["base"]  # the saved lm_head changed the answers: the comparison could fail
