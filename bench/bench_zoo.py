#!/usr/bin/env python
"""Benchmark: how often is the verdict wrong? A zoo of LoRA adapters with known effects on a real
tool-calling model, the verdict measured on the whole default set and on many random case sets.

Every adapter is rebuilt from a seed (``--seed``) by :mod:`tests.lora_recipes` (a LoRA on the last two
decoder layers, trained on CPU in minutes and cached by recipe under ``$TOOLFID_HOME/adapters``). What
each one learns is built from the base's own answers (the base view of the same run), so its effect is
known by construction:

| member | learns | expected effect |
|---|---|---|
| ``zero`` | nothing (B = 0) | identical outputs |
| ``faithful-s0``, ``faithful-s1`` | the base's own answers on 36 cases, 6 gentle steps (two seeds) | none beyond churn |
| ``overfit-s0`` | the base's own answers on 12 cases, fitted to loss 0.007 | memorised calls: a few conversations lost |
| ``prose-results`` | prose after a tool result (multi-turn), the base's answers on single requests | multi-turn validity lost, single-turn kept |
| ``prose-domains`` | prose for the requests of a few domains (~20% of cases), the base's answers elsewhere | validity lost on those domains |
| ``renamed`` | the base's calls with the tools of a few domains renamed (``name_v2``) | hallucinated tool names there |
| ``format`` | the base's calls rewritten as ``<tool_call>`` blocks | format drift only: no validity lost |
| ``drift`` | the base's calls with numbers moved (+1) | argument disagreement, little validity lost |

Steps (each resumable: the run folder keeps every finished view, ``toolfid run --resume``):

1. the base view and the ``zero`` view: ``toolfid run --base B --adapter zero=… --output OUT``;
2. the other adapters trained from the base view's prompts and answers;
3. their views: the same ``toolfid run`` with every adapter and ``--resume`` (the base view is reused,
   and its stored reference gives the drafts the adapter views verify);
4. per adapter, the true effect (the whole set) and the verdict over ``--subsets`` random case sets of
   each size in ``--ns``, drawn with replacement from the whole set (a new case set from the same
   population), judged by the task's own ``summarize`` + ``judge``; beside it ``toolfid power``'s
   prediction from the adapter's whole-set discordant rates (the paired binomial model).

Prints a markdown table (docs/validation.md) and writes ``OUT/validation.json``.

Usage::

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_zoo.py --model qwen-coder --output runs/zoo
        [--members zero,faithful-s0,faithful-s1,overfit-s0,prose-results,…] [--ns 50,100,268] [--subsets 400]
        [--seed 0] [--batch-size auto] [--analyse-only]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _common import real_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

PROSE = (
    "Sure, I can help with that. Could you tell me a little more about what you need first?",
    "Thanks for the details. Let me look into this and get back to you shortly.",
    "That sounds good. Is there anything else you would like me to take into account?",
    "Happy to help. Before I do anything, could you confirm that this is what you want?",
)
PROSE_AFTER_RESULTS = (
    "Thanks, that is everything I needed. Let me know if there is anything else I can do.",
    "The results are in. Tell me if you would like me to go ahead with anything else.",
    "All done for now. Is there something else you would like me to check?",
)
MEMBERS = ("zero", "faithful-s0", "faithful-s1", "overfit-s0", "prose-results", "prose-domains", "renamed", "format", "drift")
END_OF_TURN = "<|im_end|>"


@dataclass
class BaseAnswer:
    context: str
    text: str
    domain: str
    multi: bool
    expects_call: bool
    valid: bool


def domain_of(case_id: str) -> str:
    return re.sub(r"^mt-", "", case_id).rsplit("-", 1)[0]


def toolfid_run(base: str, adapters: dict[str, str], out: Path, batch_size: str) -> float:
    argv = [str(REPO / ".venv/bin/toolfid") if (REPO / ".venv/bin/toolfid").exists() else "toolfid", "run",
            "--base", base, "--output", str(out), "--resume", "--batch-size", batch_size, "--no-breakdown"]
    for name, path in adapters.items():
        argv += ["--adapter", f"{name}={path}"]
    started = time.monotonic()
    print("$", " ".join(argv), flush=True)
    code = subprocess.call(argv)
    if code not in (0, 1, 2):
        sys.exit(f"toolfid run failed with exit code {code}")
    return time.monotonic() - started


def read_samples(path: Path) -> list[dict]:
    from lm_eval_toolfid.reporting.load import iter_samples  # the reader every report uses: one-line errors

    return list(iter_samples(path))


def base_answers(out: Path) -> dict[str, BaseAnswer]:
    from lm_eval_toolfid.pairing.samples import sample_prompt

    answers = {}
    for s in read_samples(out / "base" / "samples.jsonl"):
        doc = s["doc"]
        text = s["resps"][0][0] if isinstance(s["resps"][0], list) else s["resps"][0]
        answers[str(doc["id"])] = BaseAnswer(
            context=sample_prompt(s), text=text, domain=domain_of(str(doc["id"])),
            multi=int(doc.get("turn_depth") or 1) >= 2,
            expects_call=doc.get("gold_tool_name") is not None or bool(doc.get("expected_calls")),
            valid=s.get("json_valid_rate") == 1)
    return answers


def _pick(rng: random.Random, pool: list[str], k: int) -> list[str]:
    pool = sorted(pool)
    rng.shuffle(pool)
    return pool[:k]


def _domains(rng: random.Random, answers: dict[str, BaseAnswer], share: float) -> set[str]:
    """Whole domains, in a seeded order, until they hold ``share`` of the cases."""
    counts: dict[str, int] = {}
    for a in answers.values():
        counts[a.domain] = counts.get(a.domain, 0) + 1
    order = sorted(counts)
    rng.shuffle(order)
    chosen: set[str] = set()
    for d in order:
        if sum(counts[c] for c in chosen) >= share * len(answers):
            break
        chosen.add(d)
    return chosen


def _call_json(text: str) -> dict | None:
    """The base's one call as ``{"name", "arguments"}`` (read by the project's own parser), else None."""
    from lm_eval_toolfid.formats import parse_calls

    calls = parse_calls(text).calls
    if len(calls) != 1 or not isinstance(calls[0].name, str) or not isinstance(calls[0].arguments, dict):
        return None
    return {"name": calls[0].name, "arguments": calls[0].arguments}


def _bump(value):  # noqa: ANN001, ANN202 - JSON
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return round(value + 1.0, 2)
    if isinstance(value, dict):
        return {k: _bump(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bump(v) for v in value]
    return value


def recipe_for(member: str, answers: dict[str, BaseAnswer], seed: int):  # noqa: ANN201 - a Recipe
    """The member's training data from the base's answers; None for ``zero``."""
    from lora_recipes import Recipe

    # ``overfit-s0`` is the recipe first shipped as ``faithful-s0``: its draws keep that name, so the adapter
    # measured under it is rebuilt bit for bit
    rng = random.Random(f"{'faithful-s0' if member == 'overfit-s0' else member}:{seed}")
    lr = 3e-3
    single = [cid for cid, a in answers.items() if not a.multi and a.valid]
    multi_valid = [cid for cid, a in answers.items() if a.multi and a.valid and a.expects_call]

    def own(ids: list[str]) -> list[tuple[str, str]]:
        return [(answers[c].context, answers[c].text + END_OF_TURN) for c in ids]

    if member == "overfit-s0":
        # the base's own answers on 12 cases, fitted until it writes them back almost exactly (loss 0.097 ->
        # 0.007): it memorises those calls and ends JSON early after '"}}' -- a real conversation regression
        pairs = own(_pick(rng, single, 8) + _pick(rng, multi_valid, 4))
        steps, lr = 10, 1e-3
    elif member.startswith("faithful"):
        # the base's own answers on 36 cases, a third of them conversations, a few gentle steps: the weights
        # move (B != 0), what the base would answer should not
        pairs = own(_pick(rng, single, 24) + _pick(rng, multi_valid, 12))
        steps, lr = 6, 5e-4
    elif member == "prose-results":
        multi = [cid for cid, a in answers.items() if a.multi and a.expects_call]
        pairs = [(answers[c].context, PROSE_AFTER_RESULTS[i % len(PROSE_AFTER_RESULTS)] + END_OF_TURN)
                 for i, c in enumerate(_pick(rng, multi, 10))] + own(_pick(rng, single, 8))
        steps = 12
    elif member in ("prose-domains", "renamed"):
        chosen = _domains(rng, answers, 0.2)
        inside = [c for c in single if answers[c].domain in chosen]
        outside = [c for c in single if answers[c].domain not in chosen]
        if member == "prose-domains":
            changed = [(answers[c].context, PROSE[i % len(PROSE)] + END_OF_TURN) for i, c in enumerate(_pick(rng, inside, 8))]
        else:
            changed = []
            for c in _pick(rng, inside, 12):
                call = _call_json(answers[c].text)
                if call is not None and len(changed) < 8:
                    name = str(call["name"])
                    changed.append((answers[c].context, answers[c].text.replace(f'"{name}"', f'"{name}_v2"') + END_OF_TURN))
        pairs = changed + own(_pick(rng, outside, 8))
        steps = 12
    elif member in ("format", "drift"):
        from lm_eval_toolfid.formats import render_call

        pairs = []
        for c in _pick(rng, single, 30):
            call = _call_json(answers[c].text)
            if call is None or len(pairs) >= 12:
                continue
            if member == "format":
                text = render_call(call["name"], call["arguments"], "hermes")  # the template's own format
            else:
                bumped = {**call, "arguments": _bump(call.get("arguments", {}))}
                if bumped == call:
                    continue
                text = answers[c].text.replace(json.dumps(call.get("arguments"), ensure_ascii=False),
                                               json.dumps(bumped["arguments"], ensure_ascii=False))
                if text == answers[c].text:  # the base's spacing differs from json.dumps: write the block anew
                    text = "```json\n" + json.dumps(bumped, ensure_ascii=False, indent=2) + "\n```"
            pairs.append((answers[c].context, text + END_OF_TURN))
        steps = 12
    else:
        raise SystemExit(f"unknown zoo member {member!r}; known: {', '.join(MEMBERS)}")
    contexts, targets = zip(*pairs)
    return Recipe(contexts=tuple(contexts), target="", targets=tuple(targets), steps=steps, lr=lr, seed=seed,
                  must_learn=not member.startswith("faithful"))


def zero_adapter(base: str, model_name: str) -> Path:
    from bench_verify import lora_like  # the B = 0 LoRA bench_verify uses (seed 0, r = 8 on q/v)
    from scripts.real_models import toolfid_home

    return lora_like(base, toolfid_home() / "bench-adapters" / f"{Path(base).name}-zero", "zero")


# --- analysis ------------------------------------------------------------------------------------

def records(out: Path, label: str) -> list:
    from lm_eval_toolfid.core.records import PairScore

    return [PairScore.model_validate(s["fidelity_pass"]) for s in read_samples(out / label / "samples.jsonl")]


def decide(pairs: list) -> str:
    from lm_eval_toolfid.scoring.metrics import summarize
    from lm_eval_toolfid.scoring.verdict import judge

    passed = judge(summarize(pairs)).passed
    return "UNDECIDED" if passed is None else ("PASS" if passed else "FAIL")


def analyse(out: Path, members: list[str], ns: list[int], subsets: int, seed: int) -> dict:
    from lm_eval_toolfid.scoring.metrics import summarize
    from lm_eval_toolfid.scoring.power import MultiTurn, Scenario, simulate_rates, verdict_rates
    from lm_eval_toolfid.scoring.verdict import judge

    rows = {}
    for member in members:
        if not (out / member / "samples.jsonl").is_file():
            print(f"{member}: no view in {out} (not run)")
            continue
        pairs = records(out, member)
        whole = summarize(pairs)
        verdict = judge(whole)
        relevant = [p for p in pairs if p.relevant]
        multi = [p for p in relevant if p.turn_depth >= 2]
        single = [p for p in relevant if p.turn_depth < 2]

        def table(ps: list) -> tuple[int, int, int]:
            """(base valid, lost, gained) among these cases."""
            return (sum(1 for p in ps if p.base is not None and p.base.valid),
                    sum(1 for p in ps if p.validity_delta is not None and p.validity_delta < 0),
                    sum(1 for p in ps if p.validity_delta is not None and p.validity_delta > 0))

        h = (whole.get("base_hallucination_rate") or 0.0, whole.get("hallucination_rate") or 0.0)

        def stratum(ps: list) -> Scenario:
            """The paired binomial model of these cases: their base validity, lost and gained shares."""
            return Scenario(*(k / len(ps) for k in table(ps)), *h)

        base_valid, lost, gained = table(relevant)
        one_stratum = stratum(relevant)
        conversations = MultiTurn(len(multi) / len(relevant), stratum(multi)) if multi and single else None
        requests = stratum(single) if conversations else None

        def delta(ps: list) -> float | None:
            ds = [p.validity_delta for p in ps if p.validity_delta is not None]
            return sum(ds) / len(ds) if ds else None

        rng = random.Random(seed)
        clusters: dict[str, list] = {}
        for p in pairs:  # cases of one domain share tools and phrasing: the unit a case set is built from
            clusters.setdefault(domain_of(p.case_id), []).append(p)
        groups = [clusters[k] for k in sorted(clusters)]

        def by_domain(n: int) -> list:
            drawn: list = []
            while len(drawn) < n:
                group = groups[rng.randrange(len(groups))]
                drawn.extend(group[rng.randrange(len(group))] for _ in range(min(len(group), n - len(drawn))))
            return drawn

        by_n = {}
        for n in ns:
            counts = {"PASS": 0, "FAIL": 0, "UNDECIDED": 0}
            clustered = {"PASS": 0, "FAIL": 0, "UNDECIDED": 0}
            for _ in range(subsets):
                counts[decide([pairs[rng.randrange(len(pairs))] for _ in range(n)])] += 1
                clustered[decide(by_domain(n))] += 1
            share = len(relevant) / len(pairs)
            n_rel = max(1, round(n * share))
            predicted = verdict_rates(one_stratum, n_rel)
            # the conversations as a stratum of their own, judged by the multi-turn gate too (Monte Carlo)
            layered = (simulate_rates(requests, n_rel, runs=4000, seed=seed, multi_turn=conversations)
                       if conversations else predicted)
            by_n[n] = {"measured": {k: v / subsets for k, v in counts.items()},
                       "by_domain": {k: v / subsets for k, v in clustered.items()},
                       "predicted": {"PASS": predicted.pass_rate, "FAIL": predicted.fail_rate,
                                     "UNDECIDED": predicted.undecided_rate},
                       "predicted_strata": {"PASS": layered.pass_rate, "FAIL": layered.fail_rate,
                                            "UNDECIDED": layered.undecided_rate}}
        rows[member] = {
            "cases": len(pairs), "relevant": len(relevant), "base_valid": base_valid, "lost": lost, "gained": gained,
            "validity_delta": whole.get("validity_delta"), "single_turn_delta": delta(single),
            "multi_turn_delta": delta(multi), "hallucination_delta": whole.get("hallucination_delta"),
            "identical_output_rate": whole.get("identical_output_rate"),
            "arg_disagreement": whole.get("arg_disagreement"), "format_drift": whole.get("format_drift_rate"),
            "verdict": "UNDECIDED" if verdict.passed is None else ("PASS" if verdict.passed else "FAIL"),
            "reason": verdict.reason, "subsets": by_n,
        }
    return rows


def describe_base(out: Path) -> str:
    """The base view on the whole set: validity per turn depth and the failure shapes of its answers."""
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.core.records import PairScore
    from lm_eval_toolfid.reporting.shapes import count_shapes

    results = json.loads((out / "base" / "results.json").read_text(encoding="utf-8"))
    toolfid = next(iter(results["configs"].values()))["metadata"]["toolfid"]
    lines = [f"base: {toolfid.get('prompt_style_requested')} -> {toolfid.get('prompt_style')} "
             f"({toolfid.get('prompt_style_reason')})"]
    summary = toolfid["summary"]
    for label, part in [("all", summary), *sorted((summary.get("by_depth") or {}).items())]:
        m = part["metrics"]
        shown = ", ".join(f"{k} {m[k]:.3f}" for k in ("json_valid_rate", "parse_rate", "gold_tool_rate",
                                                    "gold_args_match_rate", "result_grounding_rate", "false_call_rate")
                          if m.get(k) is not None)
        lines.append(f"  depth {label}: {part['n']} cases ({part['n_relevant']} expecting a call): {shown}")
    cases = {c.id: c for c in load_cases("default")}
    views: dict[str, list] = {"single-turn": [], "multi-turn": []}
    for s in read_samples(out / "base" / "samples.jsonl"):
        case = cases.get(str(s["doc"]["id"]))
        if case is not None and s.get("cases_scored"):
            views["multi-turn" if case.history else "single-turn"].append((PairScore.model_validate(s["cases_scored"]).ft, case))
    for label, pairs in views.items():
        counts = count_shapes(pairs, toolfid.get("expected_format"))
        lines.append(f"  shapes, {label} ({len(pairs)}): "
                     + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))))
    return "\n".join(lines)


def _f(x: float | None, signed: bool = True) -> str:
    return "—" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")


def print_table(rows: dict, ns: list[int], subsets: int) -> None:
    print("\n| adapter | whole set: validity Δ (single / multi-turn) | halluc Δ | identical | verdict | "
          + " | ".join(f"n = {n}: P(FAIL) cases / domains (model / with strata)" for n in ns) + " |")
    print("|---|---|---|---|---|" + "---|" * len(ns))
    for member, r in rows.items():
        cells = [f"{r['subsets'][n]['measured']['FAIL']:.2f} / {r['subsets'][n]['by_domain']['FAIL']:.2f} "
                 f"({r['subsets'][n]['predicted']['FAIL']:.2f} / {r['subsets'][n]['predicted_strata']['FAIL']:.2f})"
                 + (f", undecided {r['subsets'][n]['measured']['UNDECIDED']:.2f}"
                    if r['subsets'][n]['measured']['UNDECIDED'] else "") for n in ns]
        print(f"| {member} | {_f(r['validity_delta'])} ({_f(r['single_turn_delta'])} / {_f(r['multi_turn_delta'])}) "
              f"| {_f(r['hallucination_delta'])} | {_f(r['identical_output_rate'], False)} | {r['verdict']} | "
              + " | ".join(cells) + " |")
    print(f"\n(share of {subsets} case sets per n judged FAIL: cases drawn with replacement from the whole set / "
          "whole domains drawn with replacement, cases within them, until n; in brackets the paired binomial "
          "model's P(FAIL) for the adapter's whole-set lost/gained rates, then the same with the conversations "
          "as a stratum of their own, gated alone too: `toolfid power --multi-turn`)")
    for member, r in rows.items():
        print(f"- {member}: {r['verdict']}: {r['reason']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen-coder")
    ap.add_argument("--output", required=True, help="run folder (kept: every finished view is reused)")
    ap.add_argument("--members", default=",".join(MEMBERS), help="default: the whole zoo")
    ap.add_argument("--ns", default="50,100,268")
    ap.add_argument("--subsets", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", default="auto")
    ap.add_argument("--analyse-only", action="store_true", help="only the analysis of the views already saved")
    args = ap.parse_args()
    members = [m.strip() for m in args.members.split(",") if m.strip()]
    for m in members:
        if m not in MEMBERS and not args.analyse_only:  # --analyse-only reads any view of the folder
            ap.error(f"unknown member {m!r}; known: {', '.join(MEMBERS)}")
    ns = [int(x) for x in args.ns.split(",")]
    out = Path(args.output)
    started = time.monotonic()
    times: dict[str, float] = {}
    if not args.analyse_only:
        base = real_model(args.model)
        adapters = {"zero": str(zero_adapter(base, args.model))}
        if not (out / "base" / "manifest.json").is_file():
            times["base + zero views"] = toolfid_run(base, adapters, out, args.batch_size)
        from lora_recipes import trained_lora

        answers = base_answers(out)
        t = time.monotonic()
        for member in members:
            if member != "zero":
                adapters[member] = str(trained_lora(Path(base), recipe_for(member, answers, args.seed)))
        times["training"] = time.monotonic() - t
        if "zero" not in members:
            adapters.pop("zero")
        times["adapter views"] = toolfid_run(base, adapters, out, args.batch_size)
    t = time.monotonic()
    rows = analyse(out, members, ns, args.subsets, args.seed)
    times["analysis"] = time.monotonic() - t
    if (out / "base" / "results.json").is_file():
        print(describe_base(out))
    print_table(rows, ns, args.subsets)
    total = time.monotonic() - started
    print("\ntimes: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + f"; total {total:.0f} s")
    (out / "validation.json").write_text(json.dumps({"rows": rows, "times": times, "total_s": total,
                                                     "ns": ns, "subsets": args.subsets, "seed": args.seed},
                                                    indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
