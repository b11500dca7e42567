"""Base references: stored under a full identity key, never used when anything differs."""

import json
import shutil
from pathlib import Path

import pytest

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.identity import RunKey, base_identity, dir_fingerprint
from lm_eval_toolfid.pairing.references import find_reference, write_reference
from lm_eval_toolfid.pairing.samples import reference_from_samples


def key(**over):
    data = {"base": {"pretrained": "org/model", "revision": "main"}, "case_set": "abc", "prompt": "p1",
            "generation": {"until": ["\n###"], "do_sample": False, "max_gen_toks": 64}}
    data.update(over)
    return RunKey(**data)


def test_round_trip_and_every_key_field_matters(tmp_path):
    hashes, gens = {"a": "h1", "b": "h2"}, {"a": "{...}", "b": "prose"}
    write_reference(key(), hashes, gens, tmp_path)
    ref = find_reference(key(), tmp_path)
    assert ref is not None and ref.generations == gens
    assert ref.mismatch(hashes) is None
    for other in (key(case_set="zzz"), key(prompt="p2"), key(generation={"until": ["\n\n"]}),
                  key(base={"pretrained": "org/model", "revision": "v2"})):
        assert find_reference(other, tmp_path) is None


def test_stale_reference_reports_why(tmp_path):
    write_reference(key(), {"a": "h1"}, {"a": "x"}, tmp_path)
    ref = find_reference(key(), tmp_path)
    assert "lacks 1 of 2" in ref.mismatch({"a": "h1", "b": "h2"})
    assert "differ for 1" in ref.mismatch({"a": "other"})


def test_hand_edited_reference_is_not_used(tmp_path):
    path = write_reference(key(), {"a": "h1"}, {"a": "x"}, tmp_path)
    payload = json.loads(path.read_text())
    payload["key"]["case_set"] = "tampered"
    path.write_text(json.dumps(payload))
    assert find_reference(key(), tmp_path) is None


