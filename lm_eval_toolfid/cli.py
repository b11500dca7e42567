"""``toolfid``: run both views in one process, print verdicts, manage fixtures and calibration."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from .bundled import fixture_paths, tasks_path
from .errors import ToolfidError, guard

FIXTURE_TASK = "tool_use_fidelity_fixture"
DEFAULT_TASK = "tool_use_fidelity"


def _metadata(args: argparse.Namespace) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if getattr(args, "metadata", None):
        try:
            meta = json.loads(args.metadata)
        except ValueError as exc:
            raise ToolfidError(f"--metadata is not valid JSON: {exc}") from None
        if not isinstance(meta, dict):
            raise ToolfidError("--metadata must be a JSON object")
    for key in ("cases", "demos", "reference_dir"):
        value = getattr(args, key, None)
        if value is not None:
            meta[key] = value
    return meta


def _adapters(specs: Sequence[str]) -> dict[str, str]:
    """``name=path`` or ``path`` (named after its folder)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec.rstrip("/")).name, spec
        if name in out or name == "base":
            raise ToolfidError(f"adapter name {name!r} used twice (or reserved); name them: --adapter NAME=PATH")
        out[name] = path
    return out


def _out_dir(args: argparse.Namespace) -> Path:
    if args.output:
        return Path(args.output)
    return Path("runs") / time.strftime("toolfid-%Y%m%dT%H%M%S")


def cmd_run(args: argparse.Namespace) -> int:
    from .report import format_table, row_from_results
    from .runner import run_views

    adapters = _adapters(args.adapter)
    out_dir = _out_dir(args)
    metadata = _metadata(args)
    if metadata.get("cases"):  # a bad case file fails in one line before any model loads
        from .cases import load_cases

        load_cases(metadata["cases"])
    session = base_view = None
    if args.null_runs:
        from .calibrate import calibrate_in_process
        from .calibration import adapter_shape
        from .runner import ModelSession, evaluate_base

        shapes = {adapter_shape(p)["hash"] for p in adapters.values()}
        if len(shapes) > 1:
            raise ToolfidError("--null-runs calibrates one adapter shape; these adapters differ in shape: "
                               "calibrate them in separate runs")
        from .calibration import adapter_update_norm, norms_agree
        norms = {name: adapter_update_norm(p) for name, p in adapters.items()}
        first_norm = next(iter(norms.values()))
        if not all(norms_agree(first_norm, v) for v in norms.values()):
            raise ToolfidError("--null-runs calibrates one adapter update norm; these adapters differ ("
                               + ", ".join(f"{k} {v:.3g}" for k, v in norms.items()) + "): run each with --null-runs")
        first = next(iter(adapters.values()))
        session = ModelSession(args.base, first, batch_size=args.batch_size)
        base_view = evaluate_base(session, args.task, metadata, out_dir)
        calib_path = out_dir / "calibration.json"
        calibrate_in_process(args.base, first, args.null_runs, calib_path, args.task, metadata, seed=args.seed,
                             session=session, run_base=False)
        metadata["calibration"] = str(calib_path)
    base_view, views = run_views(args.base, adapters, args.task, metadata, batch_size=args.batch_size,
                                 out_dir=out_dir, session=session, base_view=base_view)
    rows = [row_from_results(v.results, v.label, args.task) for v in views]
    base_row = row_from_results(base_view.results, "base", args.task)
    if args.json:
        print(json.dumps({"base": base_row.metrics, "adapters": {r.label: {"metrics": r.metrics, **r.toolfid}
                                                                   for r in rows}}, indent=2, default=str))
    else:
        print(f"\ntool_use_fidelity — base {args.base} (json_valid_rate {base_row.metric('json_valid_rate'):.3f}, "
              f"{base_row.toolfid.get('n_cases')} cases)\n")
        print(format_table(rows, base_row.metric("json_valid_rate")))
        print(f"\nresults and per-case samples: {out_dir}/")
    from .verdict import exit_code

    outcomes = [(r.verdict or {}).get("passed") for r in rows]
    worst = False if False in outcomes else (None if None in outcomes else True)
    return exit_code(worst) if args.gate else 0


