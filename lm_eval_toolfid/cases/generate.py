"""The seeded generator of the bundled default case set (``cases/default_cases.jsonl``).

Everything the cases are made of lives in the vocabulary files ``cases/vocab/*.json`` (read by
:mod:`~lm_eval_toolfid.cases.vocabulary`; the ``README.md`` there describes them): tools — name,
description, parameter schema and a *recipe* in the small language of
:mod:`~lm_eval_toolfid.cases.recipes` that draws a request and its gold arguments — value pools,
prompt templates, and multi-turn scenarios. This module only runs them.

A single-turn case is one natural-language request, one to five OpenAI-style tool specs, the tool
that should be called and the exact arguments expected. A recipe writes every string argument
verbatim into the prompt (enum values may be paraphrased) and every number exactly as JSON writes
it; optional arguments are in the gold only when the prompt asks for them.

A multi-turn case adds a ``history`` after the first request — assistant calls, recorded tool
results, further user turns — and asks for the next step: a follow-up call using a value from a
result (``mt_follow_up``), the failed call retried with the corrected argument (``mt_retry``), a
second tool chained on the first one's answer (``mt_second_tool``), or no call because the results
answer the request (``mt_answer``). Every gold value is findable in the prompt, a user turn or a
tool result; most follow-ups need a value that only a tool result holds. Multi-turn cases come
after the single-turn ones, ids ``mt-<domain>-NNNN``, the kind in ``category``; the tools offered
are the conversation's, the expected one's, and sometimes distractors.

One ``random.Random(SEED)`` drives everything, so a rerun rewrites byte-identical files.
:func:`build_cases` draws the cases, :func:`check` validates each (the :class:`Case` model, the
argument schemas, every gold string and number recoverable from the prompt or the conversation),
and :func:`write` saves the JSONL file and its statistics (:mod:`~lm_eval_toolfid.cases.set_stats`).
``scripts/make_default_cases.py`` runs all of it.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from lm_eval_toolfid.cases.grounding import conversation_texts, unrecoverable
from lm_eval_toolfid.cases.recipes import Recipe, Redraw
from lm_eval_toolfid.cases.set_stats import stats_markdown
from lm_eval_toolfid.cases.vocabulary import ConversationScenario, Tool, Vocab, load_vocab
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.core.schema import check_tool_schema, validate_arguments

HERE = Path(__file__).resolve().parent
OUT_PATH = HERE / "default_cases.jsonl"
STATS_PATH = HERE / "default_cases_stats.md"
SEED: int = load_vocab().settings["seed"]


# --------------------------------------------------------------------------- drawing


def draw(vocab: Vocab, tool: Tool, r: random.Random) -> tuple[str, dict[str, Any]]:
    """One request for ``tool``: (prompt, gold arguments)."""
    env = _recipe(vocab, r).run(tool.recipe)
    return env["prompt"], env["args"]


def _recipe(vocab: Vocab, r: random.Random) -> Recipe:
    return Recipe(r, vocab.pools, vocab.samplers, vocab.settings["year"], vocab.blocks)


def pick_distractors(r: random.Random, vocab: Vocab, gold: Tool, k: int) -> list[Tool]:
    """``k`` other tools, same domain first, then the neighbouring domains' (shuffled per case)."""
    return _distractors(r, vocab.tools, vocab.neighbours, gold.domain, {gold.name}, k)


def _distractors(r: random.Random, tools: list[Tool], neighbours: dict[str, list[str]], domain: str,
                 used: set[str], k: int) -> list[Tool]:
    same = [t for t in tools if t.domain == domain and t.name not in used]
    near = [t for t in tools if t.domain in neighbours[domain] and t.name not in used]
    r.shuffle(same)
    r.shuffle(near)
    return (same + near)[:k]


def build_cases(r: random.Random, vocab: Vocab | None = None) -> list[dict[str, Any]]:
    """The default set's cases, as JSON-ready dicts, drawn from ``r``."""
    vocab = vocab or load_vocab()
    cfg = vocab.settings
    weights = {int(k): w for k, w in cfg["tools_offered_weights"].items()}
    cases: list[dict[str, Any]] = []
    seen_prompts: set[str] = set()
    per_domain: Counter[str] = Counter()
    for tool in vocab.tools:
        for _ in range(cfg["cases_per_tool"]):
            for _attempt in range(100):
                prompt, args = draw(vocab, tool, r)
                if prompt not in seen_prompts and len(prompt) <= cfg["max_prompt_chars"]:
                    break
            else:
                raise ToolfidError(f"{tool.name}: could not draw a fresh prompt of at most "
                                   f"{cfg['max_prompt_chars']} characters")
            seen_prompts.add(prompt)
            offered = [tool]
            if r.random() < cfg["multi_tool_share"]:
                offered += pick_distractors(r, vocab, tool, r.choices(list(weights), list(weights.values()))[0] - 1)
                r.shuffle(offered)
            per_domain[tool.domain] += 1
            cases.append({
                "id": f"{tool.domain}-{per_domain[tool.domain]:04d}",
                "prompt": prompt,
                "tools": [t.spec() for t in offered],
                "gold_tool_name": tool.name,
                "allowed_tools": [t.name for t in offered],
                "gold_arguments": args,
            })
    r.shuffle(cases)
    if vocab.scenarios:
        golds = {_gold_key(c["gold_tool_name"], c["gold_arguments"]) for c in cases}
        cases += build_conversations(r, vocab, seen_prompts, golds)
    return cases