def test_local_base_identity_has_a_content_fingerprint(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\x00" * 100)
    ident = base_identity({"pretrained": str(model), "peft": "/x", "batch_size": 8})
    assert "peft" not in ident and "batch_size" not in ident
    before = ident["fingerprint"]
    (model / "model.safetensors").write_bytes(b"\x01" * 100)
    assert dir_fingerprint(model) != before
    assert "fingerprint" not in base_identity({"pretrained": "org/hub-model"})
    with pytest.raises(ToolfidError):
        base_identity({})


def test_identity_is_what_changes_outputs_not_how_a_flow_spells_it(tmp_path):
    """The same base reached by another path (a copy, a relative path), with lm-eval's own ``config_source``
    bookkeeping, with its dtype spelled out or left to ``auto``, is the same base; another content or another
    dtype is not."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"dtype": "float32"}')
    (model / "model.safetensors").write_bytes(b"\x00" * 100)
    copy = tmp_path / "elsewhere" / "m-copy"
    shutil.copytree(model, copy)
    ident = base_identity({"pretrained": str(model)}, "hf")
    same = [
        base_identity({"pretrained": str(copy), "config_source": "/site-packages/x/tool_use_fidelity.yaml"}, "hf"),
        base_identity({"pretrained": str(model), "dtype": "float32", "device": "cpu"}, "hf"),
        base_identity({"pretrained": str(model), "dtype": "torch.float32", "config_source": "inline"}, "hf"),
        base_identity({"pretrained": str(model), "dtype": "auto"}, "hf"),
    ]
    assert all(s == ident for s in same) and ident["dtype"] == "float32"
    assert base_identity({"pretrained": str(model), "dtype": "bf16"}, "hf")["dtype"] == "bfloat16"
    assert base_identity({"pretrained": str(model), "dtype": "bfloat16"}, "hf") != ident
    assert base_identity({"pretrained": str(model)}, "vllm") != ident
    (copy / "model.safetensors").write_bytes(b"\x02" * 100)
    assert base_identity({"pretrained": str(copy)}, "hf") != ident


KEY = RunKey(base={"pretrained": "b", "backend": "hf"}, case_set="cs", prompt="p", generation={"until": ["\n###"]})


def _results(model_args, key=KEY):
    meta = {"toolfid": {"run_key": key.as_dict()}} if key is not None else {}
    return json.dumps({"config": {"model_args": model_args},
                       "configs": {"tool_use_fidelity": {"metadata": meta}}})


def test_reference_from_lm_eval_samples(tmp_path):
    samples = tmp_path / "samples_tool_use_fidelity_2026-01-01T00-00-00.jsonl"
    rows = [{"doc": {"id": "a"}, "filtered_resps": ['{"name": "x", "arguments": {}}'],
             "cases_scored": {"request_hash": "h-a"}}]
    samples.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    # no results file beside the samples: cannot be confirmed to be a base run of this task
    with pytest.raises(ToolfidError, match="results file"):
        reference_from_samples(samples, KEY)
    results = tmp_path / "results_2026-01-01T00-00-00.json"
    results.write_text(_results("pretrained=b"))
    ref = reference_from_samples(samples, KEY)
    assert ref.generations == {"a": '{"name": "x", "arguments": {}}'} and ref.prompt_hashes == {"a": "h-a"}
    # an adapter run (any mechanism) is refused
    for args in ({"pretrained": "b", "peft": "a"}, "pretrained=b,delta=/d", {"pretrained": "b", "lora_local_path": "/l"}):
        results.write_text(_results(args))
        with pytest.raises(ToolfidError, match="adapter run"):
            reference_from_samples(samples, KEY)
    # a base run of another prompt / base: refused, naming what differs
    other = RunKey(base={"pretrained": "c", "backend": "hf"}, case_set="cs", prompt="q", generation=KEY.generation)
    results.write_text(_results("pretrained=c", other))
    with pytest.raises(ToolfidError, match=r"differs in base\.pretrained, prompt"):
        reference_from_samples(samples, KEY)


def test_bad_samples_files_are_one_line_errors(tmp_path):
    with pytest.raises(ToolfidError, match="not found"):
        reference_from_samples(tmp_path / "nope.jsonl", KEY)
    bad = tmp_path / "samples_x.jsonl"
    bad.write_text('{"unrelated": 1}\n')
    (tmp_path / "results_x.json").write_text(_results("pretrained=b"))
    with pytest.raises(ToolfidError, match=r"samples_x.jsonl:1"):
        reference_from_samples(bad, KEY)


def test_an_adapter_run_pairs_only_when_references_cover_every_case_it_scores(tmp_path):
    from lm_eval_toolfid.integrations.lm_eval.fidelity_run import FidelityRun
    from lm_eval_toolfid.pairing.references import write_reference
    from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings

    from .conftest import make_case

    cases = {cid: make_case(id=cid) for cid in ("a", "b")}
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    write_reference(KEY, {"a": "ha"}, {"a": call}, tmp_path, full=False)  # a subset reference: case a only
    settings = TaskSettings.from_metadata({"pretrained": "b", "peft": "/adapter", "reference_dir": str(tmp_path)})
    hashes = {"a": "ha", "b": "hb"}

    both = FidelityRun(settings, cases)
    both.resolve(KEY, hashes, scored_ids=["a", "b"])
    assert both.references == [] and "covers 1 of the 2 cases" in both.provenance["pairing"]
    record = both.score("a", call)
    assert record.base is None  # no paired metric over the covered subset

    only_a = FidelityRun(settings, cases)
    only_a.resolve(KEY, hashes, scored_ids=["a"])  # e.g. --limit 1
    assert only_a.score("a", call).base is not None
    assert only_a.finish([only_a.score("a", call)]).summary.paired


def test_a_line_separator_inside_a_generation_is_not_a_line_break(tmp_path):
    from lm_eval_toolfid.pairing.samples import iter_sample_answers

    samples = tmp_path / "samples_tool_use_fidelity_x.jsonl"
    text = 'I will call it\u2028{"name": "x", "arguments": {"a": "b\u2029c"}}'
    rows = [{"doc": {"id": "a"}, "filtered_resps": [text]}, {"doc": {"id": "b"}, "filtered_resps": ["\u0085"]}]
    samples.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert [(cid, t) for _, cid, t, _ in iter_sample_answers(samples)] == [("a", text), ("b", "\u0085")]
    (tmp_path / "results_x.json").write_text(_results("pretrained=b"))
    assert reference_from_samples(samples, KEY).generations["a"] == text


def test_a_base_run_of_the_old_stop_rule_is_refused_for_a_primed_prompt(tmp_path):
    """Before issue 28 the engine's early stop did not read plain-v3's primer and could cut a base answer one
    brace short. A reference (or samples file) without the stop rule that wrote it is used for an unprimed
    prompt, and refused, in one line, for a primed one; one written now is used for both."""
    from lm_eval_toolfid.integrations.lm_eval.fidelity_run import FidelityRun
    from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings
    from lm_eval_toolfid.pairing.references import STOP_RULE

    from .conftest import make_case

    cases = {"a": make_case(id="a")}
    path = write_reference(KEY, {"a": "ha"}, {"a": '{"name": "get_weather", "arguments": {}}'}, tmp_path)
    assert json.loads(path.read_text())["stop_rule"] == STOP_RULE
    settings = TaskSettings.from_metadata({"pretrained": "b", "peft": "/adapter", "reference_dir": str(tmp_path)})

    def resolve(primed: bool) -> FidelityRun:
        run = FidelityRun(settings, cases)
        run.resolve(KEY, {"a": "ha"}, primed=primed)
        return run

    assert resolve(True).references and resolve(False).references
    payload = json.loads(path.read_text())
    del payload["stop_rule"]  # as written before the fix
    path.write_text(json.dumps(payload))
    assert resolve(False).references  # unprimed prompts were never affected
    primed = resolve(True)
    assert primed.references == [] and primed.provenance["pairing"].startswith("none")
    # samples of an engine run from before: refused with the reason; of lm-eval's own HFLM: fine
    samples = tmp_path / "samples_tool_use_fidelity_2026-01-01T00-00-00.jsonl"
    samples.write_text(json.dumps({"doc": {"id": "a"}, "filtered_resps": ["x"], "cases_scored": {"request_hash": "ha"}})
                       + "\n")
    results = json.loads(_results("pretrained=b"))
    for cfg in results["configs"].values():
        cfg["metadata"]["toolfid"]["generation"] = {"engine": "toolfid"}
    (tmp_path / "results_2026-01-01T00-00-00.json").write_text(json.dumps(results))
    with pytest.raises(ToolfidError, match="before toolfid's early stop read the prompt's primer"):
        reference_from_samples(samples, KEY, primed=True)
    assert reference_from_samples(samples, KEY, primed=False).generations == {"a": "x"}
    for cfg in results["configs"].values():
        cfg["metadata"]["toolfid"]["generation"] = {"engine": "not recorded"}
    (tmp_path / "results_2026-01-01T00-00-00.json").write_text(json.dumps(results))
    assert reference_from_samples(samples, KEY, primed=True).generations == {"a": "x"}


def test_a_vllm_adapter_run_with_lora_settings_names_the_base_command_that_pairs() -> None:
    from lm_eval_toolfid.pairing.identity import base_identity, lora_settings_demand

    args = {"pretrained": "org/Base", "dtype": "float32", "enable_lora": "True", "lora_local_path": "/a/sql",
            "max_lora_rank": "16"}
    # the LoRA settings stay in the base identity (vLLM with LoRA enabled is another base path) …
    base = base_identity(args, "vllm")
    assert base["enable_lora"] == "True" and base["max_lora_rank"] == "16" and "lora_local_path" not in base
    # … and the adapter run says, in one line, which base run pairs with it
    line = lora_settings_demand(args)
    assert line is not None and "\n" not in line
    assert "enable_lora=True, max_lora_rank=16" in line
    assert "--model_args pretrained=org/Base,dtype=float32,enable_lora=True,max_lora_rank=16 " in line
    assert "lora_local_path" not in line
    # no demand for a base run, or an adapter run without LoRA settings
    assert lora_settings_demand({"pretrained": "org/Base", "enable_lora": "True"}) is None
    assert lora_settings_demand({"pretrained": "org/Base", "peft": "/a/sql"}) is None


def test_a_folder_s_fingerprint_is_remembered_only_while_its_files_stay_as_they_were(tmp_path: Path) -> None:
    """The base's identity is asked for in every view: a folder's fingerprint is read once, and a file written since
    (in place, the same size: only its time tells) or just now (within the clock's granularity) is read again."""
    import os
    import time

    from lm_eval_toolfid.pairing import identity

    folder = tmp_path / "model"
    folder.mkdir()
    weights = folder / "weights.bin"
    weights.write_bytes(b"a" * 64)
    fresh = identity.dir_fingerprint(folder)
    assert not any(key[0] == str(folder.resolve()) for key in identity._FINGERPRINTS)  # written just now: not kept
    old = time.time_ns() - 10_000_000_000
    os.utime(weights, ns=(old, old))
    assert identity.dir_fingerprint(folder) == fresh
    assert any(key[0] == str(folder.resolve()) for key in identity._FINGERPRINTS)  # settled: kept
    with weights.open("r+b") as fh:  # rewritten in place, the same size
        fh.write(b"b" * 64)
    assert identity.dir_fingerprint(folder) != fresh


def test_a_task_s_documents_are_the_arrow_table_s_rows_as_plain_dicts_each_task_its_own() -> None:
    """lm-eval iterates a task's documents several times per view; an Arrow table formats each row each time
    (seconds over a hundred views). The task hands lm-eval the same rows as plain dicts, with the table's features,
    each task its own copies (a view that changed a document would change no other view's)."""
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import fixture_paths, tasks_path

    meta = {"pretrained": fixture_paths()["base"]}
    first, second = (TaskManager(include_path=str(tasks_path()), include_defaults=False, metadata=meta).load(
        ["tool_use_fidelity_fixture"])["tasks"]["tool_use_fidelity_fixture"] for _ in range(2))
    table = first.dataset["test"]
    docs = first.test_docs()
    assert docs == list(table) and all(type(d) is dict for d in docs)
    assert docs.features == table.features and first.features == list(table.features)
    assert first.eval_docs is docs  # built once per task
    other = second.test_docs()
    assert other == docs and all(a is not b for a, b in zip(other, docs))
    other[0]["prompt"] = "changed in one view"
    assert first.test_docs()[0]["prompt"] == table[0]["prompt"]
