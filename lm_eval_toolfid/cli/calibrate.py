"""``toolfid make-null-adapters``, ``toolfid calibrate``, ``toolfid score``: the calibration commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lm_eval_toolfid.cli.common import (
    DEFAULT_TASK,
    add_model_options,
    add_output_option,
    add_task_settings,
    metadata_from_args,
)
from lm_eval_toolfid.core.errors import ToolfidError

DEFAULT_RUNS = 8
DEFAULT_SEED = 0


def _multipliers(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"multipliers must be numbers, e.g. 0.5,1,2 (got {text!r})") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("multipliers must be positive")
    return values


def cmd_make_null(args: argparse.Namespace) -> int:
    from lm_eval_toolfid.calibration.nulls import DEFAULT_MULTIPLIERS, make_null_adapters

    if not args.output:
        raise ToolfidError("make-null-adapters needs --output DIR")
    paths = make_null_adapters(args.like, args.runs, args.output, seed=args.seed,
                               multipliers=args.multipliers or DEFAULT_MULTIPLIERS, base=args.base)
    print(json.dumps([str(p) for p in paths], indent=1))
    return 0


# flags that only mean something when calibrate generates (in process); --from-results refuses them
_IN_PROCESS_FLAGS = {"base": "--base", "adapter": "--adapter", "runs": "--runs", "seed": "--seed",
                     "multipliers": "--multipliers", "null_dir": "--null-dir", "cases": "--cases",
                     "demos": "--demos", "prompt_style": "--prompt-style",
                     "prompt_template": "--prompt-template", "metadata": "--metadata", "reference_dir": "--reference-dir",
                     "batch_size": "--batch-size", "device": "--device", "dtype": "--dtype",
                     "verify": "--verify/--no-verify"}


def cmd_calibrate(args: argparse.Namespace) -> int:
    from lm_eval_toolfid.calibration.fit import DEFAULT_ALPHA, min_runs
    from lm_eval_toolfid.calibration.nulls import DEFAULT_MULTIPLIERS, CalibrationSpec
    from lm_eval_toolfid.calibration.posthoc import calibrate_from_results, scan_results
    from lm_eval_toolfid.run.calibrate import calibrate_in_process

    if not args.output:
        raise ToolfidError("calibrate needs --output FILE (where the calibration JSON goes)")
    out = Path(args.output)
    if args.from_results:
        given = [flag for dest, flag in _IN_PROCESS_FLAGS.items() if getattr(args, dest, None) is not None]
        if given:
            raise ToolfidError(f"--from-results fits existing results and cannot honour {', '.join(given)}: "
                               "drop them, or calibrate in process without --from-results")
        scan = scan_results(args.from_results, args.task)
        print(scan.describe())
        calibration = calibrate_from_results(args.from_results, out, args.task, scan=scan)
    else:
        if not (args.base and args.adapter):
            raise ToolfidError("calibrate needs --base and --adapter (or --from-results RESULTS_DIR...)")
        if args.device or args.dtype:
            raise ToolfidError("calibrate runs on the default device and dtype; --device/--dtype are for toolfid run "
                               "(use toolfid run --null-runs K to calibrate with them)")
        spec = CalibrationSpec(runs=args.runs if args.runs is not None else DEFAULT_RUNS, out=out,
                               seed=args.seed if args.seed is not None else DEFAULT_SEED,
                               multipliers=args.multipliers or DEFAULT_MULTIPLIERS,
                               null_dir=Path(args.null_dir) if args.null_dir else None)
        calibration = calibrate_in_process(args.base, args.adapter, spec, args.task, metadata_from_args(args),
                                           batch_size=args.batch_size if args.batch_size is not None else "auto")
    for mult in calibration.fits:
        f = calibration.metric_fit("json_valid_rate", float(mult))
        floor = " (std floored)" if f.floor_used else ""
        print(f"x{mult}: json_valid_rate null mean {f.mean:.3f} std {f.std_used:.4f}{floor}  "
              f"validity_delta mean {calibration.metric_fit('validity_delta', float(mult)).mean:+.3f}  n={f.n}"
              f"{_partial_note(calibration.fits[mult], f.n)}")
    k = calibration.metric_fit("json_valid_rate").n
    if 1.0 / (k + 1) > DEFAULT_ALPHA:
        print(f"note: K={k} null runs per multiplier cannot show a rank p ≤ {DEFAULT_ALPHA:g}; "
              f"use --runs ≥ {min_runs(DEFAULT_ALPHA)} for the rank p-value")
    print(f"wrote {out}")
    return 0


def _partial_note(fits: dict[str, Any], k: int) -> str:
    """The metrics fitted over fewer than the K runs (undefined in the others: e.g. no valid call), or in none."""
    notes = [f"{m} {'no fit (defined in no null run)' if f is None else f'over {f.n} of {k}'}"
             for m, f in fits.items() if f is None or f.n < k]
    return f"  ({'; '.join(notes)})" if notes else ""


def cmd_score(args: argparse.Namespace) -> int:
    from lm_eval_toolfid.calibration.posthoc import score_results
    from lm_eval_toolfid.scoring.verdict import label_of

    target, scored = score_results(args.results, args.calibration, Path(args.output) if args.output else None,
                                   alpha=args.alpha)
    verdict = scored["verdict"]
    label = verdict.get("label") or label_of(verdict["passed"])
    rank_p = scored["null"]["rank_p"]
    print(f"json_valid_z {scored['json_valid_z']:+.2f}  rank p {'—' if rank_p is None else format(rank_p, '.3g')}"
          f"  verdict {label}  " + "; ".join(verdict.get("notes", [])))
    print(f"wrote {target}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    mk = sub.add_parser("make-null-adapters", help="write random adapters shaped like a real one",
                        description="Write K random LoRA adapters per multiplier, shaped like a real adapter.")
    mk.add_argument("--like", required=True, help="the real PEFT LoRA adapter to imitate")
    mk.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="null adapters per multiplier (default %(default)s)")
    add_output_option(mk, "folder for the null adapters", required=True, legacy_out=True)
    mk.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed (the same seed writes identical files)")
    mk.add_argument("--multipliers", type=_multipliers, help="update-norm multipliers, e.g. 0.5,1,2 (default)")
    mk.add_argument("--base", help="the base model (needed for DoRA magnitudes and modules_to_save copies; "
                                   "default: the adapter config's base_model_name_or_path)")
    mk.set_defaults(func=cmd_make_null)

    cal = sub.add_parser("calibrate", help="fit the null distribution (in one process, or from lm_eval results)",
                         description="Fit the null distribution of random adapters: in one process "
                                     "(--base/--adapter), or from lm_eval results of null adapters (--from-results).")
    cal.add_argument("--base", help="base model: local dir or hub id")
    cal.add_argument("--adapter", help="the real adapter the nulls imitate")
    cal.add_argument("--runs", type=int, help=f"null adapters per multiplier (default {DEFAULT_RUNS})")
    add_output_option(cal, "calibration JSON file to write", required=True, legacy_out=True)
    cal.add_argument("--seed", type=int, help=f"seed of the null adapters (default {DEFAULT_SEED})")
    cal.add_argument("--multipliers", type=_multipliers, help="update-norm multipliers (default 0.5,1,2)")
    cal.add_argument("--task", default=DEFAULT_TASK, help="task name (default %(default)s)")
    cal.add_argument("--null-dir", help="where to write the null adapters (default: beside --output)")
    cal.add_argument("--from-results", nargs="+", metavar="PATH",
                     help="fit from lm-eval results files/folders of null-adapter runs (no generation)")
    add_task_settings(cal)
    add_model_options(cal, batch_default=None)
    cal.set_defaults(func=cmd_calibrate)

    sc = sub.add_parser("score", help="add z and the verdict to existing lm-eval results (new file)",
                        description="Add z and the verdict to an existing lm-eval results file, into a new file.")
    sc.add_argument("results", help="an lm-eval results JSON (or a folder: its newest results*.json)")
    sc.add_argument("--calibration", required=True, help="calibration JSON from toolfid calibrate")
    add_output_option(sc, "file to write (default: <results>.scored.json)")
    sc.add_argument("--alpha", type=float, default=0.05, help="level of the empirical rank p-value (default 0.05)")
    sc.set_defaults(func=cmd_score)
