"""Identity of a model served by an OpenAI-compatible server (vLLM, SGLang, llama.cpp, ``transformers serve``).

A served run names its model (``model=``) and the server (``base_url=``) in its model args, like
lm-eval's ``local-completions``. Each served adapter is a model name of its own, so an adapter run says
which served model is its base: task metadata ``base_model`` (``--metadata '{"base_model": NAME}'``).

The base identity of a served run holds what can change its greedy outputs as far as a client can see:
the server (scheme, host, port), the served base model name, what the server's ``/v1/models`` reports
about it (``root``, ``parent``, ``max_model_len`` where given; never the volatile ``created``/``status``),
a content fingerprint where the name is a local folder (``transformers serve`` loads models by path),
the tokenizer the prompts were rendered with (its fingerprint), and the model args that shape the
request — never the key, the headers or other transport settings. The ``/v1/models`` listing is asked for by
the serving layer (:func:`lm_eval_toolfid.serving.client.list_models`, with the key) and passed in as data.
Pairing stays as strict as for ``hf``: a restarted server on another port, another model
behind the same name (a different ``root``) or another tokenizer is another base.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.identity import dir_fingerprint, resolved_hub_commit

SERVED_BACKENDS = {
    "local-completions": "openai-completions",
    "openai-completions": "openai-completions",
    "local-chat-completions": "openai-chat",
    "openai-chat-completions": "openai-chat",
    "toolfid-server": "openai-completions",
}
"""lm-eval model names that talk to an OpenAI-compatible server → the request shape they send. lm-eval's
``local-completions`` and ``toolfid-server`` (completions) send the same prompt text, so a base run through
one pairs with an adapter run through the other; ``toolfid-server`` with ``api=chat`` is ``openai-chat-tools``."""

SERVER_KEYS_NOT_IDENTITY = {
    "num_concurrent", "max_retries", "timeout", "batch_size", "verify_certificate", "ca_cert_path", "auth_token",
    "api_key", "header", "journal", "base_url", "model", "pretrained", "tokenizer", "tokenizer_backend", "max_length",
    "seed", "eos_string", "trust_remote_code", "use_fast_tokenizer", "revision", "tokenized_requests", "api", "resume",
    "api_key_env", "headers", "connection", "retry_after_max", "rate_limit_wait",
}
"""Served model args that are transport, secrets or handled on their own (never copied into an identity): two
runs against one server with different keys, headers or rate limits pair."""

CARD_KEYS = ("root", "parent", "max_model_len")
"""What a ``/v1/models`` entry says about the model behind a name (vLLM: ``root`` the weights' path or id,
``parent`` the base of a LoRA module); ``created`` changes on every request and is left out."""


def is_served(model_args: dict[str, Any]) -> bool:
    return bool(model_args.get("base_url"))


def server_origin(base_url: str) -> str:
    """``scheme://host:port`` of a server URL (``/v1/completions`` and ``/v1/chat/completions`` are one server)."""
    parts = urllib.parse.urlsplit(str(base_url).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolfidError(f"base_url {base_url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1/completions)")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname}:{port}"


def api_root(base_url: str) -> str:
    """The ``.../v1`` root of a server URL given as the root, ``/v1`` or a full endpoint."""
    parts = urllib.parse.urlsplit(str(base_url).strip())
    path = parts.path.rstrip("/")
    for tail in ("/chat/completions", "/completions", "/models"):
        if path.endswith(tail):
            path = path[: -len(tail)]
            break
    if not path.endswith("/v1"):
        path = path + "/v1"
    return f"{server_origin(base_url)}{path}"


@dataclass(frozen=True)
class ServerURL:
    """A server URL resolved once (``toolfid run --server``'s plan): as given (what model args record), its
    ``scheme://host:port`` and its ``/v1`` root."""

    given: str
    origin: str
    root: str


