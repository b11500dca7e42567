"""``toolfid power``: how often the verdict is wrong — P(PASS/FAIL/UNDECIDED) for n cases, the n needed,
the smallest drop caught, a grid over n × drop (text, SVG, JSON). No model; see docs/power.md."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError

DEFAULT_NS = (50, 100, 200, 268, 500, 1000)
DEFAULT_DROPS = (0.0, 0.02, 0.05, 0.1, 0.2)
PLOT_STEP = 0.005
# planning defaults, as lm_eval_toolfid.scoring.power has them (kept here so `toolfid --help` needs no numpy;
# tests/test_power.py checks they agree)
DEFAULT_DISCORDANCE = 0.04
DEFAULT_POWER = 0.8
DEFAULT_ALPHA = 0.05
N_MAX = 100_000


def _percent(x: float) -> str:
    if 0 < x < 0.0005:
        return "<0.1%"
    if 0.9995 < x < 1:
        return ">99.9%"
    return f"{100 * x:.1f}%"


def _numbers(kind: type, text: str) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers (got {text!r})") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def _config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from lm_eval_toolfid.scoring.verdict import VerdictConfig

    checks = {"--floor": (args.floor, -1.0, 0.0), "--min-base-validity": (args.min_base_validity, 0.0, 1.0),
              "--halluc-cap": (args.halluc_cap, 0.0, 1.0)}
    for flag, (value, lo, hi) in checks.items():
        if value is not None and not (math.isfinite(value) and lo <= value <= hi):
            raise ToolfidError(f"{flag} must be in [{lo:g}, {hi:g}] (got {value:g})")
    settings = {"validity_delta_floor": args.floor, "gate_mode": args.gate_mode,
                "min_base_validity": args.min_base_validity, "hallucination_cap": args.halluc_cap,
                "hallucination_gate": args.hallucination_gate}
    return VerdictConfig(**{k: v for k, v in settings.items() if v is not None})


def _scenario(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """--drop with --discordance, or --lost and --gained (one of them may come with --drop)."""
    from lm_eval_toolfid.scoring.power import DEFAULT_DISCORDANCE, Scenario

    _check_rates(args)
    h = (args.halluc_base or 0.0, args.halluc_adapter or 0.0)
    lost, gained, drop = args.lost, args.gained, args.drop
    if lost is None and gained is None:
        discordance = DEFAULT_DISCORDANCE if args.discordance is None else args.discordance
        return Scenario.with_drop(args.p, drop or 0.0, discordance, *h)
    if args.discordance is not None:
        raise ToolfidError("give --discordance (with --drop) or --lost/--gained, not both")
    if lost is None or gained is None:
        if drop is None:
            raise ToolfidError("give both --lost and --gained, or one of them with --drop")
        lost, gained = (gained + drop, gained) if lost is None else (lost, lost - drop)
    elif drop is not None and abs((lost - gained) - drop) > 1e-9:
        raise ToolfidError(f"--drop {drop:g} is not --lost − --gained ({lost - gained:g}): give two of the three")
    if gained < 0 or lost < 0:
        raise ToolfidError(f"lost {lost:g} and gained {gained:g} must both be ≥ 0")
    return Scenario(args.p, lost, gained, *h)


def _multi_turn(args: argparse.Namespace, mode: str):  # type: ignore[no-untyped-def]
    """--multi-turn SHARE (with its own --multi-turn-p/-lost/-gained, defaulting to the other cases'):
    the conversations as a stratum of their own, judged by the multi-turn gate too (Monte Carlo)."""
    from lm_eval_toolfid.scoring.power import MultiTurn, Scenario

    given = [f for f, v in (("--multi-turn-p", args.multi_turn_p), ("--multi-turn-lost", args.multi_turn_lost),
                            ("--multi-turn-gained", args.multi_turn_gained)) if v is not None]
    if args.multi_turn is None:
        if given:
            raise ToolfidError(f"{given[0]} describes the conversations: give --multi-turn SHARE too")
        return None
    if mode not in ("rates", "solve_n"):
        raise ToolfidError("--multi-turn is modelled for one setting (--n) and --solve-n, by Monte Carlo; "
                           "--solve-drop and --table model one stratum")
    for flag, value in (("--multi-turn", args.multi_turn), *((f, getattr(args, f[2:].replace("-", "_"))) for f in given)):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ToolfidError(f"{flag} must be a rate in [0, 1] (got {value:g})")
    main = _scenario(args)
    p = main.base_validity if args.multi_turn_p is None else args.multi_turn_p
    lost = main.lost if args.multi_turn_lost is None else args.multi_turn_lost
    gained = main.gained if args.multi_turn_gained is None else args.multi_turn_gained
    try:
        conv = Scenario(p, lost, gained, main.halluc_base, main.halluc_adapter)
    except ToolfidError as exc:
        raise ToolfidError(f"multi-turn cases: {exc}") from None
    return MultiTurn(args.multi_turn, conv)


def _check_rates(args: argparse.Namespace) -> None:
    """Every rate flag in [0, 1] (the drop in [-1, 1]), named in the message."""
    flags = {"--p": args.p, "--lost": args.lost, "--gained": args.gained, "--discordance": args.discordance,
             "--halluc-base": args.halluc_base, "--halluc-adapter": args.halluc_adapter}
    for flag, value in flags.items():
        if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ToolfidError(f"{flag} must be a rate in [0, 1] (got {value:g})")
    if args.drop is not None and not (math.isfinite(args.drop) and -1.0 <= args.drop <= 1.0):
        raise ToolfidError(f"--drop must be in [-1, 1] (got {args.drop:g})")


def _setting_text(config) -> str:  # type: ignore[no-untyped-def]
    return f"floor {config.validity_delta_floor:+.3f}, {config.gate_mode}"


def _n_text(n: int, n_eff: int, design_effect: float) -> str:
    return f"n={n}" + (f" (effective {n_eff}, design effect {design_effect:g})" if design_effect != 1 else "")


def _method_text(rates) -> str:  # type: ignore[no-untyped-def]
    if rates.method == "exact":
        return "(exact)"
    return f"(monte carlo, {rates.runs} runs, SE ≤ {100 * max(rates.se):.2f}%)"


def _rates_record(rates) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    record = {"pass": rates.pass_rate, "fail": rates.fail_rate, "undecided": rates.undecided_rate,
              "method": rates.method}
    if rates.method == "exact":
        record["missing"] = rates.missing
    else:
        record.update(se={"pass": rates.se[0], "fail": rates.se[1], "undecided": rates.se[2]}, runs=rates.runs)
    return record


def _check_modes(args: argparse.Namespace) -> str:
    modes = [m for m, on in (("solve_n", args.solve_n), ("solve_drop", args.solve_drop),
                             ("table", args.table or bool(args.svg))) if on]
    if len(modes) > 1:
        raise ToolfidError("ask one question: --solve-n, --solve-drop, or --table/--svg")
    mode = modes[0] if modes else "rates"
    if mode in ("rates", "solve_drop") and args.n is None:
        asker = "--solve-drop" if mode == "solve_drop" else "this question"
        raise ToolfidError(f"{asker} needs --n (the number of cases)")
    if mode in ("solve_n", "table") and args.n is not None:
        raise ToolfidError("--solve-n finds n: do not give --n" if mode == "solve_n"
                           else "--table takes its sizes from --ns: do not give --n")
    if args.n is not None and args.n < 1:
        raise ToolfidError(f"--n must be a positive number of cases (got {args.n})")
    if args.ns is not None and (mode != "table" or any(n < 1 for n in args.ns)):
        raise ToolfidError("--ns (positive sizes) is for --table/--svg")
    if args.drops is not None and mode != "table":
        raise ToolfidError("--drops is for --table/--svg")
    if mode in ("table", "solve_drop") and (args.lost is not None or args.gained is not None or args.drop is not None):
        raise ToolfidError(f"{'--table' if mode == 'table' else '--solve-drop'} varies the drop: give --discordance, "
                           "not --drop/--lost/--gained")
    if args.mc is not None and mode != "rates" and not (mode == "solve_n" and args.multi_turn is not None):
        raise ToolfidError("--mc estimates one setting (or --solve-n with --multi-turn); --solve-n, --solve-drop "
                           "and --table are exact")
    if args.mc is not None and args.mc < 1:
        raise ToolfidError(f"--mc needs a positive number of runs (got {args.mc})")
    if mode not in ("solve_n", "solve_drop") and (args.power is not None or args.alpha is not None):
        raise ToolfidError("--power and --alpha are targets for --solve-n / --solve-drop")
    if args.n_max is not None and mode != "solve_n":
        raise ToolfidError("--n-max bounds --solve-n")
    return mode


def _emit(args: argparse.Namespace, line: str, record: dict[str, Any]) -> None:
    print(json.dumps(record, indent=1) if args.json else line)


def cmd_power(args: argparse.Namespace) -> int:
    from lm_eval_toolfid.scoring import power as pw

    mode = _check_modes(args)
    config = _config(args)
    deff = 1.0 if args.design_effect is None else args.design_effect
    pw.effective_n(1, deff)  # validates the design effect
    multi = _multi_turn(args, mode)
    if mode == "rates" and multi is not None:
        scenario = _scenario(args)
        n_eff = pw.effective_n(args.n, deff)
        runs = pw.DEFAULT_RUNS if args.mc is None else args.mc
        rates = pw.simulate_rates(scenario, n_eff, config, runs=runs, seed=args.seed, multi_turn=multi)
        m = multi.count(n_eff)
        line = (f"{_n_text(args.n, n_eff, deff)}, {n_eff - m} single-turn: {scenario.describe()}; {m} multi-turn: "
                f"{multi.scenario.describe()}: PASS {_percent(rates.pass_rate)} FAIL {_percent(rates.fail_rate)} "
                f"UNDECIDED {_percent(rates.undecided_rate)} {_method_text(rates)}")
        _emit(args, line, {"question": "rates", "n": args.n, "effective_n": n_eff, "design_effect": deff,
                           "scenario": scenario.as_record(), "multi_turn": {**multi.as_record(), "cases": m},
                           "config": config.model_dump(), **_rates_record(rates)})
        return 0
    if mode == "rates":
        scenario = _scenario(args)
        n_eff = pw.effective_n(args.n, deff)
        if args.mc is not None:
            rates = pw.simulate_rates(scenario, n_eff, config, runs=args.mc, seed=args.seed)
        else:
            rates = pw.verdict_rates(scenario, n_eff, config)
        line = (f"{_n_text(args.n, n_eff, deff)}, {scenario.describe()}: PASS {_percent(rates.pass_rate)} "
                f"FAIL {_percent(rates.fail_rate)} UNDECIDED {_percent(rates.undecided_rate)} {_method_text(rates)}")
        _emit(args, line, {"question": "rates", "n": args.n, "effective_n": n_eff, "design_effect": deff,
                           "scenario": scenario.as_record(), "config": config.model_dump(), **_rates_record(rates)})
        return 0
    if mode == "solve_n":
        return _solve_n(args, config, deff, multi)
    if mode == "solve_drop":
        return _solve_drop(args, config, deff)
    return _table(args, config, deff)


def _solve_n(args: argparse.Namespace, config, deff: float, multi) -> int:  # type: ignore[no-untyped-def]
    from lm_eval_toolfid.scoring import power as pw

    scenario = _scenario(args)
    power = pw.DEFAULT_POWER if args.power is None else args.power
    alpha = pw.DEFAULT_ALPHA if args.alpha is None else args.alpha
    n_max = pw.N_MAX if args.n_max is None else args.n_max
    n_max_eff = max(1, math.floor(n_max / deff))
    if multi is None:
        plan = pw.solve_n(scenario, config, power, alpha, n_max_eff)
        what = scenario.describe()
        faithful = f"faithful: lost = gained = {scenario.faithful().lost:.3f}"
        method = "(exact)"
    else:
        runs = pw.DEFAULT_RUNS if args.mc is None else args.mc
        plan = pw.solve_n_strata(scenario, multi, config, power, alpha, n_max_eff, runs=runs, seed=args.seed)
        what = f"single-turn {scenario.describe()}; {multi.describe()}"
        faithful = (f"faithful: lost = gained = {scenario.faithful().lost:.3f} single-turn, "
                    f"{multi.scenario.faithful().lost:.3f} multi-turn")
        method = f"(monte carlo, {runs} runs per rate, the same draws at every n)"
    nominal = (lambda m: None if m is None else math.ceil(m * deff))
    record = {"question": "solve_n", "n": nominal(plan.n), "n_stable": nominal(plan.n_stable), "effective_n": plan.n,
              "design_effect": deff, "power": power, "alpha": alpha, "fail_rate": plan.fail_rate,
              "false_alarm": plan.false_alarm, "faithful_pass": plan.faithful_pass, "reason": plan.reason or None,
              "scenario": scenario.as_record(), "config": config.model_dump(),
              "method": "exact" if multi is None else "monte carlo"}
    if multi is not None:
        record.update(multi_turn={**multi.as_record(), "cases": None if plan.n is None else multi.count(plan.n)},
                      runs=plan.runs, seed=args.seed)
    if plan.n is None:
        line = (f"no n meets power {power:.0%} with false alarm ≤ {alpha:.0%} ({what}, "
                f"{_setting_text(config)}): {plan.reason}")
    else:
        line = (f"{_n_text(nominal(plan.n), plan.n, deff)}: FAIL {_percent(plan.fail_rate)} for {what}; "
                f"false alarm {_percent(plan.false_alarm)} ({faithful}); {_setting_text(config)}")
        if plan.n_stable != plan.n:
            line += f"; both hold for every n ≥ {nominal(plan.n_stable)} (sawtooth in n)"
        if plan.faithful_pass is not None:
            line += f"; a faithful adapter PASSes {_percent(plan.faithful_pass)}"
        line += f" {method}"
    _emit(args, line, record)
    return 0


def _solve_drop(args: argparse.Namespace, config, deff: float) -> int:  # type: ignore[no-untyped-def]
    from lm_eval_toolfid.scoring import power as pw

    if args.halluc_base or args.halluc_adapter:
        raise ToolfidError("--solve-drop plans the validity gate: give no hallucination rates")
    _check_rates(args)
    discordance = pw.DEFAULT_DISCORDANCE if args.discordance is None else args.discordance
    pw.Scenario.with_drop(args.p, 0.0, discordance)  # validates p and the discordance
    power = pw.DEFAULT_POWER if args.power is None else args.power
    if args.alpha is not None:
        raise ToolfidError("--alpha is a target for --solve-n")
    n_eff = pw.effective_n(args.n, deff)
    plan = pw.solve_drop(args.p, n_eff, discordance, config, power)
    record = {"question": "solve_drop", "n": args.n, "effective_n": n_eff, "design_effect": deff,
              "base_validity": args.p, "discordance": discordance, "power": power, "drop": plan.drop,
              "fail_rate": plan.fail_rate, "false_alarm": plan.false_alarm, "reason": plan.reason or None,
              "config": config.model_dump()}
    head = f"{_n_text(args.n, n_eff, deff)}, base {args.p:.2f}, discordance {discordance:.3f}, {_setting_text(config)}"
    if plan.drop is None:
        line = f"{head}: no drop is caught with power {power:.0%}: {plan.reason}"
    else:
        line = (f"{head}: the smallest drop caught with power {power:.0%} is {plan.drop:.3f} "
                f"(FAIL {_percent(plan.fail_rate)}); a faithful adapter FAILs {_percent(plan.false_alarm)} (exact)")
    _emit(args, line, record)
    return 0


def _table(args: argparse.Namespace, config, deff: float) -> int:  # type: ignore[no-untyped-def]
    from lm_eval_toolfid.scoring import power as pw

    _check_rates(args)
    ns = list(args.ns or DEFAULT_NS)
    drops = sorted(set(args.drops or DEFAULT_DROPS))
    discordance = pw.DEFAULT_DISCORDANCE if args.discordance is None else args.discordance
    h = (args.halluc_base or 0.0, args.halluc_adapter or 0.0)
    rows = pw.grid(args.p, ns, drops, discordance, config, *h, design_effect=deff)
    what = (f"base {args.p:.2f}, discordance {discordance:.3f} (drop d: lost {discordance / 2:.3f} + d, gained "
            f"{discordance / 2:.3f})" + (f", hallucination {h[0]:.3f} → {h[1]:.3f}" if any(h) else "")
            + f", {_setting_text(config)}" + (f", design effect {deff:g}" if deff != 1 else ""))
    if args.svg:
        _write_svg(Path(args.svg), args, config, ns, drops, discordance, h, deff, what)
    record = {"question": "table", "ns": ns, "drops": drops, "design_effect": deff, "base_validity": args.p,
              "discordance": discordance, "config": config.model_dump(),
              "rows": [[{"n": n, "drop": d, **_rates_record(r)} for d, r in zip(drops, row)] for n, row in zip(ns, rows)]}
    if args.json:
        print(json.dumps(record, indent=1))
    elif args.table:
        blocks = [("FAIL", "P(FAIL)")] + ([("PASS", "P(PASS)")] if config.gate_mode == "noninferiority" else [])
        for label, title in blocks:
            print(f"{title}: {what} (exact)")
            print(f"{'n':>7}" + "".join(f"{'d=' + format(d, '.3f'):>9}" for d in drops))
            for n, row in zip(ns, rows):
                print(f"{n:>7}" + "".join(f"{_percent(r.rate(label)):>9}" for r in row))
    return 0


def _write_svg(path: Path, args: argparse.Namespace, config, ns: list[int], drops: list[float], discordance: float,
               h: tuple[float, float], deff: float, what: str) -> None:  # type: ignore[no-untyped-def]
    from lm_eval_toolfid.core.fsutil import atomic_write_text
    from lm_eval_toolfid.reporting.power_chart import power_chart
    from lm_eval_toolfid.scoring import power as pw

    step = PLOT_STEP * (2 if any(h) else 1)  # every point of a hallucination plot sums over whole tables
    start, top = min(min(drops), 0.0), max(max(drops), 0.0)
    steps = int(round((top - start) / step))
    fine = sorted(set(drops) | {round(start + i * step, 6) for i in range(steps + 1)})
    fine = [d for d in fine if d <= args.p - discordance / 2 + 1e-12 and discordance / 2 + d >= -1e-12]
    if any(h):
        rows = [[r.fail_rate for r in row] for row in pw.grid(args.p, ns, fine, discordance, config, *h,
                                                               design_effect=deff)]
    else:
        rows = [[pw.fail_rate(pw.Scenario.with_drop(args.p, d, discordance), pw.effective_n(n, deff), config)
                 for d in fine] for n in ns]
    atomic_write_text(path, power_chart(ns, fine, rows, drops, what + " (exact)", config.validity_delta_floor))
    print(f"wrote {path}", file=sys.stderr)


def register(sub: argparse._SubParsersAction) -> None:
    from lm_eval_toolfid.scoring.verdict import VerdictConfig

    defaults = VerdictConfig()
    p = sub.add_parser(
        "power", help="how often the verdict is wrong: P(PASS/FAIL/UNDECIDED) for n cases, the n needed",
        description="Error rates of the verdict under the paired binomial model (docs/power.md): n independent "
                    "cases; the base is valid on a share p; the adapter loses a share of cases (lost) and gains "
                    "some (gained); drop = lost − gained. A faithful adapter has lost = gained. Exact sums "
                    "over the 2×2 tables, decided by the verdict's own rule.",
        epilog="examples: toolfid power --p 0.9 --n 268 --drop 0.10 | toolfid power --p 0.9 --drop 0.10 --solve-n | "
               "toolfid power --p 0.9 --n 268 --solve-drop | toolfid power --p 0.9 --table --svg power.svg")
    p.add_argument("--p", type=float, required=True, help="the base's validity (share of cases it gets valid)")
    p.add_argument("--n", type=int, help="number of cases (expecting a call)")
    p.add_argument("--drop", type=float, help="the adapter's net validity drop, lost − gained (default 0: faithful)")
    p.add_argument("--discordance", type=float,
                   help=f"cases a faithful adapter changes, lost + gained, split evenly; a drop adds to lost "
                        f"(default {DEFAULT_DISCORDANCE:g})")
    p.add_argument("--lost", type=float, help="share of cases valid under the base, invalid under the adapter")
    p.add_argument("--gained", type=float, help="share of cases invalid under the base, valid under the adapter")
    p.add_argument("--floor", type=float, help=f"validity_delta_floor (default {defaults.validity_delta_floor:g})")
    p.add_argument("--gate-mode", dest="gate_mode", choices=("point", "noninferiority"),
                   help=f"default {defaults.gate_mode}")
    p.add_argument("--min-base-validity", dest="min_base_validity", type=float,
                   help=f"default {defaults.min_base_validity:g}")
    p.add_argument("--halluc-base", dest="halluc_base", type=float,
                   help="share of the base's valid calls naming an undeclared tool (default 0)")
    p.add_argument("--halluc-adapter", dest="halluc_adapter", type=float,
                   help="the same for the adapter (default 0)")
    p.add_argument("--halluc-cap", dest="halluc_cap", type=float,
                   help=f"hallucination_cap (default {defaults.hallucination_cap:g})")
    p.add_argument("--hallucination-gate", dest="hallucination_gate", choices=("delta", "absolute"),
                   help=f"default {defaults.hallucination_gate}")
    p.add_argument("--multi-turn", dest="multi_turn", type=float, metavar="SHARE",
                   help="this share of the n cases are conversations (turn depth ≥ 2), gated on their own as well "
                        "(the verdict's multi-turn gate); --p/--drop/--lost/--gained then describe the other cases. "
                        "Monte Carlo (--mc runs, default 20000); with --solve-n, the n needed")
    p.add_argument("--multi-turn-p", dest="multi_turn_p", type=float,
                   help="the base's validity on the conversations (default --p)")
    p.add_argument("--multi-turn-lost", dest="multi_turn_lost", type=float,
                   help="share of conversations lost (default: the other cases' lost)")
    p.add_argument("--multi-turn-gained", dest="multi_turn_gained", type=float,
                   help="share of conversations gained (default: the other cases' gained)")
    p.add_argument("--design-effect", dest="design_effect", type=float,
                   help="variance inflation from correlated cases (e.g. by tool): the model runs at n / this "
                        "(default 1: independent cases)")
    p.add_argument("--solve-n", dest="solve_n", action="store_true",
                   help="the smallest n whose P(FAIL | drop) ≥ --power while a faithful adapter's ≤ --alpha")
    p.add_argument("--solve-drop", dest="solve_drop", action="store_true",
                   help="the smallest drop caught (FAIL) with probability ≥ --power at --n cases")
    p.add_argument("--power", type=float, help=f"target P(FAIL) for the drop (default {DEFAULT_POWER:g})")
    p.add_argument("--alpha", type=float,
                   help=f"largest false-alarm rate, P(FAIL | faithful) (default {DEFAULT_ALPHA:g})")
    p.add_argument("--n-max", dest="n_max", type=int, help=f"--solve-n searches up to this n (default {N_MAX})")
    p.add_argument("--table", action="store_true", help="a grid of rates over --ns × --drops")
    p.add_argument("--ns", type=lambda t: _numbers(int, t),
                   help=f"table rows (default {','.join(map(str, DEFAULT_NS))})")
    p.add_argument("--drops", type=lambda t: _numbers(float, t),
                   help=f"table columns (default {','.join(f'{d:g}' for d in DEFAULT_DROPS)})")
    p.add_argument("--svg", metavar="FILE", help="write the grid as a plot: P(FAIL) against the drop, one line per n")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--mc", type=int, metavar="RUNS", help="estimate by seeded Monte Carlo instead of exact sums")
    p.add_argument("--seed", type=int, default=0, help="Monte Carlo seed (default 0)")
    p.set_defaults(func=cmd_power)
