"""A client for OpenAI-compatible servers (``/v1/completions``, ``/v1/chat/completions`` with ``tools=``).

Greedy requests (``temperature 0``), N in flight, sent with ``httpx2`` (the key, headers, timeouts, proxies and
certificates of a :class:`~lm_eval_toolfid.serving.connection.Connection`). Bounded retries on what a failing or
restarting server answers (connection refused or reset, timeouts, HTTP 5xx, a body that is not the OpenAI shape),
then :class:`ServerError`: the view stops. A server that refuses for now (429, 503 with ``Retry-After``) is asked
again after the wait it names (capped), with fewer requests in flight (:mod:`~lm_eval_toolfid.serving.pacing`);
one that refuses the key (401/403) stops the view at once (:class:`ServerAuthError`, exit 7).

Each answer is appended to a journal as it arrives (one JSON
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from lm_eval_toolfid.core.errors import EXIT_SERVER, EXIT_SERVER_AUTH, ToolfidError, one_line
from lm_eval_toolfid.pairing.served import ServerURL, api_root, server_origin
from lm_eval_toolfid.serving.connection import Connection, Secret
from lm_eval_toolfid.serving.pacing import AdaptiveLimit, pause, retry_after_seconds

log = logging.getLogger("lm_eval.toolfid")
_NAMED_WARNED: set[tuple[str, str]] = set()
"""(server, model asked) pairs already warned about answering as another model (once per process)."""
_NAMED_LOCK = threading.Lock()

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
REFUSAL_STATUS = {429, 503}
"""A server that is busy or rate-limits: its ``Retry-After`` is honoured and fewer requests are sent at once."""


class ServerError(ToolfidError):
    """The server failed a request past its retries (or refused it): the view stops; answered requests are kept."""


class RequestFailed(ServerError):
    """A healthy server (it answers ``/v1/models``) failed this one request every time it was asked (HTTP 5xx past
    the retries): not an answer. The other requests go on; the request is asked again by ``--resume``."""


class RequestsFailed(ServerError):
    """Some requests of a view failed (:class:`RequestFailed`) and all others were answered and journaled: the view
    gets no metrics and no verdict; ``--resume`` asks only the failed ones. Exit 6 wherever it ends a command."""

    exit_code = EXIT_SERVER

    def __init__(self, message: str, failed: int, total: int, example: str = "") -> None:
        super().__init__(message)
        self.failed, self.total, self.example = failed, total, example


class ServerAuthError(ServerError):
    """The server refused the key (HTTP 401/403): one line saying what to do, exit 7; finished views are kept."""

    exit_code = EXIT_SERVER_AUTH


@dataclass(frozen=True)
class ServedAnswer:
    text: str
    shape: str
    """``text``, ``tool_calls`` or ``empty`` (``server_error``: journals and results of earlier versions, which scored
    a request a healthy server failed every time as no call; such a line is asked again)."""
    finish_reason: str | None = None
    parser_error: str | None = None
    retries: int = 0
    tokens: int = 0
    """Completion tokens the server reports (``usage``), 0 when it does not."""
    error: str | None = None
    """``server_error`` (earlier versions): what the server answered every time."""
    refused: int = 0
    """Times the server refused this request (429, 503 with ``Retry-After``) and it was asked again after the wait."""


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
    """Answers appended as they arrive (JSON lines; kept in memory too, and only there when ``path`` is None).
    ``resume``: the answers a stopped run of the same view left are read back; otherwise an old journal is
    started afresh."""

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
                    answer = ServedAnswer(**row["answer"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line torn by a kill mid-write: that request is asked again
                if answer.shape != "server_error":  # a failed request (an earlier version's line) is no answer
                    self.done[row["key"]] = answer
        self.failed: dict[str, str] = {}
        """Requests that failed in this run (key -> what the server answered): not asked again before a resume."""

    def add(self, key: str, answer: ServedAnswer) -> None:
        with self._lock:
            self.done[key] = answer
            if self.path is None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": key, "answer": asdict(answer)}, ensure_ascii=False) + "\n")


class ServerClient:
    """Requests to one served model, through one ``httpx2`` client (see :mod:`lm_eval_toolfid.serving.connection`)."""

    def __init__(self, base_url: str, model: str, api: str = "completions", timeout: float = 300.0,
                 max_retries: int = 3, headers: dict[str, str] | None = None, backoff: float = 0.5,
                 connection: Connection | None = None) -> None:
        if api not in ("completions", "chat"):
            raise ToolfidError(f"api must be completions or chat, not {api!r}")
        self.root, self.model, self.api = api_root(base_url), model, api
        self.origin = server_origin(base_url)
        if connection is None:
            extra = tuple((k, Secret(v)) for k, v in (headers or {}).items())
            connection = Connection(timeout=float(timeout), max_retries=int(max_retries), backoff=float(backoff),
                                    headers=extra)
        self.connection = connection
        self.timeout, self.max_retries, self.backoff = connection.timeout, connection.max_retries, connection.backoff
        self._http: Any = None
        self._http_lock = threading.Lock()

    @property
    def http(self) -> Any:
        with self._http_lock:
            if self._http is None or self._http.is_closed:
                self._http = self.connection.http_client()
            return self._http

    def close(self) -> None:
        with self._http_lock:
            if self._http is not None:
                self._http.close()
                self._http = None

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

    def _detail(self, response: Any) -> str:
        try:
            text = response.content[:200].decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - a body that cannot be read says nothing more
            text = ""
        return self.connection.redact(one_line(text))

    def ask(self, payload: dict[str, Any], limit: AdaptiveLimit | None = None,
            cancel: threading.Event | None = None) -> ServedAnswer:
        """One request, retried: failures (5xx, timeouts, refused connections, a malformed body) up to
        ``max_retries`` times with backoff; refusals (429, or 503 with ``Retry-After``) after the wait the server
        asks for (at most ``retry_after_max``), up to ``rate_limit_wait`` in all; 401/403 at once."""
        import httpx2

        conn = self.connection
        url = f"{self.root}/{'chat/completions' if self.api == 'chat' else 'completions'}"
        data = json.dumps({"model": self.model, **payload}, ensure_ascii=False).encode()
        limit = limit or AdaptiveLimit(1)
        last, status, asked, failures, refusals, first_refusal = "", None, 0, 0, 0, 0.0
        while True:
            response = None
            with limit.slot() as sent_in:
                asked += 1
                try:
                    response = self.http.post(url, content=data)
                except httpx2.HTTPError as exc:  # refused, reset, timed out
                    last, status = conn.redact(one_line(str(exc) or type(exc).__name__)), None
            if response is not None:
                status = response.status_code
                if 200 <= status < 300:
                    try:
                        body = response.json()
                        answer = answer_of(body, self.api)
                    except ValueError as exc:
                        last, status = f"malformed response: {conn.redact(one_line(str(exc)))[:160]}", None
                    else:
                        self._check_named(body)
                        limit.answered()
                        return ServedAnswer(answer.text, answer.shape, answer.finish_reason, answer.parser_error,
                                            asked - 1, answer.tokens, refused=refusals)
                elif status in (401, 403):
                    raise ServerAuthError(f"the server refused the request: HTTP {status}; {conn.key_hint()} "
                                          f"({self.origin}, model {self.model!r}: {self._detail(response)})")
                else:
                    last = f"HTTP {status} {self._detail(response)}".strip()
                    told = retry_after_seconds(response.headers.get("retry-after"))
                    if status in REFUSAL_STATUS:
                        limit.refused(sent_in, status)
                    if status == 429 or (status in REFUSAL_STATUS and told is not None):
                        wait = max(0.05, min(told if told is not None else self.backoff * 2 ** min(refusals, 4),
                                             conn.retry_after_max))
                        first_refusal = first_refusal or time.monotonic()
                        if time.monotonic() + wait - first_refusal > conn.rate_limit_wait:
                            raise ServerError(f"server {self.origin} kept refusing a request for {self.model!r} "
                                              f"for {time.monotonic() - first_refusal:.0f} s (rate_limit_wait "
                                              f"{conn.rate_limit_wait:g} s; last: {last})")
                        refusals += 1
                        limit.hold(wait)
                        if pause(wait, cancel):
                            raise ServerError("cancelled: the view is stopping")
                        continue
                    if status not in RETRY_STATUS:
                        raise ServerError(f"server {self.origin} refused a request for {self.model!r}: {last}")
            failures += 1
            if failures > self.max_retries:
                break
            if pause(min(self.backoff * 2 ** (failures - 1), 8.0), cancel):
                raise ServerError("cancelled: the view is stopping")
        if status is not None and status >= 500 and self.healthy():
            # the server is up and answers others: this request failed, the others go on (a failed request is not
            # an answer: its view is not scored, and --resume asks it again)
            raise RequestFailed(last[:300])
        raise ServerError(f"server {self.origin} failed a request for {self.model!r} {failures} times "
                          f"(last: {last})")

    def _check_named(self, body: Any) -> None:
        """A response that names another model than the one asked (a gateway routing elsewhere, a server that serves
        one model whatever the name): said once per model asked, as a warning; a dated snapshot of the name asked
        (``gpt-4o`` answered as ``gpt-4o-2024-08-06``) or a revision of it (``transformers serve``: ``NAME@main``) is
        the same model."""
        named = body.get("model") if isinstance(body, dict) else None
        if not isinstance(named, str) or not named or named == self.model or \
                named.startswith((f"{self.model}-", f"{self.model}@")):  # a dated snapshot, a revision of it
            return
        with _NAMED_LOCK:
            if (self.origin, self.model) in _NAMED_WARNED:
                return
            _NAMED_WARNED.add((self.origin, self.model))
        log.warning("tool_use_fidelity: server %s answered requests for model %r as model %r: the answers scored are "
                    "that model's; check the server's routing (or ask for the name it serves)", self.origin,
                    self.model, one_line(named)[:120])

    def healthy(self) -> bool:
        """The server answers ``/v1/models``."""
        import httpx2

        try:
            return self.http.get(f"{self.root}/models", timeout=min(self.timeout, 10.0)).status_code == 200
        except httpx2.HTTPError:
            return False


def list_models(server: ServerURL, connection: Connection | None = None) -> list[dict[str, Any]]:
    """The server's ``/v1/models`` entries (``server`` resolved by the caller: :func:`~lm_eval_toolfid.pairing.
    served.server_url`; asked with the connection's key and headers); one-line
    :class:`ToolfidError` when it cannot be reached or answers something else than the OpenAI list shape,
    :class:`ServerAuthError` when it refuses the key."""
    import httpx2

    conn = connection or Connection(timeout=10.0)
    url = server.root + "/models"
    try:
        with conn.with_options(timeout=min(conn.timeout, 10.0)).http_client() as http:
            for attempt in range(4):  # a rate-limited endpoint may refuse the lookup too: wait as it says
                response = http.get(url)
                told = retry_after_seconds(response.headers.get("retry-after"))
                if response.status_code not in REFUSAL_STATUS or attempt == 3 or (
                        response.status_code == 503 and told is None):
                    break
                pause(min(told if told is not None else 2.0 ** attempt, conn.retry_after_max), None)
    except httpx2.HTTPError as exc:
        reason = conn.redact(one_line(str(exc) or type(exc).__name__))
        if "CERTIFICATE_VERIFY_FAILED" in reason:  # reached, but its certificate is not one the system trusts
            raise ToolfidError(f"server {server.origin}: its certificate is not trusted ({reason}); a private "
                               "CA's certificate goes in SSL_CERT_FILE (or SSL_CERT_DIR)") from None
        raise ToolfidError(f"server {server.origin} is not reachable ({reason}); start it first "
                           "(see README: Served models)") from None
    if response.status_code in (401, 403):
        raise ServerAuthError(f"the server refused the request: HTTP {response.status_code}; {conn.key_hint()} "
                              f"({url})")
    if response.status_code != 200:
        raise ToolfidError(f"server {url} answered HTTP {response.status_code} ({response.reason_phrase})")
    body = response.content
    try:
        data = json.loads(body)
        entries = data["data"]
        if not isinstance(entries, list):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise ToolfidError(f"server {url} did not answer an OpenAI model list "
                           f"({conn.redact(repr(body[:80]))})") from None
    return [e for e in entries if isinstance(e, dict)]


@dataclass
class Asks:
    """One model's requests for :func:`ask_many`: its client, its payloads and the journal its answers go to."""

    client: ServerClient
    payloads: list[dict[str, Any]]
    journal: Journal


def ask_all(client: ServerClient, payloads: list[dict[str, Any]], journal: Journal, concurrency: int | None = None,
            on_answer: Callable[[int, ServedAnswer], None] | None = None) -> list[ServedAnswer]:
    """Every payload answered (journal first), at most ``concurrency`` in flight (the connection's by default;
    fewer while the server refuses); on a :class:`ServerError` the requests in flight finish, their answers are
    journaled, and the error is raised."""
    hook = (lambda _job, i, a: on_answer(i, a)) if on_answer is not None else None
    return ask_many([Asks(client, payloads, journal)], concurrency, hook)[0]


def ask_many(jobs: Sequence[Asks], concurrency: int | None = None,
             on_answer: Callable[[int, int, ServedAnswer], None] | None = None) -> list[list[ServedAnswer]]:
    """:func:`ask_all` for several models of one server at once (the base and its adapters: a server that batches
    across LoRAs computes them in one stream, with no lull between views): one pool of at most ``concurrency``
    requests in flight (the first job's connection's by default), sent job after job (the next job's requests go
    out as the last of the one before are still answered), each answer journaled in its own job's journal;
    ``on_answer(job, i, answer)``."""
    keys = [[request_key(job.client.model, job.client.api, p) for p in job.payloads] for job in jobs]
    out: list[list[ServedAnswer | None]] = [[job.journal.done.get(k) for k in ks] for job, ks in zip(jobs, keys)]
    todo = [(j, i) for j, answers in enumerate(out) for i, a in enumerate(answers)
            if a is None and keys[j][i] not in jobs[j].journal.failed]  # failed in this run: asked by --resume
    failure: list[ServerError] = []
    stop = threading.Event()
    width = max(1, int(concurrency if concurrency is not None else
                       (jobs[0].client.connection.concurrency if jobs else 1)))
    limit = AdaptiveLimit(width)

    def one(j: int, i: int) -> None:
        if stop.is_set():
            return
        job = jobs[j]
        try:
            answer = job.client.ask(job.payloads[i], limit, stop)
        except RequestFailed as exc:  # this request, not the server: the others go on
            job.journal.failed[keys[j][i]] = str(exc)
            return
        except ServerError as exc:
            if not stop.is_set():
                failure.append(exc)
                stop.set()
            return
        out[j][i] = answer
        job.journal.add(keys[j][i], answer)
        if on_answer is not None:
            on_answer(j, i, answer)

    if todo:
        with ThreadPoolExecutor(max_workers=width) as pool:
            for future in [pool.submit(one, j, i) for j, i in todo]:
                future.result()
    if limit.lowest < width:
        log.warning("tool_use_fidelity: the server refused requests (rate limits): %d in flight at the lowest, "
                    "%d asked for", limit.lowest, width)
    failed = [job.journal.failed[k] for job, ks in zip(jobs, keys) for k in ks if k in job.journal.failed]
    if failure:
        kept = sum(a is not None for answers in out for a in answers)
        paths = sorted({str(job.journal.path.parent if len(jobs) > 1 else job.journal.path)
                        for job in jobs if job.journal.path is not None})
        where = f"; {kept} answers kept in {', '.join(paths)}" if paths else ""
        also = f"; {len(failed)} other requests failed (e.g. {failed[0]})" if failed else ""
        raise type(failure[0])(f"{failure[0]}{where}{also}")
    own = [jobs[0].journal.failed[k] for k in keys[0] if k in jobs[0].journal.failed] if jobs else []
    if own:  # this view's answers are incomplete: no answer stands in for the failed ones
        job = jobs[0]
        raise RequestsFailed(f"{len(own)} of {len(job.payloads)} requests for {job.client.model!r} failed on server "
                             f"{job.client.origin} past their retries (e.g. {own[0]})", len(own), len(job.payloads),
                             own[0])
    return [[a for a in answers if a is not None] for answers in out]
