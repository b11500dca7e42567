"""vLLM command lines in ONE interpreter of ``.venv-vllm``, one after the other, as a user's commands:
``python tests/vllm_clis.py SPEC.json`` where SPEC is a list of ``{"cli": "toolfid" | "lm_eval", "argv": [...],
"out": PREFIX}``.

Each command is its console script's own entry function (``lm_eval_toolfid.cli.main``, lm-eval's
``cli_evaluate``: its parser, evaluator and ``--model vllm``) with that ``sys.argv``; its exit code, stdout and
stderr go to ``PREFIX.rc``, ``PREFIX.out`` and ``PREFIX.err``. What they share is the interpreter's imports (torch,
vLLM, lm-eval: about 13 s of CPU on these machines, paid once instead of twice; measured on the module's two
commands, 112 s of CPU instead of 123 s); each command starts its own vLLM engine, the first one let go (``gc``)
before the next starts: the process stays at about 4 GiB resident after the first (the allocator keeps the pages)
and peaks at 4.7 GiB in the second, against 3.9 GiB for either alone.

Used by tests/test_vllm.py for ``toolfid run --backend vllm``, the ``lm_eval --model vllm`` adapter run that
pairs with it and ``toolfid run --backend vllm --null-runs 1`` (any number of commands: each a step of SPEC)."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import sys
import traceback
from pathlib import Path


def run_one(cli: str, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [cli, *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if cli == "toolfid":
                from lm_eval_toolfid.cli import main

                code = main(argv)
            elif cli == "lm_eval":
                from lm_eval.__main__ import cli_evaluate

                code = cli_evaluate()
            else:
                raise SystemExit(f"unknown cli {cli!r}")
        except SystemExit as exc:  # as the console script's sys.exit would end
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - a traceback lands on stderr, exit 1, as the console script's would
            traceback.print_exc()
            code = 1
    return int(code or 0), out.getvalue(), err.getvalue()


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    for step in spec:
        code, out, err = run_one(step["cli"], [str(a) for a in step["argv"]])
        prefix = Path(step["out"])
        prefix.with_suffix(".out").write_text(out, encoding="utf-8")
        prefix.with_suffix(".err").write_text(err, encoding="utf-8")
        prefix.with_suffix(".rc").write_text(str(code), encoding="utf-8")
        gc.collect()  # the command's engine goes before the next one starts
        statm = Path("/proc/self/statm")
        rss = int(statm.read_text().split()[1]) * 4096 / 2**30 if statm.is_file() else 0.0
        print(f"vllm_clis: {step['cli']} exited {code}; {rss:.1f} GiB resident after it", file=sys.stderr)
        if code not in (0, 1, 2):
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