def server_url(base_url: str) -> ServerURL:
    """``base_url`` resolved; one-line :class:`ToolfidError` when it is not an http(s) URL."""
    return ServerURL(str(base_url), server_origin(base_url), api_root(base_url))


def model_card(listing: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The stable fields the server reports for a model name, or None when it does not list it (``transformers
    serve`` lists a model only once loaded)."""
    for entry in listing:
        if entry.get("id") == name:
            return {k: entry[k] for k in CARD_KEYS if entry.get(k) not in (None, "")}
    return None


def _name_fingerprint(name: str) -> dict[str, str]:
    local = Path(str(name)).expanduser()
    if local.is_dir():
        return {"fingerprint": dir_fingerprint(local)}
    return {}


def tokenizer_fingerprint(source: str | None) -> str | None:
    """The tokenizer the prompts are rendered with: a local folder's tokenizer files, or a hub id and its commit."""
    if not source:
        return None
    local = Path(str(source)).expanduser()
    if local.is_dir():
        files = [p for p in sorted(local.iterdir()) if p.is_file() and (
            p.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "added_tokens", "chat_template"))
            or p.suffix == ".jinja")]
        h = hashlib.sha256()
        for file in files:
            h.update(file.name.encode())
            h.update(file.read_bytes())
        return h.hexdigest()[:16]
    commit = resolved_hub_commit(str(source), None)
    return f"{source}@{commit}" if commit else str(source)


def served_adapter(model_args: dict[str, Any], base_model: str | None,
                   listing: list[dict[str, Any]] | None) -> tuple[str, str] | None:
    """``("served", name)`` for an adapter run (``base_model`` given and not the served model itself), None for a
    base run. A model the server lists with a ``parent`` (vLLM's LoRA modules) is an adapter: without
    ``base_model`` it is refused, never taken for a base."""
    name = str(model_args.get("model") or model_args.get("pretrained") or "")
    if not name:
        raise ToolfidError("a served run needs model=NAME in --model_args (the name the server serves)")
    if base_model and str(base_model) != name:
        return "served", name
    card = model_card(listing or [], name) or {}
    parent = card.get("parent")
    if parent and parent != name and not base_model:
        raise ToolfidError(f"served model {name!r} is an adapter of {parent!r} on this server (its /v1/models entry "
                           f"has parent {parent!r}): pass --metadata '{{\"base_model\": \"{parent}\"}}' to evaluate it "
                           "against its base")
    return None


def served_identity(model_args: dict[str, Any], base_model: str | None, backend: str,
                    listing: list[dict[str, Any]] | None, tokenizer: str | None,
                    base_server: str | None = None) -> dict[str, Any]:
    """The base identity of a served run (see the module docstring). ``base_server``: an adapter run whose base is
    served by another server (llama.cpp: one server per adapter) names the base's server; its ``/v1/models`` card
    is then not known here and left out — on both sides, since a base run's own card is kept only for the
    ``parent``/``root`` fields vLLM reports."""
    from lm_eval_toolfid.pairing.identity import ADAPTER_KEYS, LM_EVAL_BOOKKEEPING_KEYS, NON_IDENTITY_KEYS

    name = str(base_model or model_args.get("model") or model_args.get("pretrained") or "")
    ident: dict[str, Any] = {k: str(v) for k, v in sorted(model_args.items())
                             if k not in SERVER_KEYS_NOT_IDENTITY and k not in NON_IDENTITY_KEYS
                             and k not in ADAPTER_KEYS and k not in LM_EVAL_BOOKKEEPING_KEYS and v not in (None, "")}
    ident.update(backend=backend, server=server_origin(str(base_server or model_args["base_url"])), served_model=name)
    card = model_card(listing or [], name) if not base_server else None
    if card:
        ident["model_card"] = json.dumps(card, sort_keys=True)
    ident.update(_name_fingerprint(name))
    fp = tokenizer_fingerprint(tokenizer)
    if fp:
        ident["tokenizer"] = fp
    return ident