def cmd_demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything the demo loads ships in the package
    paths = fixture_paths()
    args.base = paths["base"]
    args.adapter = [f"{name}={path}" for name, path in paths["adapters"].items()]  # type: ignore[union-attr]
    args.task = FIXTURE_TASK
    return cmd_run(args)


def cmd_fixtures(_: argparse.Namespace) -> int:
    print(json.dumps(fixture_paths(), indent=2))
    return 0


def cmd_tasks_path(_: argparse.Namespace) -> int:
    print(tasks_path())
    return 0


def _check_model_args(argv: list[str]) -> None:
    """Fail fast, in one line, on a missing base or a broken adapter before lm-eval loads anything."""
    from .runner import check_adapter, check_base

    for flag in ("--model_args", "--model-args"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            pairs = dict(p.partition("=")[::2] for p in argv[argv.index(flag) + 1].split(",") if "=" in p)
            if pairs.get("pretrained"):
                check_base(pairs["pretrained"])
            if pairs.get("peft"):
                check_adapter(pairs["peft"], pairs.get("pretrained"))


def cmd_lm_eval(args: argparse.Namespace) -> int:
    """``lm_eval`` with this package's task folder on the include path."""
    from lm_eval.__main__ import cli_evaluate

    argv = list(args.lm_eval_args)
    _check_model_args(argv)
    if "--include_path" not in argv and "--include-path" not in argv:
        argv += ["--include_path", str(tasks_path())]
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolfid", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show the full traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_run_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--cases", help="case file (JSONL), or 'default' / 'fixture'")
        p.add_argument("--demos", type=int, help="number of demonstrations in the prompt")
        p.add_argument("--metadata", help="extra task settings as JSON (same keys as lm_eval --metadata)")
        p.add_argument("--batch-size", default=16, type=lambda s: s if s == "auto" else int(s))
        p.add_argument("--output", help="folder for results and samples (default runs/toolfid-<time>)")
        p.add_argument("--reference-dir", dest="reference_dir", help="where base references are stored")
        p.add_argument("--null-runs", type=int, default=0, help="calibrate with K null adapters per multiplier first")
        p.add_argument("--seed", type=int, default=0, help="seed of the null adapters")
        p.add_argument("--json", action="store_true", help="print JSON instead of the table")
        p.add_argument("--gate", action="store_true", help="exit 1 if any adapter fails its verdict")

    run = sub.add_parser("run", help="evaluate base and adapter(s) in one process, print verdicts")
    run.add_argument("--base", required=True, help="base model: local dir or hub id")
    run.add_argument("--adapter", required=True, action="append", help="PEFT adapter dir, or NAME=DIR (repeatable)")
    run.add_argument("--task", default=DEFAULT_TASK)
    add_run_options(run)
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="toolfid run on the bundled fixture model and its three adapters")
    add_run_options(demo)
    demo.set_defaults(func=cmd_demo)

    sub.add_parser("fixtures", help="print the bundled fixture paths as JSON").set_defaults(func=cmd_fixtures)
    sub.add_parser("tasks-path", help="print the task folder for lm_eval --include_path").set_defaults(
        func=cmd_tasks_path)
    lm = sub.add_parser("lm-eval", help="run lm_eval with this package's tasks included", add_help=False)
    lm.add_argument("lm_eval_args", nargs=argparse.REMAINDER)
    lm.set_defaults(func=cmd_lm_eval)

    from .calibrate import add_calibration_commands

    add_calibration_commands(sub)
    from .bfcl import add_import_bfcl_command  # realcalls: toolfid import-bfcl
    from .check import add_check_command  # realcalls: toolfid check

    add_import_bfcl_command(sub)
    add_check_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = argv[:1] == ["--debug"]
    if argv[debug:debug + 1] == ["lm-eval"]:  # everything after it belongs to lm_eval, flags included
        args = argparse.Namespace(func=cmd_lm_eval, lm_eval_args=argv[debug + 1:], debug=debug)
    else:
        args = build_parser().parse_args(argv)
    return guard(args.func, args, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
