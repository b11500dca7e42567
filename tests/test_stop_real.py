"""The early stop on real generations: ``answer(prefix + stopped) == answer(prefix + full)`` for every case.

*full* is the generation run on to where lm-eval's own generation ends (EOS, ``until``, the budget): what
plain ``lm_eval --model hf`` scores; *stopped* is the row up to where the engine's stop rule ended it (the
prompt's primer in front, the end of the call for single-call cases); both come from one engine run whose
rows run on past their stop (tests/stop_property.py). Every row decodes on to lm-eval's own end (up to 192
tokens) and the prompts' prefill dominates (about 8 s a SmolLM2 case, 15 s a Qwen case on one core), so the
cases are chosen for what bites, not spread:

- :data:`NESTED`: ``calendar-0004``, ``shop-0006``, ``bank-0010`` — the three cases of the first 16 where a rule
  fed the generation alone cuts SmolLM2's plain-v3 call short (issue 28: ``…"ZA"}}`` closed the arguments, not the
  call; an inner ``},`` mid-call; one ``}`` early; test_smollm2_primed_answers_… finds exactly these three).
  Arguments ending in nested objects are where a rule that counts braces wrong, or stops a token early, changes
  the scored answer. Each style's test asserts that the rule did stop some of its rows early (else it proves
  nothing).
- ``mt-calendar-0008``: a 6-turn conversation answered by one call (the history in the prompt).

SmolLM2-135M-Instruct in plain-v3 (its default: the template ignores ``tools``, so ``auto`` gives the primed
plain prompt) on all four; SmolLM2 in plain-v1, plain-v2, chat and raw (no primer: the rule is the generation's
own) on :data:`OTHERS` (bank-0010 and the conversation: where it stops early unprimed); Qwen2.5-Coder-0.5B-Instruct
in chat (its default) on :data:`QWEN_CHAT` and plain-v3 on :data:`QWEN_V3`. ``bench/bench_stop_check.py`` runs every style at 64 spread cases
and prints the same counts (docs/performance.md has the measured table: 0 differ in every style).

That the engine's tokens equal ``generate``'s is tested token for token (tests/test_engine.py,
tests/test_engine_qwen.py); the flows through the real CLIs in tests/test_stop_flows.py, which also checks SmolLM2's
plain-v3 prompts on shared prefixes against the same prompts computed whole (``generate``, in plain ``lm_eval``):
this module no longer runs them a second time without shared prefixes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .stop_property import QWEN_STYLES, SMOLLM2_STYLES, assert_property, cases_by_id, load, run_styles, summary

pytestmark = pytest.mark.slow
NESTED = ("calendar-0004", "shop-0006", "bank-0010")
"""Primed calls whose arguments end in nested objects: a generation-only rule cut them (issue 28)."""
SMOL_V3 = (*NESTED, "mt-calendar-0008")
OTHERS = ("bank-0010", "mt-calendar-0008")
"""SmolLM2's other styles (no primer): the two rows its stop rule does stop early there. Unprimed, SmolLM2 rambles
past calendar-0004's and shop-0006's calls to the 192-token budget in plain-v1, plain-v2, chat and raw (measured:
neither stopped early, 0 of 384 tokens saved), which proves nothing about the rule. Measured 2026-11-27 (1 torch
thread, these rows in one engine run): ``mt-calendar-0008`` stops early in all four styles, ``bank-0010`` in plain-v2
only; in plain-v1, chat and raw it runs to the budget unstopped (a rule firing at an inner brace would still show
there as an answer that differs)."""
QWEN_V3 = ("calendar-0004", "shop-0006")
"""Qwen's plain-v3: the two deepest nested calls (``…}}}`` and ``…]…}}}``); shop-0006 stops early."""
QWEN_CHAT = ("calendar-0004", "shop-0006", "mt-calendar-0008")
SIZES = {"plain-v3": len(SMOL_V3)}


@pytest.fixture(scope="module")
def smollm2_runs(smollm2: Path) -> dict[str, dict[str, Any]]:
    """Every style's rows in one engine run (each row with its own prompt and stop rules, scored as its style's
    alone: :func:`run_styles`): five styles' runs each decoded on to the 192-token budget one after the other,
    now their rows share the decode steps."""
    model, tok = load(smollm2)
    return run_styles(model, tok, smollm2, {name: (style, template, cases_by_id(SMOL_V3 if name == "plain-v3"
                                                                                   else OTHERS))
                                              for name, (style, template) in SMOLLM2_STYLES.items()})


@pytest.mark.parametrize("style", list(SMOLLM2_STYLES))
def test_smollm2_early_stop_never_changes_a_scored_answer(smollm2_runs: dict, style: str) -> None:
    assert_property(smollm2_runs[style], f"SmolLM2 {style}")
    assert summary(smollm2_runs[style])["cases"] == SIZES.get(style, len(OTHERS))
    assert summary(smollm2_runs[style])["stopped_early"]  # the rule did stop rows early here: the property bites


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
    """Both styles' rows in one engine run, as for SmolLM2."""
    model, tok = load(qwen_coder)
    return run_styles(model, tok, qwen_coder, {name: (style, template, cases_by_id(QWEN_CHAT if name == "chat"
                                                                                   else QWEN_V3))
                                               for name, (style, template) in QWEN_STYLES.items()})


@pytest.mark.parametrize("style", list(QWEN_STYLES))
def test_qwen_early_stop_never_changes_a_scored_answer(qwen_runs: dict, style: str) -> None:
    assert_property(qwen_runs[style], f"Qwen2.5-Coder {style}")
    assert summary(qwen_runs[style])["cases"] == len(QWEN_CHAT if style == "chat" else QWEN_V3)
    assert summary(qwen_runs[style])["stopped_early"]  # the rule did stop rows early here: the property bites
