"""Three flows, one answer: plain ``lm_eval --model hf`` (lm-eval's HFLM generates on to ``\\n###``),
``toolfid lm-eval --model hf`` (toolfid's engine stops each row once its scored answer is settled) and
``toolfid run`` (the engine, one process) score every case alike — on SmolLM2-135M-Instruct in its default style
(``auto`` -> plain-v3: the prompt ends with the primer ``{"name": "``, so the outer brace of every call is in the
prompt), on the cases of :data:`CASES`.

Before issue 28, 3 of the first 16 default cases differed (the engine cut ``…"ZA"}}`` one brace short of the
call): ``calendar-0004``, ``shop-0006`` and ``bank-0010`` are kept, with a flat call (``shipping-0008``) and a
conversation (``mt-calendar-0008``); the other 11 of those 16 scored alike before and after the fix, so they proved
nothing a stop rule could break. Plain ``lm_eval`` runs through lm-eval's own console entry point
(``cli_evaluate``, plain ``--model hf``), ``toolfid lm-eval`` and ``toolfid run`` through toolfid's: all three in
this process (the same argument handling and evaluator, without paying lm-eval's imports and task indexing per
run; the console scripts as processes are run by tests/test_lm_eval_cli.py and tests/test_wheel.py).
Also: a base reference written by plain ``lm_eval`` pairs with an adapter run of the engine (a B = 0 LoRA: every output the
same, PASS), since the two flows are guaranteed to score alike. Qwen's default style (chat) runs the same three
flows in tests/test_qwen_coder.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


from .lm_eval_helpers import lm_eval_here, read_run, toolfid_here, toolfid_meta
from .lora_recipes import zero_lora

pytestmark = pytest.mark.slow
TASK = "tool_use_fidelity"
CASES = ("calendar-0004", "shop-0006", "bank-0010", "shipping-0008", "mt-calendar-0008")
N = len(CASES)
COMMON = ["--limit", str(N), "--batch_size", str(N)]


def _toolfid(args: list[str], home: Path):
    """``toolfid ARGS`` through the CLI's entry point, in this process, with ``TOOLFID_HOME=home``."""
    return toolfid_here(args, home)


def _cases_file(path: Path) -> Path:
    """The default set with :data:`CASES` moved to the front (``--limit N`` scores just them): every case keeps
    the prompt it has in the default set — plain-v3 takes each tool's example call from the other cases of the
    file, so the whole set stays in it (checked here, example by example)."""
    from lm_eval_toolfid.cases.bundled import default_cases_path
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.plain import ExampleIndex

    lines = [x for x in default_cases_path().read_text(encoding="utf-8").splitlines() if x.strip()]
    by_id = {json.loads(x)["id"]: x for x in lines}
    path.write_text("".join(by_id[c] + "\n" for c in CASES)
                    + "".join(x + "\n" for x in lines if json.loads(x)["id"] not in CASES), encoding="utf-8")
    default, moved = load_cases("default"), load_cases(str(path))
    assert [c.id for c in moved[:N]] == list(CASES) and len(moved) == len(default)
    for case in moved[:N]:
        assert ExampleIndex(moved).for_case(case) == ExampleIndex(default).for_case(case), case.id
    return path


