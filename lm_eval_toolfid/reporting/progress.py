"""One progress display for a whole ``toolfid run`` (views × cases, tokens/s, ETA) on stderr.

lm-eval draws a tqdm bar per view and logs at INFO; :func:`quiet_lm_eval` swaps those bars for
this display and raises lm-eval's log level for the duration (``--verbose`` keeps them).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from typing import IO, Any, Iterator


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Counts cases across views; live one-line display on a TTY, one line per view otherwise."""

    def __init__(self, views: list[str], stream: IO[str] | None = None, live: bool | None = None,
                 enabled: bool = True) -> None:
        self.views = list(views)
        self.stream = stream or sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)()) if live is None else live
        self.enabled = enabled
        self.cases_per_view: int | None = None
        self.view_index = 0
        self.current = ""
        self.view_done = 0
        self.view_total = 0
        self.generated = 0  # cases generated in this run (skipped views excluded)
        self.to_generate_views = len(self.views)
        self.tokens = 0
        self.gen_seconds = 0.0
        self._ahead = 0  # cases an engine reported as they finished, before lm-eval's bar counts them
        self._live_tokens = 0  # tokens and seconds of the generation call still running
        self._live_seconds = 0.0
        self._view_t0 = 0.0
        self._last_draw = 0.0
        self.started = time.monotonic()
        self.notes: list[str] = []
        self._shown_notes: set[str] = set()
        self.together: list[list[str]] = []
        """The labels of each group of views decoded in one engine run (set by the session that runs them): the
        first view of a group does the decoding of all, the others take their answers from it."""
        self.together_verb = "decoded"
        """What a group's first view did for all (``asked``: a server's requests sent in one pool)."""
        self.ranks = 1
        """A launcher's ranks (``torchrun``): each generates its share of every view's cases."""
        self.estimate = False
        """After the first view, say how long the rest should take at its pace (``toolfid run --verbose``)."""
        self._estimated = False

    # --- events --------------------------------------------------------------------------

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        self._clear()
        print(f"toolfid: {text}", file=self.stream, flush=True)

    def view_started(self, label: str) -> None:
        self.current = label
        self.view_index += 1
        self.view_done = 0
        self._ahead = 0
        self.view_total = self.cases_per_view or 0
        self._view_t0 = time.monotonic()
        self._draw(force=True)

    def view_skipped(self, label: str, reason: str) -> None:
        self.to_generate_views -= 1
        self.view_index += 1
        self.message(f"[{self.view_index}/{len(self.views)}] {label}: {reason}")

    def requests(self, total: int) -> None:
        """A generation pass over ``total`` requests begins (one per case)."""
        self.view_total = total
        if self.cases_per_view is None:
            self.cases_per_view = total
            self.message(self.plan_line())
        self._draw(force=True)

    def plan_line(self) -> str:
        """What the run is about to do: cases per view and views, said once, when the first view's cases are
        known."""
        reused = len(self.views) - self.to_generate_views
        views = f"{self.to_generate_views} view{'' if self.to_generate_views == 1 else 's'}"
        cases = f"{self.cases_per_view} cases" if self.ranks == 1 else \
            f"{self.cases_per_view} cases a rank on {self.ranks} ranks"
        return (f"{cases} × {views} to run ({', '.join(self.views)}"
                f"{f'; {reused} reused' if reused else ''})")

    def estimate_line(self, seconds: float, cases: int) -> str | None:
        """The time the views still to run should take at the pace of the one just finished (``seconds`` for
        ``cases`` rows), or None when none is left. A rough guide, said as one: an adapter view may be faster
        (verifying the base's answers) or slower (computing its LoRA) than the base view it is measured on."""
        left = self.to_generate_views - 1  # said after the first view that ran
        if left <= 0 or cases <= 0 or not self.cases_per_view:
            return None
        per_case = seconds / cases
        return (f"estimate: {left} more view{'s' if left > 1 else ''} × {self.cases_per_view} cases ≈ "
                f"{_clock(per_case * left * self.cases_per_view)} at this view's {per_case:.3g} s per case (a rough "
                "guide: an adapter view may be faster, verifying the base's answers, or slower, computing its LoRA)")

    def _group(self, label: str) -> list[str] | None:
        """The latest group of views decoded together that ``label`` is in (None: it ran alone)."""
        return next((g for g in reversed(self.together) if label in g and len(g) > 1), None)

    def advance(self, n: int = 1) -> None:
        early = min(n, self._ahead)  # already counted by engine_row
        self._ahead -= early
        self.view_done += n - early
        group = self._group(self.current)
        if group is None or group[0] == self.current:  # a later view of a group: its rows were counted with the first
            self.generated += n - early
        self._draw()

    def engine_row(self, tokens: int, seconds: float) -> None:
        """A case finished inside a generation call that is still running (``seconds`` into it)."""
        self._ahead += 1
        self.view_done += 1
        self.generated += 1
        self._live_tokens += tokens
        self._live_seconds = seconds
        self._draw()

    def add_tokens(self, n: int, seconds: float) -> None:
        """A generation call finished: ``n`` tokens in ``seconds``."""
        self.tokens += n
        self.gen_seconds += seconds
        self._live_tokens, self._live_seconds = 0, 0.0

    def view_finished(self, label: str, n_cases: int | None = None) -> None:
        """One line per view: its cases and time; in a group decoded together, the first view's line says the
        group and the time of all of it, the others' say where they were decoded (no time of their own)."""
        seconds = time.monotonic() - self._view_t0
        rate = f", {self.tokens / self.gen_seconds:.0f} tok/s so far" if self.gen_seconds > 0 and self.tokens else ""
        n = n_cases if n_cases is not None else self.view_done
        where = f"[{self.view_index}/{len(self.views)}]"
        group = self._group(label)
        if group is None:
            self.message(f"{where} {label}: {n} cases in {_clock(seconds)}{rate}")
            if self.estimate and not self._estimated:
                self._estimated = True
                line = self.estimate_line(seconds, n)
                if line:
                    self.message(line)
        elif group[0] == label:
            self.message(f"{where} {' + '.join(group)}, {self.together_verb} together: {len(group)} × {n} cases in "
                         f"{_clock(seconds)}{rate}")
        else:
            self.message(f"{where} {label}: {n} cases ({self.together_verb} above, together with {group[0]})")
        self.flush_notes()

    def note(self, text: str) -> None:
        """A warning of the task's, shown under the line of the view it belongs to (once per text)."""
        if text not in self.notes and text not in self._shown_notes:
            self.notes.append(text)

    def flush_notes(self) -> None:
        for text in self.notes:
            self.message(f"  note: {text}")
            self._shown_notes.add(text)
        self.notes.clear()

    def close(self) -> None:
        self._clear()

    # --- drawing -------------------------------------------------------------------------

    def eta(self) -> float | None:
        if not self.cases_per_view or not self.generated:
            return None
        total = self.cases_per_view * self.to_generate_views
        elapsed = time.monotonic() - self.started
        return elapsed / self.generated * max(0, total - self.generated)

    def line(self) -> str:
        group = self._group(self.current)
        leads = group is not None and group[0] == self.current  # its engine run decodes the whole group's rows
        parts = [f"[{self.view_index}/{len(self.views)}] {' + '.join(group) if leads else self.current}"]
        if self.view_total:
            total = self.view_total * (len(group) if leads else 1)
            parts.append(f"{min(self.view_done, total)}/{total} cases")
        if self.gen_seconds + self._live_seconds > 0:
            parts.append(f"{(self.tokens + self._live_tokens) / (self.gen_seconds + self._live_seconds):.0f} tok/s")
        eta = self.eta()
        if eta is not None:
            parts.append(f"ETA {_clock(eta)}")
        return "toolfid " + " · ".join(parts)

    def _draw(self, force: bool = False) -> None:
        if not (self.enabled and self.live):
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        self.stream.write("\r\x1b[K" + self.line())
        self.stream.flush()

    def _clear(self) -> None:
        if self.enabled and self.live and self._last_draw:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


