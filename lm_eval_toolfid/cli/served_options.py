"""``toolfid run --server``'s connection flags: the key (``OPENAI_API_KEY``, ``--api-key-env NAME``), gateway
headers (``--header 'NAME: VALUE'``), rate-limit waits; turned into one
:class:`~lm_eval_toolfid.serving.connection.Connection` with the run's ``--concurrency``, ``--timeout`` and
``--max-retries``. Header values never reach an output: :func:`redact_argv` blanks them in the resume hint."""

from __future__ import annotations

import argparse
from typing import Sequence

from lm_eval_toolfid.serving.connection import Connection, parse_header, resolve_key

HIDDEN = "<value not shown>"


def add_served_auth_options(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    group.add_argument("--api-key-env", dest="api_key_env", metavar="NAME",
                       help="the environment variable holding the server's API key (default: OPENAI_API_KEY when "
                            "set); sent as 'Authorization: Bearer', never written anywhere")
    group.add_argument("--header", dest="headers", action="append", default=[], metavar="'NAME: VALUE'",
                       help="an extra header on every request (repeatable; a gateway's key or route); its value is "
                            "never written anywhere")
    group.add_argument("--retry-after-max", dest="retry_after_max", type=float, default=60.0, metavar="S",
                       help="the longest wait a server's Retry-After (429, 503) is honoured for (default 60 s)")
    group.add_argument("--rate-limit-wait", dest="rate_limit_wait", type=float, default=600.0, metavar="S",
                       help="how long one request may keep being refused (429, 503 with Retry-After) before the view "
                            "stops with exit 6 (default 600 s); requests in flight step down meanwhile")


def connection_from_args(args: argparse.Namespace) -> Connection:
    """The parsed flags → the :class:`Connection` every view's requests share."""
    key, source = resolve_key(None, getattr(args, "api_key_env", None))
    headers = tuple(parse_header(h) for h in getattr(args, "headers", None) or [])
    return Connection(api_key=key, key_source=source, headers=headers, timeout=float(args.timeout),
                      max_retries=int(args.max_retries), concurrency=int(args.concurrency),
                      retry_after_max=float(getattr(args, "retry_after_max", 60.0)),
                      rate_limit_wait=float(getattr(args, "rate_limit_wait", 600.0)))


def _is_header_flag(arg: str) -> bool:
    """``--header`` or an abbreviation argparse accepts for it (``--hea``...)."""
    return len(arg) >= 5 and "--header".startswith(arg)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with every ``--header`` value replaced (the resume hint prints the command line back)."""
    out, hide_next = [], False
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if hide_next:
            out.append(f"{arg.partition(':')[0].strip()}: {HIDDEN}")
            hide_next = False
        elif _is_header_flag(arg):
            out.append(arg)
            hide_next = True
        elif eq and _is_header_flag(flag):
            out.append(f"{flag}={value.partition(':')[0].strip()}: {HIDDEN}")
        else:
            out.append(arg)
    return out
