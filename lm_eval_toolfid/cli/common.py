"""Helpers shared by the command modules (argument types, --metadata, adapter specs)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Sequence

from lm_eval_toolfid.core.errors import ToolfidError

FIXTURE_TASK = "tool_use_fidelity_fixture"
DEFAULT_TASK = "tool_use_fidelity"


def batch_size(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch size must be a positive integer or 'auto' (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError("batch size must be at least 1")
    return value


def metadata_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--metadata`` JSON plus the dedicated flags (``--cases``, ``--demos``, ``--prompt-style``,
    ``--prompt-template``, ``--reference-dir``)."""
    meta: dict[str, Any] = {}
    if getattr(args, "metadata", None):
        try:
            meta = json.loads(args.metadata)
        except ValueError as exc:
            raise ToolfidError(f"--metadata is not valid JSON: {exc}") from None
        if not isinstance(meta, dict):
            raise ToolfidError("--metadata must be a JSON object")
    for key in ("cases", "demos", "prompt_style", "prompt_template", "reference_dir"):
        value = getattr(args, key, None)
        if value is not None:
            meta[key] = value
    if getattr(args, "verify", None) is not None:  # --verify / --no-verify (absent: the dtype decides)
        meta["verify"] = args.verify
    if getattr(args, "no_prefix_cache", None):
        meta["prefix_cache"] = False
    return meta


def adapters_from(source: str) -> list[str]:
    """``--adapters-from SOURCE`` as ``--adapter`` specs: a folder whose every subfolder holding an
    ``adapter_config.json`` is an adapter named after it (sorted by name), or a file (``-``: stdin) of ``LABEL=PATH``
    lines (``LABEL=NAME`` against a server; blank lines and ``#`` comments skipped; a relative path is relative to
    the file's folder)."""
    import sys

    path = Path(source).expanduser()
    if source != "-" and path.is_dir():
        found = sorted(p for p in path.iterdir() if (p / "adapter_config.json").is_file())
        if not found:
            raise ToolfidError(f"--adapters-from {source}: no subfolder holds an adapter_config.json (each adapter is "
                               "one PEFT folder inside it)")
        return [f"{p.name}={p}" for p in found]
    try:
        text = sys.stdin.read() if source == "-" else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolfidError(f"--adapters-from {source}: cannot read it ({getattr(exc, 'strerror', None) or exc}); give "
                           "a folder of adapter folders or a file of LABEL=PATH lines") from None
    here = Path.cwd() if source == "-" else path.parent
    specs = []
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        label, eq, target = (part.strip() for part in line.partition("="))
        if not eq or not label or not target:
            raise ToolfidError(f"--adapters-from {source}:{n}: {line[:80]!r} is not LABEL=PATH")
        where = Path(target).expanduser()
        if not where.is_absolute() and (here / where).exists():
            target = str(here / where)
        specs.append(f"{label}={target}")
    if not specs:
        raise ToolfidError(f"--adapters-from {source}: no LABEL=PATH line in it")
    return specs


def parse_adapters(specs: Sequence[str]) -> dict[str, str]:
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


def out_dir(output: str | None) -> Path:
    if output:
        return Path(output)
    return Path("runs") / time.strftime("toolfid-%Y%m%dT%H%M%S")


def add_task_settings(p: Any) -> None:
    """The task's settings, on a parser or an argument group."""
    p.add_argument("--cases", help="case file (JSONL), or 'default' / 'fixture'")
    p.add_argument("--demos", type=int, help="number of demonstrations in the prompt")
    p.add_argument("--prompt-style", dest="prompt_style", choices=("auto", "plain", "chat", "raw"),
                   help="how cases are shown: auto (the default of tool_use_fidelity: the model's chat template "
                        "when it renders tools, else plain), plain text, the model's chat template, or the bare "
                        "request")
    p.add_argument("--prompt-template", dest="prompt_template", choices=("plain-v1", "plain-v2", "plain-v3"),
                   help="plain style: tools as JSON Schema (v1), signatures (v2), signatures + example calls (v3)")
    p.add_argument("--metadata", help="extra task settings as JSON (same keys as lm_eval --metadata)")
    p.add_argument("--reference-dir", dest="reference_dir", help="where base references are stored")


def add_model_options(p: Any, batch_default: int | str | None = "auto", speed: Any = None) -> None:
    """``--device``/``--dtype`` on ``p``; the speed options (batch size, verification, prefix cache) on ``speed``
    (an argument group; default ``p``). ``--batch_size`` is lm-eval's spelling of ``--batch-size``."""
    model = p
    p = speed if speed is not None else p
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", default=batch_default, type=batch_size, metavar="N",
                   help="rows generated at once, or 'auto': sized from free memory and the model (on CPU at "
                        "most 64); out of memory, a view halves it and says so (default: auto)")
    verify = p.add_mutually_exclusive_group()
    verify.add_argument("--verify", dest="verify", action="store_const", const=True, default=None,
                        help="verify the base's answers in one forward pass even in float16/bfloat16, where that "
                             "rounds differently from decoding (near ties counted; metadata key verify: true). "
                             "Default: verify in float32 (same outputs, cheaper), decode in half precision")
    verify.add_argument("--no-verify", dest="verify", action="store_const", const=False,
                        help="decode every adapter view token by token, in every dtype (metadata key verify: false)")
    p.add_argument("--no-prefix-cache", dest="no_prefix_cache", action="store_const", const=True, default=None,
                   help="compute every prompt whole instead of computing the prefixes cases share once per view (same "
                        "outputs, near ties counted; metadata key prefix_cache: false)")
    model.add_argument("--device", help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    model.add_argument("--dtype", help="model dtype, e.g. float32, bfloat16, float16 (default: the model's own)")


def add_output_option(p: Any, help_text: str, required: bool = False, legacy_out: bool = False) -> None:
    """``--output`` everywhere, ``--output_path`` (lm-eval's spelling) with it; ``--out`` stays accepted (hidden: it
    was a prefix of ``--output`` before ``--output_path`` made it ambiguous). ``legacy_out`` is no longer needed."""
    p.add_argument("--output", "--output_path", dest="output", help=help_text + (" (required)" if required else ""))
    p.add_argument("--out", dest="output", help=argparse.SUPPRESS)

