"""A run's output folder (``--output``), checked before any model loads: a folder this user can write, or one
that can be made (:func:`check_output`); every view label a name inside it (:func:`check_labels`); one writer at a
time (:func:`output_lock`: an ``fcntl`` lock the kernel releases when its process dies, so a killed run never blocks
``--resume``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Iterable, Iterator

from lm_eval_toolfid.core.errors import ToolfidError

LOCK_FILE = ".toolfid.lock"
"""In ``--output``: who writes this folder now (pid, host, start time), locked while that run lasts."""
RESERVED_LABELS = ("base", "base-again")
_LABEL = re.compile(r"[^\W_]([\w .-]*[\w.-])?")
"""A label: letters, digits, ``_``, ``.``, ``-`` and spaces; it starts with a letter or digit (never ``.``: no
``..``, no hidden folder such as the served journal's ``.served``) and ends without a space."""


def check_label(label: str) -> str:
    """``label`` when it is a name (one path component of letters, digits, ``._-`` and spaces), else one line."""
    if not _LABEL.fullmatch(label):
        raise ToolfidError(f"adapter label {label!r} is not a name: a label is one folder name inside --output "
                           "(letters, digits, '.', '_', '-' and spaces, starting with a letter or digit); name the "
                           "adapter: --adapter NAME=PATH")
    return label


def check_labels(labels: Iterable[str]) -> None:
    for label in labels:
        check_label(label)
        if label in RESERVED_LABELS:
            raise ToolfidError(f"adapter label {label!r} is reserved (the base's views); name the adapter: "
                               "--adapter NAME=PATH")


def check_output(out_dir: Path) -> Path:
    """``out_dir`` checked before any model loads, nothing made: a folder this user can write, or one that can be made
    (its nearest existing parent a folder this user can write); a file in its place or in its parents' is one line."""
    path = Path(out_dir).expanduser()
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                what = "--output" if parent == path else f"--output's parent {parent}"
                raise ToolfidError(f"{what} {parent} is a file, not a folder: give a folder for the run's views")
            if not os.access(parent, os.W_OK | os.X_OK):
                what = f"--output {path}" if parent == path else f"--output {path} cannot be made: {parent}"
                raise ToolfidError(f"{what} is not writable by this user; give a folder you can write")
            break
    return path


def make_output(out_dir: Path) -> Path:
    """``out_dir`` checked (:func:`check_output`) and made."""
    path = check_output(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolfidError(f"cannot make --output {path}: {exc.strerror or exc}; give a folder you can write") from None
    return path


def _holder(handle: object) -> str:
    try:
        info = json.loads(Path(getattr(handle, "name")).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another toolfid run"
    return f"toolfid run pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}"


@contextlib.contextmanager
def output_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir``'s lock while the block runs; a second run into the same folder refuses in one line naming
    the holder. The lock is the kernel's (``fcntl.flock`` on :data:`LOCK_FILE`): a run killed by any signal, SIGKILL
    too, holds it no longer. Where ``fcntl`` is missing (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = make_output(out_dir) / LOCK_FILE
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ToolfidError(f"--output {out_dir} is in use by {_holder(handle)}: one run writes a folder at a "
                               "time; wait for it to end, or give another --output") from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
            handle.flush()
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
