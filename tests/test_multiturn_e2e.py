"""Multi-turn cases end to end on real components: the bundled fixture model (trained on the plain
transcript) and its ``prose_after_results`` adapter through ``toolfid run`` and the real ``lm_eval``
CLI; a chat-style ``lm_eval`` run of the hand-made conversations through a real chat template."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.cli import main
from lm_eval_toolfid.core.records import PairScore
from lm_eval_toolfid.pairing.samples import sample_prompt

from .chat_templates import HERMES_TOOLS
from .lm_eval_helpers import FIXTURE_TASK, lm_eval_in_process, metrics, read_run, toolfid_meta
from .test_multiturn_prompts import MULTITURN_CASES
from .test_prompt_styles import chat_base

pytestmark = pytest.mark.slow
FIX = fixture_paths()
ADAPTERS = ["faithful", "prose_after_results"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One ``toolfid run`` of the fixture base with the faithful and prose-after-results adapters."""
    root = tmp_path_factory.mktemp("multiturn")
    home = root / "home"
    out = root / "run"
    args = ["run", "--base", FIX["base"], "--task", FIXTURE_TASK, "--device", "cpu", "--output", str(out),
            "--gate", "--html", str(root / "report.html")]
    for name in ADAPTERS:
        args += ["--adapter", f"{name}={FIX['adapters'][name]}"]
    stdout, stderr = io.StringIO(), io.StringIO()
    mp = pytest.MonkeyPatch()
    mp.setenv("TOOLFID_HOME", str(home))
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr):
            code = main(args)
    finally:
        mp.undo()
    views = {name: json.loads((out / name / "results.json").read_text()) for name in ["base", *ADAPTERS]}
    return SimpleNamespace(root=root, home=home, out=out, code=code, stdout=stdout.getvalue(),
                           stderr=stderr.getvalue(), views=views, html=(root / "report.html").read_text())


def _meta(results: dict) -> dict:
    return results["configs"][FIXTURE_TASK]["metadata"]["toolfid"]


def test_the_fixture_base_makes_valid_calls_after_tool_results(run):
    summary = _meta(run.views["base"])["summary"]
    depth = summary["by_depth"]
    assert {"1", "2", "3+", "2+"} <= set(depth)
    assert depth["2+"]["n"] == sum(bool(c.history) for c in load_cases("fixture")) >= 20
    assert depth["1"]["metrics"]["json_valid_rate"] >= 0.9
    assert depth["2+"]["metrics"]["json_valid_rate"] >= 0.85  # the build's target on the transcript format
    # the tiny model writes plausible values rather than copying them (gold_args_match_rate is ~0 on single
    # requests too), so grounding is only reported here; it comes from the multi-turn cases alone
    grounded = depth["2+"]["metrics"]["result_grounding_rate"]
    assert grounded is not None and depth["1"]["metrics"].get("result_grounding_rate") is None
    assert metrics(run.views["base"], FIXTURE_TASK)["result_grounding_rate"] == grounded


def test_prose_after_results_fails_on_the_multi_turn_cases_while_single_turn_ones_hold(run):
    assert run.code == 1, run.stderr[-2000:]  # --gate: an adapter failed
    meta = _meta(run.views["prose_after_results"])
    verdict, depth = meta["verdict"], meta["summary"]["by_depth"]
    assert verdict["label"] == "FAIL"
    assert "multiturn_validity_delta" in [g["name"] for g in verdict["gates"] if g["passed"] is False]
    assert "multi-turn cases alone: validity_delta" in verdict["reason"]
    assert "(statistically clear" in verdict["reason"] and "while single-turn cases hold" in verdict["reason"]
    assert depth["1"]["metrics"]["validity_delta"] >= -0.05  # single-turn calls kept
    assert depth["2+"]["metrics"]["validity_delta"] <= -0.7  # answers tool results in prose
    assert depth["2+"]["metrics"]["result_grounding_rate"] == 0.0  # prose reproduces no result value
    faithful = _meta(run.views["faithful"])["verdict"]
    assert faithful["label"] == "PASS", faithful["reason"]


