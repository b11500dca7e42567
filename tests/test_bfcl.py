"""Real-world input nobody on this project wrote: BFCL specs and reference answers (../shared/bfcl)."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.core.schema import check_tool_schema
from lm_eval_toolfid.scoring.outcome import score_generation

from .conftest import SHARED

BFCL = SHARED / "bfcl"
pytestmark = pytest.mark.skipif(not BFCL.is_dir(), reason="../shared/bfcl not present")


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _first_answer(options):
    """BFCL lists acceptable values per parameter ("" means 'may be omitted'); dict values nest option lists."""
    option = next((o for o in options if o != ""), None)
    if isinstance(option, dict):
        return {k: a for k, v in option.items() if (a := _first_answer(v)) is not None}
    return option


@pytest.mark.parametrize("category", ["simple_python", "live_simple", "multiple"])
def test_bfcl_specs_and_reference_answers(category):
    questions = {q["id"]: q for q in _lines(BFCL / f"BFCL_v4_{category}.json")}
    answers = _lines(BFCL / "possible_answer" / f"BFCL_v4_{category}.json")
    kinds: Counter = Counter()
    for answer in answers:
        q = questions[answer["id"]]
        (name, params), = answer["ground_truth"][0].items()
        for fn in q["function"]:
            assert check_tool_schema(fn["parameters"]) is None, (q["id"], fn["name"])
        case = Case.model_validate({"id": q["id"], "prompt": q["question"][0][-1]["content"],
                                    "tools": q["function"], "gold_tool_name": name})
        args = {k: _first_answer(v) for k, v in params.items() if _first_answer(v) is not None}
        outcome = score_generation(json.dumps({"name": name, "arguments": args}), case)
        kinds[outcome.kind.value if outcome.valid else f"{outcome.kind.value}:{outcome.keyword}"] += 1
        assert outcome.hallucinated in (None, False)
    total = sum(kinds.values())
    # "A handful of BFCL reference answers violate their own schemas": the validator must see them,
    # and must accept the rest (BFCL's dict/float/tuple/any types included).
    assert kinds["valid"] / total >= 0.9, kinds
    assert total >= 200


# --- every imported case renders in every prompt style and scores ---------------------------

KNOWN = {k for k in json.loads((Path(__file__).parent / "data" / "bfcl_known_violations.json").read_text())
         if not k.startswith("_")}
QWEN = Path(os.environ.get("TOOLFID_QWEN", Path.home() / ".cache" / "lm_eval_toolfid" / "models" /
                           "qwen2.5-coder-0.5b-instruct"))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Every real file through the real CLI (answers from possible_answer/), plus the real irrelevance
    questions with every tenth one's functions emptied, as BFCL's live_irrelevance has them."""
    from lm_eval_toolfid import cli
    from lm_eval_toolfid.cases.load import load_cases

    out = tmp_path_factory.mktemp("bfcl-all")
    entries = _lines(BFCL / "BFCL_v4_irrelevance.json")
    for i, entry in enumerate(entries):
        if i % 10 == 0:
            entry["function"] = []
    live = out / "BFCL_v4_live_irrelevance.json"
    live.write_text("".join(json.dumps(e) + "\n" for e in entries))
    files = sorted(BFCL.glob("BFCL_v4_*.json")) + [live]
    loaded = {}
    for path in files:
        argv = ["import-bfcl", str(path), "--output", str(out / f"{path.stem}.jsonl")]
        if (BFCL / "possible_answer" / path.name).is_file():
            argv += ["--answers", str(BFCL / "possible_answer" / path.name)]
        assert cli.main(argv) == 0, path
        loaded[path.stem] = load_cases(out / f"{path.stem}.jsonl")
        assert len(loaded[path.stem]) == len(_lines(path)), path  # nothing skipped in the real files
    assert sum(1 for c in loaded["BFCL_v4_live_irrelevance"] if not c.tools) == 24
    return loaded


