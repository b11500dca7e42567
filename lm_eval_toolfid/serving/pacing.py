"""Pacing requests to a server that refuses some: ``Retry-After`` read (seconds or an HTTP date) and capped, no
request sent while the server asked to wait, and the requests in flight stepped down while the server keeps
refusing (429, 503) and back up as it answers."""

from __future__ import annotations

import contextlib
import email.utils
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Iterator

log = logging.getLogger("lm_eval.toolfid")


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header → seconds to wait (0 or more), None when absent or unreadable. RFC 9110: a number
    of seconds, or an HTTP date (a date in the past is 0)."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        return max(0.0, seconds) if seconds == seconds and seconds != float("inf") else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    current = datetime.now(timezone.utc).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


class AdaptiveLimit:
    """At most ``limit`` requests in flight, ``maximum`` at first. A refusal halves the limit (once per round: a
    refusal of a request sent before the last step down does not step down again), down to 1; after ``limit``
    answers in a row it grows by one, back up to ``maximum``."""

    def __init__(self, maximum: int) -> None:
        self.maximum = self.limit = max(1, int(maximum))
        self.lowest = self.limit
        self.in_flight = 0
        self._round = 0
        self._streak = 0
        self._hold = 0.0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def slot(self) -> Iterator[int]:
        """Hold one of the ``limit`` places while a request is in flight (none while the server asked every
        request to wait, :meth:`hold`); yields the round it was sent in."""
        with self._cond:
            while True:
                now = time.monotonic()
                if now < self._hold:
                    self._cond.wait(self._hold - now)
                elif self.in_flight >= self.limit:
                    self._cond.wait()
                else:
                    break
            self.in_flight += 1
            sent_in = self._round
        try:
            yield sent_in
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    def refused(self, sent_in: int, status: int) -> None:
        with self._cond:
            self._streak = 0
            if sent_in != self._round or self.limit == 1:
                return
            self.limit = max(1, self.limit // 2)
            self.lowest = min(self.lowest, self.limit)
            self._round += 1
        log.info("tool_use_fidelity: the server refused a request (HTTP %d): %d in flight at most now", status,
                 self.limit)

    def hold(self, seconds: float) -> None:
        """A rate limit's ``Retry-After`` is the server's word for every request: none is sent for ``seconds``."""
        with self._cond:
            self._hold = max(self._hold, time.monotonic() + max(0.0, seconds))
            self._cond.notify_all()

    def answered(self) -> None:
        with self._cond:
            self._streak += 1
            if self.limit < self.maximum and self._streak >= self.limit:
                self.limit += 1
                self._streak = 0
                self._cond.notify_all()


def pause(seconds: float, cancel: threading.Event | None) -> bool:
    """Sleep ``seconds``; True when ``cancel`` was set meanwhile (the view is stopping)."""
    if seconds <= 0:
        return bool(cancel is not None and cancel.is_set())
    if cancel is None:
        time.sleep(seconds)
        return False
    return cancel.wait(seconds)