def test_the_reports_show_the_multi_turn_failure(run):
    block = run.stdout[run.stdout.index("== prose_after_results"):]
    assert "per turn depth (valid base → adapter):" in block
    line = next(ln for ln in block.splitlines() if ln.strip().startswith("multi-turn (2+)"))
    assert "result grounding" in line and "(-0." in line
    assert "(turn depth " in block  # a worst case shows the end of its conversation
    html = run.html
    assert "validity delta per turn depth" in html and '<table class="depths">' in html
    assert "turn depth 2" in html and "Tool result (" in html  # a worst case shows its conversation


def test_lm_eval_cli_pairs_multi_turn_cases_with_the_same_outcomes_as_toolfid_run(run, tmp_path):
    """The two-run ``lm_eval`` flow (generating on to ``\\n###``) scores every case exactly as ``toolfid
    run`` (which stops each row at the end of its call) did."""
    home = tmp_path / "home"
    # the two lm-eval runs in this process: what they write is compared here (the console script: test_lm_eval_cli)
    code, err = lm_eval_in_process(f"pretrained={FIX['base']}", tmp_path / "base", home)
    assert code == 0, err[-3000:]
    code, err = lm_eval_in_process(f"pretrained={FIX['base']},peft={FIX['adapters']['prose_after_results']}",
                                   tmp_path / "ft", home)
    assert code == 0, err[-3000:]
    results, samples = read_run(tmp_path / "ft")
    assert toolfid_meta(results)["verdict"]["label"] == "FAIL"
    assert "multi-turn cases alone" in toolfid_meta(results)["verdict"]["reason"]
    docs = {s["doc"]["id"]: s["doc"] for s in samples}
    assert all("conversation" in d and "turn_depth" in d for d in docs.values())
    assert {d["turn_depth"] for d in docs.values()} == {1, 2, 3}
    cli = {s["doc"]["id"]: PairScore.model_validate(s["fidelity_pass"]) for s in samples}
    run_samples = run.out / "prose_after_results" / "samples.jsonl"
    inproc = {json.loads(line)["doc"]["id"]: PairScore.model_validate(json.loads(line)["fidelity_pass"])
              for line in run_samples.read_text().splitlines() if line.strip()}
    assert set(cli) == set(inproc)
    for cid, rec in cli.items():
        other = inproc[cid]
        assert (rec.ft.kind, rec.base.kind, rec.turn_depth, rec.ft.result_grounding) == \
            (other.ft.kind, other.base.kind, other.turn_depth, other.ft.result_grounding), cid


def test_chat_style_lm_eval_run_renders_conversations_with_the_template(tmp_path):
    """A real chat template that writes tool calls and tool responses: the conversations reach the model
    in the template's own format, the run records it, and every case is scored per depth."""
    base = chat_base(tmp_path, HERMES_TOOLS)
    code, err = lm_eval_in_process(f"pretrained={base}", tmp_path / "out", tmp_path / "home",
                                   metadata={"prompt_style": "chat", "cases": str(Path(MULTITURN_CASES).resolve())},
                                   extra=["--gen_kwargs", "max_gen_toks=16"])
    assert code == 0, err[-3000:]
    results, samples = read_run(tmp_path / "out")
    meta = toolfid_meta(results)
    assert meta["chat_history_in"] == "template" and meta["n_cases"] == 10
    prompts = {s["doc"]["id"]: sample_prompt(s) for s in samples}
    assert all("<tool_response>" in p and "<tool_call>" in p for p in prompts.values())
    assert set(meta["summary"]["by_depth"]) == {"2", "3+", "2+"}


def test_smollm2s_real_template_gets_the_calls_as_text():
    """SmolLM2-135M-Instruct's own chat template (read from the GGUF that setup installs) renders every
    role's content: the results as ``tool`` turns, but no ``tool_calls``, which go in as text."""
    from transformers import AutoTokenizer

    from lm_eval_toolfid.prompts.chat import ChatPrompter
    from scripts.real_models import smollm2_gguf

    from .test_multiturn_prompts import flight_case

    gguf = smollm2_gguf()
    chat = ChatPrompter(AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name), "smollm2")
    text = chat.render(flight_case(), [])
    assert (chat.tools_in, chat.history_in) == ("system", ("text", "template"))
    assert ('<|im_start|>assistant\n{"name": "search_flights", "arguments": {"origin": "Paris", "dest": "Rome"}}'
            '<|im_end|>\n<|im_start|>tool\n{"flights": [{"id": "AZ123", "price": 129}]}<|im_end|>') in text

