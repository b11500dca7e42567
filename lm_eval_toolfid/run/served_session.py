"""``toolfid run --server``: the base and every adapter as model names of one OpenAI-compatible server.

Each view is an ordinary ``simple_evaluate`` of the task on a :class:`ToolfidServerLM` (the same task, the
same scoring and pairing as ``lm_eval --model toolfid-server``); the base view writes the reference the
adapter views pair with (they name it with ``base_model``). Answers are journaled per view as they arrive
(``OUT/.served/LABEL.jsonl``): a view stopped by the server resumes with ``--resume``, asking only the rest.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.served import model_card
from lm_eval_toolfid.serving.client import list_models
from lm_eval_toolfid.serving.connection import Connection
from lm_eval_toolfid.run.session import evaluate_view
from lm_eval_toolfid.reporting.view_store import ViewResult, load_saved_view, view_manifest


class ServedSession:
    """One server, the base model name and the options every view's requests share."""

    def __init__(self, server: str, base: str, api: str = "completions", concurrency: int = 8,
                 tokenizer: str | None = None, timeout: float = 300.0, max_retries: int = 3,
                 progress: Any = None, verbose: bool = True, resume: bool = False,
                 connection: Connection | None = None) -> None:
        if concurrency < 1:
            raise ToolfidError("--concurrency must be at least 1")
        # served connection (key, headers, rate limits): one object, never in model args or manifests
        self.connection = connection or Connection(concurrency=concurrency, timeout=timeout, max_retries=max_retries)
        self.listing = list_models(server, self.connection)  # a server that is down fails here, in one line
        self.server, self.base, self.api = server, base, api
        self.progress, self.verbose, self.resume = progress, verbose, resume
        self.options = {"num_concurrent": concurrency, "timeout": timeout, "max_retries": max_retries}
        self.model_args_base: dict[str, Any] = {"base_url": server, "api": api,
                                                **({"tokenizer": tokenizer} if tokenizer else {})}

    def check_names(self, names: list[str]) -> None:
        """Names the server lists must include these, where it lists any model at all (vLLM lists what it serves;
        ``transformers serve`` loads a model by path on first use and lists only loaded ones)."""
        if not self.listing or any(Path(n).expanduser().is_dir() for n in names):
            return
        missing = [n for n in names if model_card(self.listing, n) is None]
        if missing:
            served = ", ".join(str(e.get("id")) for e in self.listing[:8])
            raise ToolfidError(f"the server does not serve {', '.join(map(repr, missing))} (it lists: {served})")

    def evaluate(self, task: str, metadata: dict[str, Any], adapter: str | None, label: str,
                 out_dir: Path | None = None, limit: int | None = None) -> ViewResult:
        from lm_eval_toolfid.integrations.lm_eval.served_model import ToolfidServerLM

        name = adapter or self.base
        model_args = {"model": name, **self.model_args_base}
        meta = {**metadata, **({"base_model": self.base} if adapter else {})}
        journal = out_dir / ".served" / f"{label}.jsonl" if out_dir is not None else None
        lm = ToolfidServerLM(model=name, journal=str(journal) if journal else None, resume=self.resume,
                             **self.model_args_base, **self.options, connection=self.connection)
        if self.progress is not None:
            t0 = time.monotonic()
            lm.answer_hook = lambda answer: self.progress.engine_row(answer.tokens, time.monotonic() - t0)
        manifest = view_manifest(self.base, adapter, task, metadata, self.model_args_base, limit)
        view = evaluate_view(lm, model_args, task, meta, label, adapter, out_dir, limit, manifest, self.progress,
                             self.verbose)
        if journal is not None and journal.is_file():
            journal.unlink()  # the saved view supersedes it
        return view


def run_served_views(server: str, base: str, adapters: dict[str, str], task: str, metadata: dict[str, Any],
                     out_dir: Path | None = None, *, api: str = "completions", concurrency: int = 8,
                     tokenizer: str | None = None, timeout: float = 300.0, max_retries: int = 3,
                     progress: Any = None, verbose: bool = True, resume: bool = False,
                     limit: int | None = None,
                     connection: Connection | None = None) -> tuple[ViewResult, list[ViewResult]]:
    """The base view, then every adapter view, against one server; ``resume`` reuses views saved in ``out_dir``
    with the same manifest and the answers a stopped view journaled."""
    session = ServedSession(server, base, api, concurrency, tokenizer, timeout, max_retries, progress, verbose,
                            resume, connection=connection)
    same = [label for label, name in adapters.items() if name == base]
    if same:
        raise ToolfidError(f"adapter {same[0]!r} is the base model's own name: an adapter view needs the served name of "
                           "the adapter (vLLM --lora-modules NAME=PATH, SGLang BASE:NAME, a merged copy's path)")
    session.check_names([base, *adapters.values()])
    done: dict[str, ViewResult] = {}
    if resume and out_dir is not None:
        for label, adapter in [("base", None), *adapters.items()]:
            found = load_saved_view(out_dir, label, view_manifest(base, adapter, task, metadata,
                                                                  session.model_args_base, limit))
            if found is not None:
                done[label] = found
                if progress is not None:
                    progress.view_skipped(label, f"reusing {found.path}")
    base_view = done.get("base") or session.evaluate(task, metadata, None, "base", out_dir, limit)
    views = [done.get(label) or session.evaluate(task, metadata, name, label, out_dir, limit)
             for label, name in adapters.items()]
    return base_view, views
