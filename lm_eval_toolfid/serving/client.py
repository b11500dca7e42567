"""A client for OpenAI-compatible servers (``/v1/completions``, ``/v1/chat/completions`` with ``tools=``).

Greedy requests (``temperature 0``), N in flight, bounded retries on what a busy or restarting server
answers (connection refused or reset, timeouts, HTTP 429 and 5xx, a body that is not the OpenAI shape),
then :class:`ServerError`: the view stops. Each answer is appended to a journal as it arrives (one JSON
line, keyed by the request), so a stopped view resumes with only the requests it has not answered.

What comes back is turned into the text the scorer reads, and its shape is recorded: ``text`` (the
``text``/``content`` field), ``tool_calls`` (the server's tool parser answered; the calls are written as
the JSON the scorer parses — a ``{"name", "arguments"}`` object, or a list of them), ``empty``; a call
whose ``arguments`` string is not JSON is a ``parser_error`` and is scored as the string it was (an
invalid call); ``finish_reason`` ``length`` (cut by ``max_tokens``) is counted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from lm_eval_toolfid.core.errors import ToolfidError, one_line
from lm_eval_toolfid.pairing.served import api_root, server_origin

log = logging.getLogger("lm_eval.toolfid")

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class ServerError(ToolfidError):
    """The server failed a request past its retries (or refused it): the view stops; answered requests are kept."""


@dataclass(frozen=True)
class ServedAnswer:
    text: str
    shape: str
    """``text``, ``tool_calls``, ``empty`` or ``server_error`` (a healthy server failed this one request every
    time: e.g. ``transformers serve``'s tool parser answers 500 to a call whose JSON does not close)."""
    finish_reason: str | None = None
    parser_error: str | None = None
    retries: int = 0
    tokens: int = 0
    """Completion tokens the server reports (``usage``), 0 when it does not."""
    error: str | None = None
    """``server_error``: what the server answered every time (the text is empty and scores as no call)."""


def _calls_text(tool_calls: list[Any]) -> tuple[str, str | None]:
    """Structured ``tool_calls`` → the JSON text the scorer parses; the first argument string that is not JSON."""
    calls, problem = [], None
    for tc in tool_calls:
        fn = (tc or {}).get("function") or {}
        args: Any = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                problem = problem or f"arguments of {fn.get('name')!r} are not JSON: {args[:60]!r}"
        calls.append({"name": fn.get("name"), "arguments": args})
    body = calls[0] if len(calls) == 1 else calls
    return json.dumps(body, ensure_ascii=False), problem


def answer_of(body: Any, api: str) -> ServedAnswer:
    """One response body → :class:`ServedAnswer`; ``ValueError`` when it is not the OpenAI shape."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        raise ValueError(f"no choices in the response ({one_line(json.dumps(body)[:120])})")
    choice = body["choices"][0]
    if not isinstance(choice, dict):
        raise ValueError("a choice is not an object")
    finish = choice.get("finish_reason")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else 0
    if api == "chat":
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ValueError("a chat choice without a message")
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            text, problem = _calls_text(calls)
            return ServedAnswer(text, "tool_calls", finish, problem, tokens=tokens)
        content = message.get("content")
        text = content if isinstance(content, str) else ""
    else:
        text = choice.get("text")
        if not isinstance(text, str):
            raise ValueError("a completion choice without text")
    return ServedAnswer(text, "text" if text else "empty", finish, tokens=tokens)


def request_key(model: str, api: str, payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([model, api, payload], sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


class Journal:
    """Answers appended as they arrive (JSON lines). ``resume``: the answers a stopped run of the same view left
    are read back; otherwise an old journal is started afresh."""

    def __init__(self, path: str | Path | None, resume: bool = True) -> None:
        self.path = Path(path) if path else None
        self.done: dict[str, ServedAnswer] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file() and not resume:
            self.path.unlink()
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line)
                    self.done[row["key"]] = ServedAnswer(**row["answer"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line torn by a kill mid-write: that request is asked again

    def add(self, key: str, answer: ServedAnswer) -> None:
        if self.path is None:
            return
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": key, "answer": asdict(answer)}, ensure_ascii=False) + "\n")


class ServerClient:
    """Requests to one served model."""

    def __init__(self, base_url: str, model: str, api: str = "completions", timeout: float = 300.0,
                 max_retries: int = 3, headers: dict[str, str] | None = None, backoff: float = 0.5) -> None:
        if api not in ("completions", "chat"):
            raise ToolfidError(f"api must be completions or chat, not {api!r}")
        self.root, self.model, self.api = api_root(base_url), model, api
        self.origin = server_origin(base_url)
        self.timeout, self.max_retries, self.backoff = float(timeout), int(max_retries), float(backoff)
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def payload(self, prompt: Any, max_tokens: int, stop: Sequence[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": int(max_tokens), "temperature": 0, "top_p": 1}
        if stop:
            body["stop"] = list(stop)[:4]  # the OpenAI API takes at most 4; the task cuts at every one anyway
        if self.api == "chat":
            body.update(messages=prompt["messages"])
            if prompt.get("tools"):
                body["tools"] = prompt["tools"]
        else:
            body["prompt"] = prompt
        return body

    def ask(self, payload: dict[str, Any]) -> ServedAnswer:
        url = f"{self.root}/{'chat/completions' if self.api == 'chat' else 'completions'}"
        data = json.dumps({"model": self.model, **payload}, ensure_ascii=False).encode()
        last, status = "", None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(self.backoff * 2 ** (attempt - 1), 8.0))
            try:
                request = urllib.request.Request(url, data=data, headers=self.headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = one_line(exc.read()[:200].decode("utf-8", "replace")) if exc.fp else ""
                last, status = f"HTTP {exc.code} {detail}".strip(), exc.code
                if exc.code in RETRY_STATUS:
                    continue
                raise ServerError(f"server {self.origin} refused a request for {self.model!r}: {last}") from None
            except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
                last, status = one_line(str(getattr(exc, "reason", exc))), None
                continue
            try:
                answer = answer_of(json.loads(raw), self.api)
            except ValueError as exc:
                last = f"malformed response: {one_line(str(exc))[:160]}"
                continue
            return ServedAnswer(answer.text, answer.shape, answer.finish_reason, answer.parser_error, attempt,
                                answer.tokens)
        if status is not None and status >= 500 and self.healthy():
            # the server is up and answers others: this request's answer is what it cannot produce (the model's
            # output broke its parser); recorded and scored as no call, counted per view
            return ServedAnswer("", "server_error", None, None, self.max_retries, 0, last[:300])
        raise ServerError(f"server {self.origin} failed a request for {self.model!r} {self.max_retries + 1} times "
                          f"(last: {last})")

    def healthy(self) -> bool:
        """The server answers ``/v1/models``."""
        try:
            with urllib.request.urlopen(f"{self.root}/models", timeout=min(self.timeout, 10.0)) as response:  # noqa: S310
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False


def ask_all(client: ServerClient, payloads: list[dict[str, Any]], journal: Journal, concurrency: int = 8,
            on_answer: Callable[[int, ServedAnswer], None] | None = None) -> list[ServedAnswer]:
    """Every payload answered (journal first), ``concurrency`` in flight; on a :class:`ServerError` the requests
    in flight finish, their answers are journaled, and the error is raised."""
    keys = [request_key(client.model, client.api, p) for p in payloads]
    out: list[ServedAnswer | None] = [journal.done.get(k) for k in keys]
    todo = [i for i, a in enumerate(out) if a is None]
    failure: list[ServerError] = []
    stop = threading.Event()

    def one(i: int) -> None:
        if stop.is_set():
            return
        try:
            answer = client.ask(payloads[i])
        except ServerError as exc:
            failure.append(exc)
            stop.set()
            return
        out[i] = answer
        journal.add(keys[i], answer)
        if on_answer is not None:
            on_answer(i, answer)

    with ThreadPoolExecutor(max_workers=max(1, int(concurrency))) as pool:
        for future in [pool.submit(one, i) for i in todo]:
            future.result()
    if failure:
        kept = sum(a is not None for a in out)
        where = f"; {kept} answers kept in {journal.path}" if journal.path is not None else ""
        raise ServerError(f"{failure[0]}{where}")
    return [a for a in out if a is not None]