def _gold_key(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps([name, arguments], sort_keys=True)


def draw_conversation(vocab: Vocab, scenario: ConversationScenario, r: random.Random) -> dict[str, Any]:
    """One conversation of ``scenario``: the recipe's environment (``prompt``, ``history``,
    ``expect``); a draw that a ``require`` step refuses is drawn again."""
    for _attempt in range(100):
        try:
            return _recipe(vocab, r).run(scenario.recipe)
        except Redraw:
            continue
    raise ToolfidError(f"scenario {scenario.name}: 100 draws in a row failed a 'require' step")


def build_conversations(r: random.Random, vocab: Vocab, seen_prompts: set[str],
                        golds: set[str]) -> list[dict[str, Any]]:
    """The multi-turn cases: ``cases`` draws per scenario, each prompt and gold call new to the set."""
    cfg = vocab.conversation_settings
    by_name = {t.name: t for t in vocab.all_tools}
    per_domain: Counter[str] = Counter()
    cases: list[dict[str, Any]] = []
    for scenario in vocab.scenarios:
        for _ in range(scenario.cases):
            for _attempt in range(100):
                env = draw_conversation(vocab, scenario, r)
                gold = env.get("expect")
                key = gold and _gold_key(gold["name"], gold["arguments"])
                if env["prompt"] not in seen_prompts and len(env["prompt"]) <= vocab.settings["max_prompt_chars"] \
                        and key not in golds:
                    break
            else:
                raise ToolfidError(f"scenario {scenario.name}: could not draw a fresh prompt and gold call")
            seen_prompts.add(env["prompt"])
            if key:
                golds.add(key)
            used = [c["function"]["name"] for m in env["history"] for c in m.get("tool_calls", [])]
            used = list(dict.fromkeys(used + ([gold["name"]] if gold else [])))
            offered = [by_name[name] for name in used]
            room = cfg["max_tools"] - len(offered)
            if r.random() < cfg["distractor_share"] and room > 0:
                k = min(r.choice(cfg["distractors"]), room)
                offered += _distractors(r, vocab.all_tools, vocab.neighbours, scenario.domain, set(used), k)
                r.shuffle(offered)
            per_domain[scenario.domain] += 1
            case = {
                "id": f"mt-{scenario.domain}-{per_domain[scenario.domain]:04d}",
                "category": scenario.kind,
                "prompt": env["prompt"],
                "history": env["history"],
                "tools": [t.spec() for t in offered],
                "gold_tool_name": gold["name"] if gold else None,
                "allowed_tools": [t.name for t in offered],
            }
            if gold:
                case["gold_arguments"] = gold["arguments"]
            cases.append(case)
    r.shuffle(cases)
    return cases


# --------------------------------------------------------------------------- checking


def check(cases: list[dict[str, Any]], vocab: Vocab | None = None) -> None:
    """Raise :class:`ToolfidError` listing every case that fails its checks."""
    vocab = vocab or load_vocab()
    problems: list[str] = []
    for c in cases:
        case = Case.model_validate(c)
        problems += [f"{case.id}: tool {t.name}: bad schema" for t in case.tools if check_tool_schema(t.parameters)]
        calls = [(f"history call {call.name}", call.name, call.arguments)
                 for m in case.history for call in m.tool_calls or []]
        if case.gold_tool_name is not None:
            calls.append(("gold", case.gold_tool_name, c.get("gold_arguments")))
        for what, name, arguments in calls:
            if arguments is None:
                problems.append(f"{case.id}: {what}: no arguments")
                continue
            violation = validate_arguments(arguments, case.tool(name).parameters)  # type: ignore[union-attr]
            if violation is not None:
                problems.append(f"{case.id}: {what}: {violation.keyword} at {violation.path}: {violation.message}")
        if case.history and (case.category == "mt_answer") != (case.gold_tool_name is None):
            problems.append(f"{case.id}: a {case.category} case must expect " +
                            ("no call" if case.category == "mt_answer" else "a call"))
        if case.gold_tool is not None:
            said, results = conversation_texts(case)
            where = "prompt" if not case.history else "prompt, user turns or tool results"
            problems += [f"{case.id}: not in {where}: {leaf}" for leaf in
                         unrecoverable(c["gold_arguments"], case.gold_tool.parameters, f"{said}\n{results}")]
        elif not case.history:
            problems.append(f"{case.id}: a single-turn case without a gold call")
    names = [t.name for t in vocab.all_tools]
    if len(names) != len(set(names)):
        problems.append("duplicate tool names")
    reserved = set(vocab.settings["reserved_names"]) & set(names)
    if reserved:
        problems.append(f"reserved tool names used: {sorted(reserved)}")
    if problems:
        raise ToolfidError(f"{len(problems)} generated case problem(s): " + "; ".join(problems[:20]))


# --------------------------------------------------------------------------- writing


def to_jsonl(cases: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)


def write(out_path: Path = OUT_PATH, stats_path: Path = STATS_PATH) -> str:
    """Draw, check and save the default set and its statistics; returns the statistics block."""
    cases = build_cases(random.Random(SEED))
    check(cases)
    out_path.write_text(to_jsonl(cases), encoding="utf-8")
    stats = stats_markdown(cases)
    stats_path.write_text(stats, encoding="utf-8")
    return stats
