"""The early stop on real generations: ``answer(prefix + stopped) == answer(prefix + full)`` for every case.

*full* is the generation run on to where lm-eval's own generation ends (EOS, ``until``, the budget): what
plain ``lm_eval --model hf`` scores; *stopped* is the row up to where the engine's stop rule ended it (the
prompt's primer in front, the end of the call for single-call cases); both come from one engine run whose
rows run on past their stop (tests/stop_property.py). Spread over the default set, conversations included:

- SmolLM2-135M-Instruct, plain-v3 (its default: the template ignores ``tools``, so ``auto`` gives the primed
  plain prompt): 32 cases (24 single requests, 8 conversations). Before issue 28's fix, some of these would
  have scored otherwise (the rule stopped ``…"ZA"}}`` at the close of the arguments: 14 of 64 in the bench);
- SmolLM2 in plain-v1, plain-v2, chat and raw (no primer: the rule is the generation's own) on 8 cases each
  (6 + 2), and Qwen2.5-Coder-0.5B-Instruct in chat (its default) and plain-v3 on 8 each (6 + 2) — the
  suite's budget (these runs decode every row on to lm-eval's own end: the prompts' prefill dominates).
  ``bench/bench_stop_check.py`` runs every style at 64 cases and prints the same counts (docs/performance.md
  has the measured table: 0 differ in every style).

That the engine's tokens equal ``generate``'s is tested token for token (tests/test_engine.py,
tests/test_engine_qwen.py); the flows through the real CLIs in tests/test_stop_flows.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .stop_property import (QWEN_STYLES, SMOLLM2_STYLES, assert_property, load, run_style, same_tokens,
                            spread_cases, summary)

pytestmark = pytest.mark.slow
SIZES = {"plain-v3": (24, 8)}
"""Cases per SmolLM2 style (single requests, conversations); the other styles :data:`OTHERS`."""
OTHERS = (6, 2)
QWEN_SIZE = (6, 2)


@pytest.fixture(scope="module")
def smollm2_runs(smollm2: Path) -> dict[str, dict[str, Any]]:
    model, tok = load(smollm2)
    runs = {name: run_style(model, tok, smollm2, style, template, spread_cases(*SIZES.get(name, OTHERS)))
            for name, (style, template) in SMOLLM2_STYLES.items()}
    # issue 30: the same prompts computed whole (no shared prefixes), 8 of plain-v3's cases
    runs["plain-v3 whole"] = run_style(model, tok, smollm2, *SMOLLM2_STYLES["plain-v3"],
                                       spread_cases(*SIZES["plain-v3"])[::4], share_prefixes=False)
    return runs


@pytest.mark.parametrize("style", list(SMOLLM2_STYLES))
def test_smollm2_early_stop_never_changes_a_scored_answer(smollm2_runs: dict, style: str) -> None:
    assert_property(smollm2_runs[style], f"SmolLM2 {style}")
    assert summary(smollm2_runs[style])["cases"] == sum(SIZES.get(style, OTHERS))


def test_smollm2_primed_answers_are_where_a_generation_only_rule_fails(smollm2_runs: dict) -> None:
    """The defect this guards against is real on these generations: fed the generation alone, the rule stops
    some primed answers at the close of their arguments, and those answers then score otherwise."""
    run = smollm2_runs["plain-v3"]
    assert all(c["primed"] for c in run["cases"])  # every default case offers tools: every answer is primed
    naive = summary(run)["naive_differ"]
    assert naive, "no primed answer here that a generation-only rule would cut: pick cases with nested arguments"
    print("a generation-only rule would change:", ", ".join(naive))
    assert summary(run)["stopped_early"] > len(run["cases"]) // 2  # and the rule does stop early


@pytest.fixture(scope="module")
def qwen_runs(qwen_coder: Path) -> dict[str, dict[str, Any]]:
    model, tok = load(qwen_coder)
    cases = spread_cases(*QWEN_SIZE)
    runs = {name: run_style(model, tok, qwen_coder, style, template, cases)
            for name, (style, template) in QWEN_STYLES.items()}
    runs["chat whole"] = run_style(model, tok, qwen_coder, *QWEN_STYLES["chat"], cases, share_prefixes=False)
    return runs


@pytest.mark.parametrize("style", list(QWEN_STYLES))
def test_qwen_early_stop_never_changes_a_scored_answer(qwen_runs: dict, style: str) -> None:
    assert_property(qwen_runs[style], f"Qwen2.5-Coder {style}")


@pytest.mark.parametrize("model,shared,whole", [("smollm2", "plain-v3", "plain-v3 whole"), ("qwen", "chat", "chat whole")])
def test_shared_prefixes_give_the_tokens_of_whole_prompts(request: pytest.FixtureRequest, model: str, shared: str,
                                                          whole: str) -> None:
    """Issue 30: prompt prefixes that cases share, computed once per view, against every prompt computed whole:
    token for token the same generations (a difference only at a counted near tie), fewer prompt tokens
    computed. SmolLM2 under its primed plain-v3 prompt (8 cases), Qwen under its chat template (8); conversations
    included."""
    runs = request.getfixturevalue(f"{model}_runs")
    compared, differ = same_tokens(runs[shared], runs[whole])
    print(f"{model} {shared}: {compared} cases, {differ} differ at a near tie")
    assert compared == {"smollm2": sum(SIZES["plain-v3"]) // 4, "qwen": sum(QWEN_SIZE)}[model]
    stats, whole_stats = runs[shared]["stats"], runs[whole]["stats"]
    assert whole_stats.shared_tokens == 0 and stats.shared_tokens > 0
    assert stats.prompt_tokens < stats.prompt_tokens_total