def _chat_prompters():
    """Chat templates to render with: the tests' Hermes / tools-ignoring / system-refusing templates on
    the fixture tokenizer, and the real Qwen2.5 tool template where that model is set up."""
    from transformers import AutoTokenizer

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.prompts.chat import ChatPrompter

    from .chat_templates import HERMES, IGNORES_TOOLS, NO_SYSTEM

    out = []
    for name, template in (("hermes", HERMES), ("ignores-tools", IGNORES_TOOLS), ("no-system", NO_SYSTEM)):
        tok = AutoTokenizer.from_pretrained(fixture_paths()["base"], local_files_only=True)
        tok.chat_template = template
        out.append((name, ChatPrompter(tok, name)))
    if (QWEN / "tokenizer_config.json").is_file():
        out.append(("qwen2.5", ChatPrompter(AutoTokenizer.from_pretrained(QWEN, local_files_only=True), "qwen")))
    return out


def test_every_imported_case_renders_in_every_style(imported):
    from lm_eval_toolfid.prompts.chat import TOOLS_IN_TEMPLATE
    from lm_eval_toolfid.prompts.prompter import Prompter
    from lm_eval_toolfid.prompts.settings import NO_TOOLS, PRIMER, TEMPLATES

    chats = _chat_prompters()
    seen_no_tools = 0
    for stem, cases in imported.items():
        plains = [Prompter("plain", demos=2, template=t, cases=cases) for t in TEMPLATES]
        raw = Prompter("raw", demos=0)
        for case in cases:
            names = case.tool_names
            for prompter in plains:
                text = prompter.render(case)
                block = text.rsplit("### Tools\n", 1)[1]
                assert case.prompt in block and all(n in block for n in names), (stem, case.id)
                assert (NO_TOOLS in block) == (not names) and text.endswith(PRIMER) == (
                    bool(names) and prompter.settings.template == "plain-v3"), (stem, case.id)
            assert raw.render(case) == case.prompt
            for name, chat in chats:
                text = chat.render(case, [], None)
                assert case.prompt.strip() in text, (name, case.id)
                if chat.tools_in == TOOLS_IN_TEMPLATE:  # both templates list tools in a <tools> block
                    assert all(json.dumps(n) in text for n in names) and ("<tools>" in text) == bool(names), \
                        (name, case.id)
                else:
                    assert ("You can call these tools" in text) == bool(names), (name, case.id)
            seen_no_tools += not names
    assert seen_no_tools == 24


def _all_options_possible(options) -> bool:
    """Some acceptable value exists for every parameter (BFCL gives an empty list for a few)."""
    return all(opts != [] and all(_all_options_possible(o) for o in opts if isinstance(o, dict))
               for opts in options.values())


def test_every_imported_case_scores_reference_and_wrong_answers(imported):
    """Through the one scoring core: the reference answer (first acceptable values) is the expected tool
    with the expected values; prose is no call; an irrelevance case's any call is a false call."""
    from lm_eval_toolfid.cases.bfcl import reference_arguments
    from lm_eval_toolfid.scoring.compare import pair
    from lm_eval_toolfid.scoring.metrics import summarize

    for stem, cases in imported.items():
        pairs = []
        for case in cases:
            prose = score_generation("I cannot help with that.", case)
            assert prose.kind.value == "no_call" and not prose.attempted
            if case.irrelevant:
                made = score_generation(json.dumps({"name": "made_up", "arguments": {}}), case)
                assert made.attempted and made.keyword == "unknown_tool" and made.calls[0].hallucinated
                assert made.gold_tool is None and made.gold_args is None and prose.gold_tool is None
                pairs.append(pair(case, made, prose))
                continue
            calls = [{"name": g.name, "arguments": reference_arguments(g.options)} for g in case.expected_calls]
            text = json.dumps(calls if len(calls) > 1 else calls[0])
            ref = score_generation(text, case)
            known = any(f"{case.id}#{i}" in KNOWN for i in range(len(calls)))
            assert ref.valid != known, (case.id, ref.kind, ref.detail)
            assert ref.gold_tool is True and ref.n_calls == len(calls)
            assert ref.gold_args == all(_all_options_possible(g.options) for g in case.expected_calls), case.id
            assert prose.gold_tool is False and prose.gold_args is False
            pairs.append(pair(case, ref, prose))
        s = summarize(pairs)
        assert s.n == len(cases)
        if cases[0].irrelevant:
            assert (s.get("false_call_rate"), s.get("base_false_call_rate")) == (1.0, 0.0)
        else:
            n_known = sum(any(k.startswith(f"{c.id}#") for k in KNOWN) for c in cases)
            assert s.get("json_valid_rate") == pytest.approx(1 - n_known / len(cases))
            assert s.get("gold_tool_rate") == 1.0 and s.get("base_gold_args_match_rate") == 0.0
            assert s.get("gold_args_match_rate") >= 0.99


