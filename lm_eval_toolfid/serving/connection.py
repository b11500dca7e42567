"""How toolfid reaches an OpenAI-compatible server: every connection setting in one frozen object.

:class:`Connection` holds the API key and its source, extra headers (gateways), timeouts, retries, the cap
on a server's ``Retry-After``, how long one request may keep being refused, and the requests in flight. The
key and header values are :class:`Secret` s: ``repr``, ``str``, :func:`dataclasses.asdict` and
:meth:`Connection.describe` show ``***`` (or the header's name) and never the value, so no result, sample,
manifest, journal, log or error line the project writes can carry one; :meth:`Connection.redact` blanks them
in text a server sends back.

Keys are taken the ecosystem's way (lm-eval's API models, the ``openai`` client, inspect): ``OPENAI_API_KEY``
when set, another variable named by ``--api-key-env NAME`` / ``api_key_env=NAME``, or ``api_key=`` in model
args; sent as ``Authorization: Bearer`` on every request, ``/v1/models`` included.

The HTTP client is ``httpx2`` (:meth:`Connection.http_client`): connection pooling, timeouts, ``https://``
verified against the system's certificates (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured), and proxies from the
standard environment variables (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, replace
from typing import Any, Mapping

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.served import api_root

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class Secret:
    """A value that is sent but never shown: ``repr``/``str``/``format`` give ``***``; :meth:`reveal` the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = str(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __format__(self, spec: str) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __bool__(self) -> bool:
        return bool(self._value)


@dataclass(frozen=True)
class Connection:
    """The settings every request to one server shares (see the module docstring)."""

    api_key: Secret | None = None
    key_source: str | None = None
    """Where the key came from, for messages: ``OPENAI_API_KEY``, the variable ``--api-key-env`` named, ``api_key=``."""
    headers: tuple[tuple[str, Secret], ...] = ()
    """Extra headers (``--header 'NAME: VALUE'``): sent on every request; only their names are ever shown."""
    timeout: float = 300.0
    """Seconds per request (connect, read, write)."""
    max_retries: int = 3
    """Retries of a request that failed (5xx, timeouts, refused connections, a malformed body)."""
    retry_after_max: float = 60.0
    """The longest wait a ``Retry-After`` (429, 503) is honoured for; a longer one is waited this long."""
    rate_limit_wait: float = 600.0
    """How long in all one request may keep being refused (429, 503 with ``Retry-After``) before the view stops."""
    concurrency: int = 8
    """Requests in flight at most; steps down while the server refuses, back up as it answers."""
    backoff: float = 0.5
    """First wait before a retry (doubling, at most 8 s) where the server says nothing of when to come back."""
    flags: str = "cli"
    """How the user sets the key where this connection came from (``cli``: ``--api-key-env NAME``;
    ``model_args``: ``api_key_env=NAME``): the 401/403 message names it."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ToolfidError("--concurrency must be at least 1")
        if self.timeout <= 0:
            raise ToolfidError("--timeout must be more than 0 seconds")
        if self.max_retries < 0:
            raise ToolfidError("--max-retries must be 0 or more")
        if self.retry_after_max < 0 or self.rate_limit_wait < 0:
            raise ToolfidError("--retry-after-max and --rate-limit-wait must be 0 or more seconds")

    def __repr__(self) -> str:
        return f"Connection({', '.join(f'{k}={v!r}' for k, v in self.describe().items())})"

    def describe(self) -> dict[str, Any]:
        """The settings without a secret (the key's source, the headers' names)."""
        return {"key": f"from {self.key_source}" if self.api_key else None,
                "headers": [name for name, _ in self.headers], "timeout": self.timeout,
                "max_retries": self.max_retries, "retry_after_max": self.retry_after_max,
                "rate_limit_wait": self.rate_limit_wait, "concurrency": self.concurrency}

    def request_headers(self) -> dict[str, str]:
        out = {"Content-Type": "application/json"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key.reveal()}"
        out.update({name: value.reveal() for name, value in self.headers})
        return out

    def secrets(self) -> list[str]:
        values = [self.api_key.reveal()] if self.api_key else []
        return [v for v in values + [value.reveal() for _, value in self.headers] if v]

    def redact(self, text: str) -> str:
        """``text`` (a server's answer, an exception) with every secret of this connection blanked."""
        for value in sorted(self.secrets(), key=len, reverse=True):
            text = text.replace(value, "***")
        return text

    def key_hint(self) -> str:
        """What to do about a 401/403, in the terms of where this connection's settings come from."""
        other = "--api-key-env NAME" if self.flags == "cli" else "api_key_env=NAME in --model_args"
        if self.api_key:
            return (f"the key from {self.key_source} was sent: check it (and its access to this model), or set "
                    f"another with {other}")
        return f"set {DEFAULT_KEY_ENV} or {other}"

    def with_options(self, **changes: Any) -> Connection:
        return replace(self, **changes)

    def http_client(self) -> Any:
        """An ``httpx2.Client`` with these headers and timeouts; proxies and certificates from the environment."""
        import httpx2

        return httpx2.Client(headers=self.request_headers(), timeout=httpx2.Timeout(self.timeout), trust_env=True,
                             follow_redirects=False,
                             limits=httpx2.Limits(max_connections=max(self.concurrency, 1) + 2,
                                                  max_keepalive_connections=max(self.concurrency, 1)))


def parse_header(text: str) -> tuple[str, Secret]:
    """``'NAME: VALUE'`` → ``(NAME, Secret(VALUE))``; one-line :class:`ToolfidError` on anything else (the value
    is never quoted back)."""
    name, sep, value = str(text).partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not HEADER_NAME.match(name) or not value or "\n" in value or "\r" in value:
        raise ToolfidError(f"--header takes 'NAME: VALUE' (e.g. --header 'X-Gateway-Key: ...'), not a header "
                           f"{'named ' + repr(name) if HEADER_NAME.match(name) else 'of that shape'}")
    return name, Secret(value)


def resolve_key(api_key: str | None = None, api_key_env: str | None = None, environ: Mapping[str, str] | None = None,
                flag: str = "--api-key-env") -> tuple[Secret | None, str | None]:
    """The key and where it came from: ``api_key`` given, else the variable ``api_key_env`` names (which must be
    set), else ``OPENAI_API_KEY`` when set, else no key."""
    env = os.environ if environ is None else environ
    if api_key not in (None, ""):
        return Secret(str(api_key)), "api_key="
    if api_key_env not in (None, ""):
        name = str(api_key_env)
        if not env.get(name):
            raise ToolfidError(f"{flag} names {name}, which is not set in the environment (export {name}=... first)")
        return Secret(env[name]), name
    if env.get(DEFAULT_KEY_ENV):
        return Secret(env[DEFAULT_KEY_ENV]), DEFAULT_KEY_ENV
    return None, None


def connection_from_model_args(model_args: Mapping[str, Any], **settings: Any) -> Connection:
    """The connection lm-eval model args describe (``api_key=``, ``api_key_env=``, ``header=`` as lm-eval's
    ``TemplateAPI`` takes it: a ``{name: value}`` dict or one ``'NAME: VALUE'``), plus ``settings``."""
    key, source = resolve_key(model_args.get("api_key"), model_args.get("api_key_env"), flag="api_key_env=")
    raw = model_args.get("header")
    if isinstance(raw, Mapping):
        headers = tuple((str(k), Secret(str(v))) for k, v in raw.items())
    elif raw:
        headers = (parse_header(str(raw)),)
    else:
        headers = ()
    return Connection(api_key=key, key_source=source, headers=headers, flags="model_args", **settings)


_REMEMBERED: dict[str, Connection] = {}
_LOCK = threading.Lock()


def remember(base_url: str, connection: Connection) -> None:
    """The connection a ``toolfid-server`` model reaches its server with, for the task's own ``/v1/models``
    lookup in this process (the key and headers never pass through model args or metadata)."""
    with _LOCK:
        _REMEMBERED[api_root(base_url)] = connection


def connection_for(base_url: str, model_args: Mapping[str, Any] | None = None) -> Connection:
    """The connection to use for ``base_url``: the one a model of this process remembered for it, else the one
    ``model_args`` describe (``OPENAI_API_KEY`` when they name none)."""
    with _LOCK:
        known = _REMEMBERED.get(api_root(base_url))
    return known if known is not None else connection_from_model_args(model_args or {}, timeout=10.0)
