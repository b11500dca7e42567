"""``toolfid run``: evaluate the base and every adapter in one process, print verdicts and breakdowns."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from lm_eval_toolfid.cli.common import (
    DEFAULT_TASK,
    adapters_from,
    add_model_options,
    add_output_option,
    add_task_settings,
    metadata_from_args,
    out_dir,
    parse_adapters,
)
from lm_eval_toolfid.core.errors import EXIT_INTERRUPTED, EXIT_SERVER, EXIT_STOP_CHECK, ToolfidError
from lm_eval_toolfid.calibration.nulls import CalibrationSpec
from lm_eval_toolfid.run.output import check_labels, check_output, output_lock
from lm_eval_toolfid.run.plan import (Models, ModelOptions, RunPlan, ServedOptions, VllmOptions, check_model_options,
                                      parse_engine_args)

if TYPE_CHECKING:
    from lm_eval_toolfid.reporting.run_report import ReportOptions
    from lm_eval_toolfid.reporting.view_store import ViewResult


@dataclass(frozen=True)
class RunCommand:
    """Everything one ``toolfid run`` asks, parsed and checked before anything loads: the plan the runner executes
    (:class:`~lm_eval_toolfid.run.plan.RunPlan`), how the report is shown, and what decides the exit code."""

    plan: RunPlan
    report: ReportOptions
    gate: bool = False
    junit: str | None = None
    check_stops: int = 0
    argv: tuple[str, ...] = ()
    """The command line as given (the resume hint repeats it, served header values redacted)."""


def cmd_run(args: argparse.Namespace) -> int:
    """Plan (every argument parsed and checked), run the plan's views, report them, exit. Under a launcher
    (``torchrun``: :mod:`lm_eval_toolfid.run.ranks`) every rank runs the views on its share of the cases; rank 0
    alone holds the folder, reports and decides the exit code, which every rank returns."""
    from lm_eval_toolfid.run.ranks import barrier, from_main, join, leave, ranks_from_env

    ranks = ranks_from_env()
    command = plan_command(args)
    if ranks.several:
        if not isinstance(command.plan.models, ModelOptions):
            raise ToolfidError(f"{ranks.world} ranks: --server and --backend vllm scale with the server's or vLLM's own "
                               "parallelism (vLLM: --vllm-arg tensor_parallel_size=N or data_parallel_size in its "
                               "server); run toolfid once, without a launcher")
        join(ranks, cuda=_cuda_ranks(command.plan.models))
    try:
        if not ranks.main:
            _run_command(command, ranks)
            code = from_main(ranks, lambda: 0)
        else:
            with output_lock(command.plan.out_dir):  # one run writes a folder at a time
                code = _run_command(command, ranks)
            code = from_main(ranks, lambda: code)
        # every rank past its last collective before any tears the group down: without it rank 0 sometimes aborted
        # at exit under gloo ("terminate called without an active exception", after destroying the group)
        barrier(ranks)
        return code
    finally:
        leave(ranks)


def _cuda_ranks(models: ModelOptions) -> bool:
    """Whether the ranks run on CUDA devices (each its ``cuda:LOCAL_RANK``): NCCL between them, else gloo."""
    import torch

    return (models.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")


def _run_command(command: RunCommand, ranks: Any = None) -> int:
    from lm_eval_toolfid.reporting.progress import Progress
    from lm_eval_toolfid.run.ranks import Ranks
    from lm_eval_toolfid.run.runner import run_plan
    from lm_eval_toolfid.serving.client import ServerAuthError, ServerError

    ranks = ranks or Ranks()
    plan = command.plan
    progress = Progress(plan.progress_labels(), live=False if plan.verbose else None, enabled=ranks.main)
    progress.estimate = plan.verbose  # after the first view: the rest at its pace
    progress.ranks = ranks.world
    try:
        base_view, adapter_views = run_plan(plan, progress=progress, ranks=ranks)  # the session the models call for
    except (KeyboardInterrupt, ServerError) as exc:
        progress.close()
        _stopped(command, exc)
        if isinstance(exc, ServerAuthError):  # served: a refused key (401/403), exit 7
            return exc.exit_code
        return EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_SERVER
    if not ranks.main:  # rank 0 reports and decides the exit code
        return 0
    return _finish(command, base_view, adapter_views)


def plan_command(args: argparse.Namespace) -> RunCommand:
    """The arguments parsed and checked into one frozen record; a bad one fails here in one line, before any model
    loads (the runner still checks what needs the session: served names, vLLM ranks)."""
    source = getattr(args, "adapters_from", None)
    given = [*(args.adapter or []), *(adapters_from(source) if source else [])]
    if not given:
        raise ToolfidError("give the adapters to evaluate: --adapter [LABEL=]DIR (repeatable) or --adapters-from "
                           "DIR_OR_FILE")
    adapters = parse_adapters(given)
    if args.resume and not args.output:
        raise ToolfidError("--resume needs --output DIR: the folder of the run to resume")
    if args.limit is not None and args.limit < 1:
        raise ToolfidError("--limit must be at least 1")
    if args.check_stops < 0:
        raise ToolfidError("--check-stops must be 0 or more")
    if args.limit is not None and args.null_runs:
        raise ToolfidError("--limit cannot be combined with --null-runs: a calibration is made on the whole case set")
    out = out_dir(args.output)
    metadata = metadata_from_args(args)
    if args.check_stops:
        metadata["check_stops"] = args.check_stops
    models = _models(args)
    check_model_options(models)  # --dtype, --device
    check_labels(adapters)  # a label is a folder name inside --output
    calibration = None
    if args.null_runs:
        calibration = CalibrationSpec(runs=args.null_runs, out=out / "calibration.json", seed=args.seed)
    plan = RunPlan(base=args.base, adapters=adapters, task=args.task, metadata=metadata, models=models, out_dir=out,
                   limit=args.limit, resume=args.resume, calibration=calibration,
                   engine_check=bool(getattr(args, "engine_check", False)), verbose=args.verbose)
    if calibration is not None:  # one calibration must serve every adapter: refused before any model loads
        from lm_eval_toolfid.calibration.adapters import check_shared_calibration

        check_shared_calibration(adapters)
    from lm_eval_toolfid.reporting.run_report import ReportOptions

    report = ReportOptions(task=args.task, base=args.base, json=args.json, verbose=args.verbose,
                           breakdown=not args.no_breakdown, html=args.html)
    if metadata.get("cases"):  # a bad case file fails in one line before any model loads
        from lm_eval_toolfid.cases.load import load_cases

        load_cases(metadata["cases"])
    from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings

    # the task's settings as the task will read them (types, ranges, misspelt keys): before any model loads
    TaskSettings.from_metadata({"pretrained": args.base, **metadata})
    check_output(out)  # a folder (or one that can be made), writable: before any model loads
    return RunCommand(plan=plan, report=report, gate=args.gate, junit=args.junit, check_stops=args.check_stops,
                      argv=tuple(getattr(args, "argv", []) or []))


def _stopped(command: RunCommand, exc: BaseException) -> None:
    """A run stopped (interrupted, or the server failed): what is kept, and the command that resumes it."""
    out = command.plan.out_dir
    saved = sorted(p.parent.name for p in out.glob("*/manifest.json"))
    journaled = sorted(p.stem for p in (out / ".served").glob("*.jsonl") if p.stat().st_size)
    asked = f"; the answers so far of {', '.join(journaled)} in {out}/.served/" if journaled else ""
    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"error: {exc}"
    print(f"\ntoolfid: {why}; finished views kept in {out}/ ({', '.join(saved) or 'none yet'}){asked}. "
          f"Resume with: {_resume_hint(command.argv, out)}", file=sys.stderr)


def _resume_hint(argv_given: Sequence[str], out: Path) -> str:
    from lm_eval_toolfid.cli.served_options import redact_argv

    argv = redact_argv(list(argv_given))  # served: --header values never printed
    if "--output" not in argv and "--out" not in argv:
        argv += ["--output", str(out)]
    if "--resume" not in argv:
        argv.append("--resume")
    return "toolfid " + shlex.join(argv)


def _models(args: argparse.Namespace) -> Models:
    """How the models run: in process on the HF engine, on one vLLM engine (``--backend vllm`` and its
    ``--vllm-arg``s) or against ``--server``; an option that does not apply to the one chosen: one line."""
    backend, items = getattr(args, "backend", "hf"), getattr(args, "vllm_args", None) or []
    server = getattr(args, "server", None)
    if backend != "vllm" and items:
        raise ToolfidError("--vllm-arg applies to --backend vllm only")
    if backend == "vllm" and server:
        raise ToolfidError("--backend vllm runs the models in this process; with --server the server is the engine: "
                           "drop one of them")
    if backend == "vllm":
        for flag, value in (("--device", args.device), ("--views-together", args.views_together),
                            ("--check-stops", args.check_stops), ("--revision", getattr(args, "revision", None)),
                            ("--cuda-graphs", args.cuda_graphs)):
            if value:
                raise ToolfidError(f"{flag} does not apply to --backend vllm (vLLM places and batches the models "
                                   "itself; engine options: --vllm-arg KEY=VALUE)")
    elif server:
        for flag, value in (("--null-runs", args.null_runs), ("--device", args.device), ("--dtype", args.dtype),
                            ("--views-together", args.views_together), ("--revision", getattr(args, "revision", None)),
                            ("--cuda-graphs", args.cuda_graphs)):
            if value:
                raise ToolfidError(f"{flag} does not apply to --server (the server loads the models; calibrate in "
                                   "process with toolfid calibrate)")
        from lm_eval_toolfid.cli.served_options import connection_from_args

        from lm_eval_toolfid.pairing.served import server_url

        connection = connection_from_args(args)  # key, headers, rate limits, concurrency, timeouts
        url = server_url(server)  # resolved once: a malformed URL fails here, before anything loads
        return ServedOptions(server=url, api=args.api, tokenizer=args.tokenizer, connection=connection)
    if backend == "vllm":
        return VllmOptions(dtype=args.dtype, engine_args=parse_engine_args(items))
    return ModelOptions(batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                        views_together=args.views_together, revision=getattr(args, "revision", None),
                        cuda_graphs=args.cuda_graphs == "on")


def _finish(command: RunCommand, base_view: ViewResult, views: list[ViewResult]) -> int:
    """The run's report (:mod:`lm_eval_toolfid.reporting.run_report`), then the exit code: the gate
    (``--gate``, ``--junit``) and the stop check (``--check-stops``)."""
    from lm_eval_toolfid.reporting.run_report import report_run, stop_check_report

    runs = report_run(command.report, command.plan.out_dir, base_view, views)
    code = 0
    if command.gate or command.junit:
        from lm_eval_toolfid.reporting.gate import gate_runs

        gated = gate_runs(runs, command.junit, sys.stderr if command.report.json else None)  # --json: stdout is JSON
        code = gated if command.gate else 0
    if command.check_stops and stop_check_report(
            [("base", base_view.results), *((v.label, v.results) for v in views)], command.plan.task):
        code = EXIT_STOP_CHECK
    return code


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def add_run_options(p: argparse.ArgumentParser, adapters: bool = False, served: bool = False,
                    own: Any = None) -> dict[str, Any]:
    """The options of ``toolfid run`` / ``toolfid demo``, in argument groups (model, adapters, cases and prompt,
    speed, served, outputs, calibration, gating); returns the groups (``adapters`` / ``served``: make those groups
    too; ``own(groups)`` adds the caller's options first, so they lead the usage line)."""
    from lm_eval_toolfid.calibration.nulls import DEFAULT_MULTIPLIERS

    groups: dict[str, Any] = {"model": p.add_argument_group("model")}
    if adapters:
        groups["adapters"] = p.add_argument_group("adapters")
    groups["cases"] = cases = p.add_argument_group("cases and prompt")
    groups["speed"] = speed = p.add_argument_group("speed (same outputs)")
    if served:
        groups["served"] = p.add_argument_group(
            "served models (an OpenAI-compatible server: vLLM, SGLang, llama.cpp, transformers serve)")
    groups["outputs"] = outputs = p.add_argument_group("outputs")
    groups["calibration"] = calibration = p.add_argument_group("calibration")
    groups["gating"] = gating = p.add_argument_group("gating and checks")
    if own is not None:
        own(groups)
    add_task_settings(cases)
    cases.add_argument("--limit", type=int, metavar="N",
                       help="the first N cases only (as lm_eval --limit: the base view stores a subset reference)")
    add_model_options(groups["model"], speed=speed)
    speed.add_argument("--views-together", dest="views_together", type=positive_int, default=None, metavar="N",
                       help="decode up to N views (the base and its adapters) in one batch, each row under its own "
                            "LoRA (default: as many as memory holds; 1: one view at a time)")
    speed.add_argument("--cuda-graphs", dest="cuda_graphs", choices=("on", "off"), default=None,
                       help="on a CUDA device: capture each decode step once per batch size and replay it (same "
                            "outputs; default: off; ignored, with one line, elsewhere)")
    add_output_option(outputs, "folder for results and samples (default runs/toolfid-<time>)")
    outputs.add_argument("--log_samples", "--log-samples", dest="log_samples", action="store_true",
                         help="accepted as in lm_eval: toolfid always writes every view's per-case samples "
                              "(pairing reads them)")
    outputs.add_argument("--json", action="store_true", help="print JSON instead of the table (stdout)")
    outputs.add_argument("--html", metavar="FILE", help="also write the self-contained HTML report")
    outputs.add_argument("--resume", action="store_true",
                         help="with --output DIR: reuse views already saved there for the same base, adapter, task "
                              "and settings; run only the rest")
    outputs.add_argument("--verbose", action="store_true",
                         help="show how the views' tokens were obtained (verification, drafting, views decoded "
                              "together, near ties), lm-eval's own progress bars and INFO logs")
    outputs.add_argument("--no-breakdown", action="store_true", help="print only the verdict table")
    mult = ", ".join(f"{m:g}" for m in DEFAULT_MULTIPLIERS)
    calibration.add_argument("--null-runs", type=int, default=0, metavar="K",
                             help=f"calibrate first: K null adapters shaped like the first adapter at each update-norm "
                                  f"multiplier ({mult}), so {len(DEFAULT_MULTIPLIERS)}×K more views over every case; "
                                  "gives the z column (default 0: no calibration)")
    calibration.add_argument("--seed", type=int, default=0, help="seed of the null adapters (default %(default)s)")
    gating.add_argument("--gate", action="store_true",
                        help="exit 1 if any adapter fails its verdict, 2 if any is undecided (and none failed)")
    gating.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testcase per adapter × gate)")
    gating.add_argument("--engine-check", dest="engine_check", action="store_true",
                        help="run the base a second time after the other views and report how many outputs the "
                             "engine itself changes (batched engines and servers may not repeat themselves); where "
                             "it changes any, each adapter's verdict says how many of its changes those are")
    gating.add_argument("--check-stops", dest="check_stops", type=int, default=0, metavar="N",
                        help="decode N cases of each view on past the early stop at the end of the call and check "
                             "that no scored answer changes; exit 3 if one does (metadata key check_stops)")
    return groups


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="evaluate base and adapter(s) in one process, print verdicts",
                       description="Load the base once, run the task on the base and on every adapter, "
                                   "print the verdict table and breakdowns.")

    def own(groups: dict[str, Any]) -> None:
        groups["model"].add_argument("--base", required=True,
                                     help="base model: local dir or hub id (with --server: its served name)")
        groups["model"].add_argument("--revision", metavar="R",
                                     help="a hub base's revision: branch, tag or commit (as lm_eval's revision=; the "
                                          "base's identity records the commit it resolves to). --backend vllm: "
                                          "--vllm-arg revision=R")
        groups["adapters"].add_argument("--adapter", action="append",
                                        help="PEFT adapter dir, or NAME=DIR (repeatable); with --server: a served "
                                             "model name, or LABEL=NAME")
        groups["adapters"].add_argument("--adapters-from", dest="adapters_from", metavar="DIR_OR_FILE",
                                        help="many adapters at once: a folder whose subfolders are PEFT adapters "
                                             "(each named after its folder), or a file of LABEL=PATH lines ('-': "
                                             "stdin); with --adapter, both")
        groups["cases"].add_argument("--task", default=DEFAULT_TASK, help="task name (default %(default)s)")
        groups["model"].add_argument("--backend", choices=("hf", "vllm"), default="hf",
                                     help="hf: the project's engine on transformers + PEFT (default); vllm: the base "
                                          "and every adapter in one vLLM engine in this process (pip install vllm), "
                                          "every view's requests in one batch, each with its own LoRARequest")
        groups["model"].add_argument("--vllm-arg", dest="vllm_args", action="append", default=[],
                                     metavar="KEY=VALUE",
                                     help="with --backend vllm: an engine argument, as in lm_eval --model vllm "
                                          "--model_args (repeatable), e.g. tensor_parallel_size=2, max_loras=4, "
                                          "max_lora_rank=64 (default: 16, or the smallest that fits the adapters), "
                                          "gpu_memory_utilization=0.8, max_model_len=4096, enforce_eager=True. "
                                          "Each view records them: `lm_eval --model vllm --model_args "
                                          "pretrained=BASE,enable_lora=True,max_lora_rank=R,<the same args>,"
                                          "lora_local_path=A` pairs with this run's base")

    served = add_run_options(p, adapters=True, served=True, own=own)["served"]
    served.add_argument("--server", metavar="URL",
                        help="evaluate the models this server serves (e.g. http://127.0.0.1:8000); --base and "
                             "--adapter are then served model names")
    served.add_argument("--api", choices=("completions", "chat"), default="completions",
                        help="completions: the prompt the task renders, as in process (default); chat: the "
                             "conversation and the case's tools= to /v1/chat/completions, scored from what comes "
                             "back (tool_calls or text)")
    served.add_argument("--concurrency", type=int, default=8, metavar="N", help="requests in flight (default 8)")
    served.add_argument("--tokenizer", help="the models' tokenizer (local folder or hub id) where the base's served "
                                            "name is not a local folder: the chat style renders with it")
    served.add_argument("--timeout", type=float, default=300.0, metavar="S", help="seconds per request (default 300)")
    served.add_argument("--max-retries", dest="max_retries", type=int, default=3, metavar="N",
                        help="retries of a request the server fails (5xx, 429, timeouts, refused connections; "
                             "default 3); then the view stops, its answers kept for --resume (exit 6)")
    from lm_eval_toolfid.cli.served_options import add_served_auth_options

    add_served_auth_options(served)  # served: --api-key-env, --header, --retry-after-max, --rate-limit-wait
    p.set_defaults(func=cmd_run)
