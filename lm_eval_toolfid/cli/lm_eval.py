"""``toolfid lm-eval ...``: lm_eval with this package's task folder on the include path, and
``--model hf`` generating this task's requests with toolfid's engine (``toolfid-hf``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Iterator

from lm_eval_toolfid.cases.bundled import tasks_path
from lm_eval_toolfid.core.errors import EXIT_INPUT, ToolfidError


def _check_model_args(argv: list[str]) -> None:
    """Fail fast, in one line, on a missing base or a broken adapter before lm-eval loads anything."""
    from lm_eval_toolfid.calibration.adapters import check_adapter
    from lm_eval_toolfid.run.session import check_base

    for flag in ("--model_args", "--model-args"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            pairs = dict(p.partition("=")[::2] for p in argv[argv.index(flag) + 1].split(",") if "=" in p)
            if pairs.get("pretrained"):
                check_base(pairs["pretrained"], revision=pairs.get("revision") or None, gguf="gguf_file" in pairs)
            if pairs.get("peft"):
                check_adapter(pairs["peft"], pairs.get("pretrained"))


def _use_toolfid_model(argv: list[str]) -> list[str]:
    """``--model hf`` becomes ``toolfid-hf``: lm-eval's HFLM whose tool_use_fidelity requests go through
    toolfid's engine (per-row stops, and adapter runs verify the stored base answers). Every other
    task's requests, and ``--model hf-auto`` / ``huggingface``, stay lm-eval's own."""
    from lm_eval_toolfid.integrations.lm_eval import hf_model, served_model

    del hf_model, served_model  # imported for what they register with lm-eval: toolfid-hf, toolfid-server

    out = list(argv)
    for i, arg in enumerate(out):
        if arg in ("--model", "-m", "-M") and i + 1 < len(out) and out[i + 1] == "hf":
            out[i + 1] = "toolfid-hf"
        elif arg == "--model=hf":
            out[i] = "--model=toolfid-hf"
    return out


KEY_VARIABLE = "TOOLFID_MODEL_ARGS_API_KEY"


def _hide_api_key(argv: list[str]) -> list[str]:
    """``api_key=KEY`` in ``--model_args`` becomes ``api_key_env=TOOLFID_MODEL_ARGS_API_KEY`` (set to KEY in this
    process): lm-eval records its model args in results and task metadata, and a key must not reach a file."""
    import json
    import os

    out = list(argv)
    if not any(a == "toolfid-server" or a.endswith("=toolfid-server") for a in out):
        return out  # only toolfid-server reads api_key_env=
    for i, arg in enumerate(out):
        flag, eq, inline = arg.partition("=")
        if arg in ("--model_args", "--model-args") and i + 1 < len(out):
            where, text = i + 1, out[i + 1]
        elif eq and flag in ("--model_args", "--model-args"):
            where, text = i, inline
        else:
            continue
        if text.lstrip().startswith("{"):
            try:
                parsed = json.loads(text)
            except ValueError:
                continue
            if isinstance(parsed, dict) and parsed.get("api_key"):
                os.environ[KEY_VARIABLE] = str(parsed.pop("api_key"))
                parsed["api_key_env"] = KEY_VARIABLE
                text = json.dumps(parsed)
        else:
            parts = text.split(",")
            for j, part in enumerate(parts):
                name, _, value = part.partition("=")
                if name.strip() == "api_key" and value:
                    os.environ[KEY_VARIABLE] = value
                    parts[j] = f"api_key_env={KEY_VARIABLE}"
            text = ",".join(parts)
        out[where] = text if where != i else f"{flag}={text}"
    return out


def what_toolfid_adds() -> str:
    """What ``toolfid lm-eval`` changes about ``lm_eval`` (printed before lm_eval's own ``--help``)."""
    import textwrap

    items = [
        ("--include_path", f"added when not given: this package's task folder ({tasks_path()}), so --tasks "
                           "tool_use_fidelity (and tool_use_fidelity_fixture) resolve"),
        ("--tasks", "when every task named is one of this package's, lm-eval's own task folder is not indexed "
                    "(the same tasks, seconds sooner); naming any other task indexes it as lm_eval does"),
        ("--model hf", "(also -M hf, -m hf, --model=hf) runs as toolfid-hf: lm-eval's HFLM whose tool_use_fidelity "
                       "requests go through toolfid's engine (each row stops at the end of its call; an adapter "
                       "run verifies the stored base answers instead of decoding them again); other tasks' requests "
                       "stay lm-eval's own. Left out, --model is lm_eval's default (its own hf)"),
        ("--model hf-auto", "lm-eval's own HF class, untouched (also --model huggingface)"),
        ("--model toolfid-server", "an OpenAI-compatible server (vLLM, SGLang, ...); api_key= in --model_args is "
                                   "passed through the environment, never written to result files"),
        ("--model_args", "pretrained= and peft= are checked before lm_eval loads anything: a missing base, a base "
                         "not cached under HF_HUB_OFFLINE=1, or a broken adapter is one line, exit 4"),
        ("exit codes", "toolfid's (toolfid --help); lm_eval's usage errors exit 4"),
    ]
    lines = ["toolfid lm-eval: lm_eval with toolfid's tasks; all arguments pass through to lm_eval. toolfid adds:"]
    for name, text in items:
        lines += textwrap.wrap(text, width=100, initial_indent=f"  {name:<23} ", subsequent_indent=" " * 26,
                               break_on_hyphens=False)
    return "\n".join(lines) + "\n\nlm_eval's own help follows.\n"


def requested_tasks(argv: list[str]) -> list[str]:
    """The task names of ``--tasks``/``-t`` (comma- or space-separated, as lm-eval's parser takes them)."""
    names: list[str] = []
    i = 0
    while i < len(argv):
        flag, eq, inline = argv[i].partition("=")
        if flag in ("--tasks", "-t"):
            values = [inline] if eq else []
            while not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1
                values.append(argv[i])
            names += [n.strip() for v in values for n in v.split(",") if n.strip()]
        i += 1
    return names


def only_toolfid_tasks(argv: list[str]) -> bool:
    """Every task asked for is one of this package's (and none other is asked): lm-eval's own task folder (about
    14,000 YAML files, 5-15 s to index before the first case) is then not indexed, as in ``toolfid run``. A name
    outside the package, a glob, a path or a ``--config`` file keep lm-eval's whole index."""
    from lm_eval.tasks import TaskManager

    names = requested_tasks(argv)
    if not names:
        return False
    ours = set(TaskManager(include_path=str(tasks_path()), include_defaults=False).all_tasks)
    return all(name in ours for name in names)


@contextlib.contextmanager
def _toolfid_tasks_only() -> Iterator[None]:
    """lm-eval's CLI builds its ``TaskManager`` (``lm_eval.tasks.TaskManager``, looked up when it runs) without
    its default task folder, for the duration."""
    import lm_eval.tasks

    original = lm_eval.tasks.TaskManager

    class ToolfidTasksOnly(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if len(args) < 3:  # (verbosity, include_path, include_defaults, ...) unless given
                kwargs.setdefault("include_defaults", False)
            super().__init__(*args, **kwargs)

    lm_eval.tasks.TaskManager = ToolfidTasksOnly
    try:
        yield
    finally:
        lm_eval.tasks.TaskManager = original


def _check_limit(argv: list[str]) -> None:
    """``--limit`` (``-L``) selects at least one case: lm-eval takes a count >= 1 or a fraction in (0, 1); 0, a
    negative number or a word is one line, exit 4 (lm-eval itself would end in "did not find any docs")."""
    for i, arg in enumerate(argv):
        if arg in ("--limit", "-L") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--limit="):
            value = arg.split("=", 1)[1]
        else:
            continue
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not number > 0:
            raise ToolfidError(f"--limit {value} selects no case: give a number of cases (>= 1) or a fraction in "
                               "(0, 1), or drop --limit for every case")


def cmd_lm_eval(args: argparse.Namespace) -> int:
    from lm_eval.__main__ import cli_evaluate

    if any(a in ("-h", "--help") for a in args.lm_eval_args) or not args.lm_eval_args:
        print(what_toolfid_adds(), flush=True)
    argv = _hide_api_key(_use_toolfid_model(list(args.lm_eval_args)))
    _check_model_args(argv)
    _check_limit(argv)
    ours_only = False
    if "--include_path" not in argv and "--include-path" not in argv:
        argv += ["--include_path", str(tasks_path())]
        ours_only = only_toolfid_tasks(argv)
    sys.argv = ["lm_eval", *argv]
    try:
        with _toolfid_tasks_only() if ours_only else contextlib.nullcontext():
            cli_evaluate()
    except SystemExit as exc:  # lm_eval's own exits keep their code, but its usage errors are input errors
        code = exc.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            return int(getattr(exc, "toolfid_exit_code", EXIT_INPUT))  # the task's one-line error and its code
        return EXIT_INPUT if code == 2 else int(code or 0)  # argparse's 2 would read as "undecided"
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lm-eval", help="run lm_eval with this package's tasks included (all flags pass through)",
                       add_help=False)
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="arguments for lm_eval")
    p.set_defaults(func=cmd_lm_eval)
