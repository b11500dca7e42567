"""An in-process OpenAI-compatible endpoint that misbehaves on purpose (tests of the served path's faults).

It answers ``/v1/models`` and ``/v1/completions`` / ``/v1/chat/completions`` with the gold call of the fixture
case whose request it finds in the prompt (so runs score something real), unless ``plan`` says otherwise for
the n-th request: an HTTP status, a malformed body, a cut answer, the stop string echoed, structured
``tool_calls`` (optionally with arguments that are not JSON), a status with a ``Retry-After``. It can want an API
key (401 without it), rate-limit with a token bucket (429 with ``Retry-After``), and it records every request's
headers and path (a proxy in front of it sends the absolute URL).
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases


@functools.lru_cache(maxsize=1)
def _gold() -> list[tuple[str, str, dict[str, Any]]]:
    """The fixture cases' requests and gold calls (read once: 0.4 s a read, a request's time budget in tests)."""
    cases = load_cases(fixture_paths()["cases"])
    return [(c.prompt, c.gold_tool_name or "", c.gold_arguments or {}) for c in cases if c.gold_tool_name]


@dataclass
class Fake:
    """What the endpoint does for request number n (0-based, generation requests only)."""

    plan: Callable[[int, dict[str, Any]], str | None] = lambda n, body: None
    """Returns None (answer normally) or one of: ``"down"`` (the whole server answers 503 from now on),
    ``"500"`` / ``"503"`` / ``"400"`` (that status, the server otherwise healthy), ``"slow"`` (answers after 2.5 s),
    ``"leak500"`` (500 quoting the request's key and gateway header), ``"revoke"`` (403, the key withdrawn),
    ``"status:CODE[:RETRY-AFTER]"``, ``"garbage"``
    (a body that is not JSON), ``"nochoices"`` (JSON without choices), ``"cut"`` (half a call, finish_reason
    length), ``"echo"`` (the call followed by the first stop string), ``"tool_calls"``, ``"bad_args"``."""
    models: list[dict[str, Any]] = field(default_factory=lambda: [{"id": "fake-base", "object": "model"},
                                                                  {"id": "fake-ad", "object": "model"}])
    requests: list[dict[str, Any]] = field(default_factory=list)
    replay: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """Request text → a recorded (status, body) of a real server, answered for a request that contains it."""
    down: bool = False
    """Set by a ``"down"`` answer: every request (``/v1/models`` too) gets 503 until cleared."""
    keys: set[str] = field(default_factory=set)
    """Accepted API keys: when any, a request (``/v1/models`` too) without ``Authorization: Bearer KEY`` of one
    of them gets 401 (the body echoes the header it got, as some gateways do)."""
    bucket: TokenBucket | None = None
    """A rate limit on generation requests: past it, 429 with ``Retry-After`` (whole seconds, or the bucket's unit)."""
    seen: list[tuple[float, str, str, dict[str, str]]] = field(default_factory=list)
    """Every request as it arrived: (time, method, path as sent, headers)."""
    refused: int = 0
    """Generation requests answered 429 by the bucket."""
    answered_at: list[tuple[float, str]] = field(default_factory=list)
    """(time, model) of every generation request past the key and the rate limit."""
    answered_with: list[tuple[int, str | None]] = field(default_factory=list)
    """The ``status:`` plans answered: (status, Retry-After)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)
    """Set by :func:`serve`'s stop function."""

    def gate(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]] | None:
        """What every request gets before its route: None (go on) or a refusal (status, body, headers)."""
        with self.lock:
            self.seen.append((time.monotonic(), method, path, headers))
        got = headers.get("authorization", "")
        if self.keys and got not in {f"Bearer {k}" for k in self.keys}:
            return 401, json.dumps({"error": {"message": f"invalid key: got {got!r}"}}).encode(), {}
        if method == "POST" and self.bucket is not None:
            wait = self.bucket.take()
            if wait:
                with self.lock:
                    self.refused += 1
                return 429, b'{"error": {"message": "rate limited"}}', {"Retry-After": self.bucket.retry_after(wait)}
        return None

    def answer(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[Any, ...]:
        with self.lock:
            n = len(self.requests)
            self.requests.append(body)
            self.answered_at.append((time.monotonic(), str(body.get("model"))))
        what = self.plan(n, body)
        if what == "down":
            self.down = True
        if self.down:
            return 503, b'{"error": {"message": "down"}}'
        for needle, recorded in self.replay.items():
            if needle in json.dumps(body.get("messages") or body.get("prompt"), ensure_ascii=False):
                return recorded
        if what in ("500", "503", "400"):
            return int(what), b'{"error": {"message": "on purpose"}}'
        if what == "leak500":  # a healthy server's 500 that quotes the request's secrets back
            quoted = {k: v for k, v in (headers or {}).items() if k in ("authorization", "x-gateway-token")}
            return 500, json.dumps({"error": {"message": f"cannot parse; request had {quoted}"}}).encode()
        if what == "revoke":  # the key is withdrawn: this request and every later one are refused
            self.keys = {"revoked-" + str(time.monotonic())}
            return 403, b'{"error": {"message": "forbidden"}}'
        if what and what.startswith("status:"):  # "status:CODE" or "status:CODE:RETRY-AFTER"
            _, code, *after = what.split(":", 2)
            self.answered_with.append((int(code), after[0] if after else None))
            return int(code), b'{"error": {"message": "later"}}', ({"Retry-After": after[0]} if after else {})
        if what == "slow":  # past the client's timeout; the client gives up and asks again
            self.stopped.wait(2.5)  # cut short when the endpoint stops: no handler outlives its test
        if what == "garbage":
            return 200, b"<html>not json</html>"
        if what == "nochoices":
            return 200, b'{"object": "text_completion"}'
        text = json.dumps(self._call(body))
        chat = "messages" in body
        finish = "stop"
        if what == "cut":
            text, finish = text[: len(text) // 2], "length"
        elif what == "echo":
            stops = body.get("stop") or ["\n###"]
            text = text + stops[0] + "trailing"
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if what in ("tool_calls", "bad_args"):
                call = self._call(body)
                args = json.dumps(call["arguments"]) if what == "tool_calls" else "{city: Osaka"
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": call["name"], "arguments": args}}]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if what else finish}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
        named = "another-model" if what == "other_model" else body.get("model")  # servers name the model that answered
        return 200, json.dumps({"object": "x", "model": named, "choices": [choice],
                                "usage": {"completion_tokens": 7}}).encode()

    @staticmethod
    def _call(body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt") or json.dumps(body.get("messages"))
        for request, name, args in _gold():
            if request in prompt or json.dumps(request)[1:-1] in prompt:
                return {"name": name, "arguments": args}
        return {"name": "unknown_tool", "arguments": {}}


class TokenBucket:
    """``rate`` requests a second, ``capacity`` at once (thread-safe). A refused request is told to come back after
    the wait for the next token rounded up to whole ``unit`` seconds (1: whole seconds, what servers send; a test
    that scales the rate up by k and the unit down by k replays the same schedule k times faster)."""

    def __init__(self, rate: float, capacity: int, unit: float = 1.0) -> None:
        self.rate, self.capacity, self.unit = float(rate), float(capacity), float(unit)
        self.tokens, self.at = float(capacity), time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> float:
        """0 when a request may go now (a token taken), else the seconds until the next token."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                return 0.0
            return (1 - self.tokens) / self.rate

    def retry_after(self, wait: float) -> str:
        """The ``Retry-After`` value for a wait of ``wait`` seconds: at least one unit, in whole units."""
        units = max(1, math.ceil(wait / self.unit))
        return str(units) if self.unit == 1.0 else f"{units * self.unit:g}"


def recorded_replay(path: str) -> dict[str, tuple[int, bytes]]:
    """A file written by bench/record_served_tool_calls.py → :attr:`Fake.replay` (keyed by each case's request)."""
    from lm_eval_toolfid.cases.bundled import default_cases_path

    requests = {c.id: c.prompt for c in load_cases(str(default_cases_path()))}
    out = {}
    for line in open(path, encoding="utf-8"):
        if line.strip():
            row = json.loads(line)
            out[json.dumps(requests[row["case_id"]], ensure_ascii=False)[1:-1]] = (row["status"], row["body"].encode())
    return out


def serve(fake: Fake, tls: tuple[str, str] | None = None) -> tuple[str, Callable[[], None]]:
    """Start the endpoint on an ephemeral loopback port; returns its URL and a stop function. ``tls``:
    (certificate file, key file): the endpoint speaks https."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            try:
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                # the client gave up on this request (a timeout): nothing to answer, and no traceback printed into
                # whatever sys.stderr is at that moment (a later in-process run's captured stderr)
                pass

        def _refused(self, method: str) -> bool:
            refusal = fake.gate(method, self.path, {k.lower(): v for k, v in self.headers.items()})
            if refusal is not None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send(*refusal)
            return refusal is not None

        def do_GET(self) -> None:  # noqa: N802
            if self._refused("GET"):
                return
            if fake.down:
                self._send(503, b"{}")
            elif self.path.rstrip("/").endswith("/models"):
                self._send(200, json.dumps({"object": "list", "data": fake.models}).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:  # noqa: N802
            if self._refused("POST"):
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            self._send(*fake.answer(body, {k.lower(): v for k, v in self.headers.items()}))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    # stop() waits until the serving loop looks at its flag again: every 0.05 s, not every 0.5 s (the default), so
    # a stopped endpoint costs its test no idle half second
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def stop() -> None:
        fake.stopped.set()
        server.shutdown()
        server.server_close()

    return f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}", stop