@pytest.fixture(scope="module")
def flows(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("stop-flows")
    zero = zero_lora(smollm2, root / "zero")
    home = root / "home"
    cases = _cases_file(root / "cases.jsonl")
    out: dict = {"zero": zero}
    # 1. plain lm_eval: HFLM generates to "\n###"; this base run writes the reference
    proc = lm_eval_here(f"pretrained={smollm2}", root / "plain", home, metadata={"cases": str(cases)}, task=TASK,
                        extra=COMMON)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["plain"] = read_run(root / "plain", TASK)
    # 2. toolfid lm-eval: the engine; a base run that leaves that reference alone
    proc = _toolfid(["lm-eval", "--tasks", TASK, "--model", "hf", "--model_args", f"pretrained={smollm2}",
                     "--output_path", str(root / "engine"), "--log_samples", "--device", "cpu", *COMMON,
                     "--metadata", json.dumps({"write_reference": False, "cases": str(cases)})], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["engine"] = read_run(root / "engine", TASK)
    # 3. an engine adapter run pairs with the plain lm_eval base's reference (and verifies its answers)
    proc = _toolfid(["lm-eval", "--tasks", TASK, "--model", "hf", "--model_args", f"pretrained={smollm2},peft={zero}",
                     "--output_path", str(root / "engine-zero"), "--log_samples", "--device", "cpu", *COMMON,
                     "--metadata", json.dumps({"cases": str(cases)})], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["engine-zero"] = (*read_run(root / "engine-zero", TASK), proc.stderr)
    # 4. toolfid run: base and adapter views in one process
    run = _toolfid(["run", "--base", str(smollm2), "--adapter", f"zero={zero}", "--cases", str(cases),
                    "--limit", str(N), "--output", str(root / "run"), "--batch-size", str(N)], root / "home-run")
    out["run"], out["run_dir"] = run, root / "run"
    return out


def _records(samples: list[dict]) -> dict[str, dict]:
    return {s["doc"]["id"]: (s.get("cases_scored") or s.get("fidelity_pass")) for s in samples}


def _scored(record: dict) -> tuple:
    """What a case scored: its outcome (kind, keyword), every call (name, arguments, format) and the text."""
    ft = record["ft"]
    return (ft["kind"], ft.get("keyword"), [(c.get("name"), c.get("arguments"), c.get("surface"))
                                            for c in ft.get("calls") or []], ft.get("text"))


def test_the_three_flows_score_every_case_alike(flows: dict) -> None:
    assert flows["run"].returncode == 0, flows["run"].stderr[-3000:]
    run_dir = flows["run_dir"]
    plain = _records(flows["plain"][1])
    engine = _records(flows["engine"][1])
    run = {}
    for line in (run_dir / "base" / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        run[s["doc"]["id"]] = s["cases_scored"]
    assert sorted(plain) == sorted(engine) == sorted(run) == sorted(CASES)
    assert toolfid_meta(flows["plain"][0], TASK)["prompt_style"] == "plain"
    assert toolfid_meta(flows["plain"][0], TASK)["prompt_template"] == "plain-v3"
    for cid in plain:
        assert plain[cid]["request_hash"] == engine[cid]["request_hash"] == run[cid]["request_hash"], cid
        assert _scored(plain[cid]) == _scored(engine[cid]) == _scored(run[cid]), cid
    # the engine stopped early (fewer tokens than lm-eval's generation to "\n###"), yet scored alike
    gen = toolfid_meta(flows["engine"][0], TASK)["generation"]
    assert gen["engine"] == "toolfid" and gen["rows"] == N


def test_a_plain_lm_eval_reference_pairs_with_an_engine_adapter_run(flows: dict) -> None:
    results, samples, stderr = flows["engine-zero"]
    meta = toolfid_meta(results, TASK)
    assert meta["pairing"].startswith("reference store"), meta["pairing"]
    assert meta["generation"]["draft_sources"] == {"reference": N}
    assert meta["summary"]["metrics"]["identical_output_rate"] == 1.0
    assert meta["verdict"]["label"] == "PASS", meta["verdict"]["reason"]
    plain = _records(flows["plain"][1])
    for cid, record in _records(samples).items():
        assert _scored(record) == _scored(plain[cid]), cid


def test_the_engine_on_shared_prefixes_writes_what_generate_writes_on_whole_prompts(flows: dict) -> None:
    """Issue 30 on SmolLM2's primed plain-v3 prompts (their instruction and demo are a prefix the rows share): the
    engine computes that prefix once (``toolfid lm-eval``: fewer prompt tokens computed than the rows hold), plain
    ``lm_eval`` has ``generate`` compute every prompt whole; case by case the engine's generation, up to its stop,
    is the start of ``generate``'s, and stops before it (at the end of the call, ``generate`` at ``\\n###``).
    Every case of the module: three nested calls, a flat one and a 6-turn conversation (the longest prompt)."""
    plain = {s["doc"]["id"]: s["resps"][0][0] for s in flows["plain"][1]}
    engine = {s["doc"]["id"]: s["resps"][0][0] for s in flows["engine"][1]}
    assert sorted(plain) == sorted(engine) == sorted(CASES)
    for cid in CASES:
        assert engine[cid] and plain[cid].startswith(engine[cid]), (cid, engine[cid][-80:], plain[cid][-80:])
    assert any(len(engine[cid]) < len(plain[cid]) for cid in CASES)  # the engine did stop first
    gen = toolfid_meta(flows["engine"][0], TASK)["generation"]
    assert 0 < gen["prompt_tokens_shared"] < gen["prompt_tokens"], gen