class _Bar:
    """Stands in for tqdm inside lm-eval: generation bars feed :class:`Progress`, others are silent."""

    def __init__(self, progress: Progress, iterable: Any = None, total: int | None = None, desc: str = "",
                 **_: Any) -> None:
        self.iterable = iterable
        self.progress = progress
        self.feeds = "generate_until" in (desc or "")
        if self.feeds:
            progress.requests(int(total if total is not None else len(iterable)))

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            if self.feeds:
                self.progress.advance(1)

    def update(self, n: int = 1) -> None:
        if self.feeds:
            self.progress.advance(n)

    def close(self) -> None:
        pass

    def set_description(self, *_: Any, **__: Any) -> None:
        pass

    def set_postfix(self, *_: Any, **__: Any) -> None:
        pass

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *_: Any) -> None:
        pass


class _NoteCollector(logging.Handler):
    """Turns the task's warnings into notes of the progress display (the verdict line is left to the table)."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(level=logging.WARNING)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("tool_use_fidelity verdict:"):
            return
        self.progress.note(text.removeprefix("tool_use_fidelity: "))


_TQDM_MODULES = ("lm_eval.models.huggingface", "lm_eval.api.task", "lm_eval.api.model")


@contextlib.contextmanager
def _counted_bars(progress: Progress) -> Iterator[None]:
    """lm-eval's own bars, drawn as they are; a generation bar's size is handed to ``progress`` first."""
    saved: list[tuple[Any, Any]] = []

    def counted(real: Any) -> Any:
        def bar(iterable: Any = None, *args: Any, total: int | None = None, desc: str = "", **kwargs: Any) -> Any:
            if "generate_until" in (desc or ""):
                with contextlib.suppress(TypeError):
                    progress.requests(int(total if total is not None else len(iterable)))
            return real(iterable, *args, total=total, desc=desc, **kwargs)
        return bar

    try:
        for name in _TQDM_MODULES:
            module = sys.modules.get(name)
            if module is not None and hasattr(module, "tqdm"):
                saved.append((module, module.tqdm))
                module.tqdm = counted(module.tqdm)  # type: ignore[attr-defined]
        yield
    finally:
        for module, original in saved:
            module.tqdm = original


_MUTED = ("lm_eval", "transformers", "peft", "datasets")
"""The loggers a quiet run mutes below ERROR."""


@contextlib.contextmanager
def muted_logs(verbose: bool = False) -> Iterator[None]:
    """:data:`_MUTED` at ERROR for a whole run of views (``verbose``: as they are), so that each view's
    :func:`quiet_lm_eval` finds them muted and sets nothing (``setLevel`` clears every logger's cache: a hundred
    views paid it a thousand times)."""
    if verbose:
        yield
        return
    levels = {name: logging.getLogger(name).level for name in _MUTED}
    try:
        for name in _MUTED:
            logging.getLogger(name).setLevel(logging.ERROR)
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def quiet_lm_eval(progress: Progress, verbose: bool = False) -> Iterator[None]:
    """lm-eval's bars feed ``progress`` and its INFO logs are muted, for the duration (``verbose``: its own bars and
    logs are shown, the generation bar's size still read: the run's plan line and its estimate need it)."""
    if verbose:
        with _counted_bars(progress):
            yield
        return
    saved: list[tuple[Any, Any]] = []
    loggers = {name: logging.getLogger(name).level for name in _MUTED}
    ours = logging.getLogger("lm_eval.toolfid")
    ours_state = (ours.level, ours.propagate)
    collector = _NoteCollector(progress)
    try:
        for name in _TQDM_MODULES:
            # a module nobody imported draws no bar: a served run never loads lm-eval's HF model module (and with it
            # transformers' model classes), so it is not imported here just to silence it
            module = sys.modules.get(name)
            if module is not None and hasattr(module, "tqdm"):
                saved.append((module, module.tqdm))
                module.tqdm = lambda *a, **k: _Bar(progress, *a, **k)  # type: ignore[attr-defined]
        for name, level in loggers.items():  # setLevel clears every logger's cache: only where it changes
            if level != logging.ERROR:
                logging.getLogger(name).setLevel(logging.ERROR)
        # the task's own warnings go under the view's progress line; its verdict line is the table's row
        if ours_state[0] != logging.WARNING:
            ours.setLevel(logging.WARNING)
        ours.propagate = False
        ours.addHandler(collector)
        with contextlib.suppress(Exception):
            import transformers

            transformers.utils.logging.disable_progress_bar()
        with contextlib.suppress(Exception):
            import datasets

            datasets.disable_progress_bars()
        with warnings.catch_warnings():
            # peft's note when a local base has no hub config; it changes nothing toolfid does
            warnings.filterwarnings("ignore", message="Could not find a config file", category=UserWarning)
            yield
    finally:
        for module, original in saved:
            module.tqdm = original
        for name, level in loggers.items():
            if level != logging.ERROR:
                logging.getLogger(name).setLevel(level)
        ours.removeHandler(collector)
        if ours_state[0] != logging.WARNING:
            ours.setLevel(ours_state[0])
        ours.propagate = ours_state[1]
        progress.close()


def count_tokens(lm: Any, progress: Progress) -> None:
    """Wrap ``lm._model_generate`` (HFLM) to count generated, non-padding tokens and generation time;
    an LM with a ``row_hook`` (toolfid's engine) also reports each case as it finishes."""
    if hasattr(lm, "row_hook"):
        lm.row_hook = progress.engine_row
    original = getattr(lm, "_model_generate", None)
    if original is None or getattr(original, "_toolfid_counting", False):
        return

    def generate(context: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        reused = getattr(lm, "reused_tokens", 0)
        out = original(context, *args, **kwargs)
        try:
            new = out[:, context.shape[1]:]
            pad = getattr(getattr(lm, "tokenizer", None), "pad_token_id", None)
            n = int((new != pad).sum()) if pad is not None else int(new.numel())
            n -= getattr(lm, "reused_tokens", 0) - reused  # read back from a shard, not generated here
        except Exception:  # noqa: BLE001 - counting must never break generation
            n = 0
        progress.add_tokens(n, time.monotonic() - t0)
        return out

    generate._toolfid_counting = True  # type: ignore[attr-defined]
    lm._model_generate = generate