@pytest.mark.slow
def test_no_tool_cases_run_through_lm_eval_pair_and_report(tmp_path):
    """Real lm_eval runs of the fixture model (base, then an adapter that pairs with it) on a case file
    mixing fixture cases with real BFCL irrelevance questions that offer no tool (plain-v3: the case
    without tools says so and is not primed); the samples re-score the same and the breakdown reads them."""
    import subprocess

    from lm_eval_toolfid import cli
    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.settings import NO_TOOLS, PRIMER
    from lm_eval_toolfid.reporting.breakdown import NO_CALL_EXPECTED, breakdown
    from lm_eval_toolfid.reporting.load import read_run as read_report_run

    from .lm_eval_helpers import BIN, FIXTURE_TASK, lm_eval_in_process, metrics, read_run

    entries = _lines(BFCL / "BFCL_v4_irrelevance.json")[:8]
    for entry in entries[:6]:
        entry["function"] = []
    live = tmp_path / "BFCL_v4_live_irrelevance.json"
    live.write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert cli.main(["import-bfcl", str(live), "-o", str(tmp_path / "irr.jsonl")]) == 0
    fixture = load_cases("fixture")[:8]
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps(c.model_dump(mode="json", exclude_none=True)) + "\n" for c in fixture)
                     + (tmp_path / "irr.jsonl").read_text())
    fix = fixture_paths()
    meta = {"cases": str(cases), "prompt_template": "plain-v3"}
    home = tmp_path / "home"
    for name, args in (("base", f"pretrained={fix['base']}"),
                       ("ft", f"pretrained={fix['base']},peft={fix['adapters']['faithful']}")):
        # in this process: what is checked is what the runs write (prompts, pairing, samples), not the console script
        code, err = lm_eval_in_process(args, tmp_path / name, home, metadata=meta)
        assert code == 0, err[-3000:]
    results, samples = read_run(tmp_path / "ft")
    assert len(samples) == 16
    no_tools = {e["id"] for e in entries[:6]}
    for s in samples:
        prompt = s["arguments"]["gen_args_0"]["arg_0"]
        assert (NO_TOOLS in prompt) == (s["doc"]["id"] in no_tools)
        assert prompt.endswith(PRIMER) == (s["doc"]["id"] not in no_tools)
        assert s["fidelity_pass"]["base"] is not None  # paired with the base run
    m = metrics(results)
    assert "false_call_rate" in m and "false_call_delta" in m and "json_valid_rate" in m
    # re-scoring the samples without a model gives the run's own numbers
    samples_file = sorted((tmp_path / "ft").rglob(f"samples_{FIXTURE_TASK}_*.jsonl"))[-1]
    proc = subprocess.run([str(BIN / "toolfid"), "check", "--samples", str(samples_file), "--cases", str(cases),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    summary = json.loads(proc.stdout)["summary"]
    for key in ("json_valid_rate", "false_call_rate"):
        assert summary[key] == pytest.approx(m[key]), key
    # the breakdown puts the irrelevance cases in their own row
    results_file = sorted((tmp_path / "ft").rglob("results_*.json"))[-1]
    b = breakdown(read_report_run(results_file))
    rows = {t.tool: t.cases for t in b.tools}
    assert rows[NO_CALL_EXPECTED] == 8 and "" not in rows and sum(rows.values()) == 16
