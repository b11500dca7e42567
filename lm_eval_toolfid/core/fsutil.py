"""Durable file writes: every file toolfid writes goes through here.

A write lands whole or not at all: the text goes to a uniquely named temporary file in the
same folder (so two writers never share a temp file), is flushed to disk, then renamed over
the target (``os.replace`` is atomic on one file system). Readers see the old file or the new
one, never a torn one; two concurrent writers leave one valid file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=str(target.parent))
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a written file gets the usual mode
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, payload: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=indent, ensure_ascii=False, default=str) + "\n")


def toolfid_home() -> Path:
    """Where toolfid keeps what it makes outside a run's output: base references, prepared models
    (``$TOOLFID_HOME``, default ``~/.cache/lm_eval_toolfid``)."""
    return Path(os.environ.get("TOOLFID_HOME") or Path.home() / ".cache" / "lm_eval_toolfid").expanduser()


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) while the block runs: two processes that
    prepare the same cached folder (parallel test workers, two runs at once) take turns instead of
    writing it together. Where ``fcntl`` is missing (Windows) the block runs unlocked."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
