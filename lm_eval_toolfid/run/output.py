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
import stat
import time
from pathlib import Path
from typing import Iterable, Iterator

from lm_eval_toolfid.core.errors import ToolfidError

LOCK_FILE = ".toolfid.lock"
"""In ``--output``: who writes this folder now (pid, host, start time), locked while that run lasts."""
RESERVED_LABELS = ("base", "base-again", "default", "__base__")
"""The base's views, and the names PEFT and the engine use internally (PEFT's first adapter is ``default``); compared
case-insensitively (``Base`` is ``base/`` on a case-insensitive filesystem)."""
NAME_MAX = 255
"""The longest file name most filesystems take, in bytes: a label is a folder name, and its samples' names add to it."""
_LABEL = re.compile(r"[^\W_]([\w .-]*[\w.-])?")
"""A label: letters, digits, ``_``, ``.``, ``-`` and spaces; it starts with a letter or digit (never ``.``: no
``..``, no hidden folder such as the served journal's ``.served``) and ends without a space."""


def check_label(label: str) -> str:
    """``label`` when it is a name (one path component of letters, digits, ``._-`` and spaces), else one line."""
    if not _LABEL.fullmatch(label):
        raise ToolfidError(f"adapter label {label!r} is not a name: a label is one folder name inside --output "
                           "(letters, digits, '.', '_', '-' and spaces, starting with a letter or digit); name the "
                           "adapter: --adapter NAME=PATH")
    size = len(label.encode("utf-8"))
    if size > NAME_MAX - len(".tmp") - 16:  # the store's temporary names add a suffix to the folder's files
        raise ToolfidError(f"adapter label {label[:40]!r}… is {size} bytes: a label is a folder name and must fit the "
                           f"filesystem's {NAME_MAX}-byte limit with room for the store's files (at most "
                           f"{NAME_MAX - len('.tmp') - 16}); name the adapter: --adapter NAME=PATH")
    return label


def check_labels(labels: Iterable[str]) -> None:
    for label in labels:
        check_label(label)
        if label.casefold() in RESERVED_LABELS:
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
        handle.seek(0)  # type: ignore[attr-defined]
        info = json.loads(handle.read() or "{}")  # type: ignore[attr-defined]
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
    try:  # never through a link: the lock's JSON must not land outside --output
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        what = "a link" if path.is_symlink() else "a folder" if path.is_dir() else f"not openable ({exc.strerror})"
        raise ToolfidError(f"--output {out_dir}: its lock file {path} is {what}; remove it (toolfid makes it a plain "
                           "file) and run again") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolfidError(f"--output {out_dir}: its lock file {path} is not a plain file; remove it and run again")
    with open(fd, "a+", encoding="utf-8") as handle:
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
