"""lm-eval model ``toolfid-server``: the task against an OpenAI-compatible server (vLLM, SGLang, llama.cpp,
``transformers serve``), every adapter a served model name.

Model args: ``base_url`` (the server: root, ``/v1`` or an endpoint), ``model`` (the served name),
``api`` (``completions``: the prompt text the task renders, as in-process; ``chat``: the conversation and
the case's ``tools=`` to ``/v1/chat/completions``, scored from what the server returns, structured
``tool_calls`` or text), ``num_concurrent`` (requests in flight, default 8; fewer while the server refuses),
``timeout`` (seconds per request), ``max_retries``, ``retry_after_max`` (the longest ``Retry-After`` honoured,
seconds), ``rate_limit_wait`` (how long one request may keep being refused), the key as lm-eval's API models
take it (``OPENAI_API_KEY`` when set; ``api_key_env=NAME`` another variable; ``api_key=`` the key itself, which
``toolfid lm-eval`` moves out of the model args lm-eval records), ``journal`` (a file the answers are appended
to as they arrive; a rerun of the same view asks only the rest), ``tokenizer`` (where the prompts' tokenizer
comes from, for the chat style's local rendering and the run's identity). Adapter runs name their base with
task metadata ``base_model``.

Registered when this module is imported (``toolfid lm-eval`` and ``toolfid run --server`` do).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.flags import parse_flag
from lm_eval_toolfid.integrations.lm_eval.hints import hints_of
from lm_eval_toolfid.serving.client import Asks, Journal, ServedAnswer, ServerClient, ask_many
from lm_eval_toolfid.serving.connection import Connection, connection_from_model_args, remember

log = logging.getLogger("lm_eval.toolfid")

DEFAULT_MAX_GEN_TOKS = 256
CONNECTION_ARGS: dict[str, tuple[str, Any]] = {
    "num_concurrent": ("concurrency", int), "timeout": ("timeout", float), "max_retries": ("max_retries", int),
    "retry_after_max": ("retry_after_max", float), "rate_limit_wait": ("rate_limit_wait", float)}
"""Model args of the connection: ``model_arg -> (Connection field, type)`` (defaults: the Connection's)."""


@register_model("toolfid-server")
class ToolfidServerLM(LM):
    """The task's requests sent to a server, greedy, ``num_concurrent`` in flight."""

    def __init__(self, model: str | None = None, base_url: str | None = None, api: str = "completions",
                 journal: str | None = None, resume: bool | str = True, tokenizer: str | None = None,
                 connection: Connection | None = None, **model_args: Any) -> None:
        """``connection`` (``toolfid run --server``), else the connection the model args describe
        (:data:`CONNECTION_ARGS`, and ``api_key=``/``api_key_env=``/``header=`` as lm-eval's API models take them);
        ``pretrained=`` names the model where ``model=`` is absent; other model args are ignored."""
        super().__init__()
        name = model or model_args.get("pretrained")
        if not base_url or not name:
            raise ToolfidError("toolfid-server needs base_url=URL and model=NAME in --model_args")
        self.model_name, self.base_url, self.api = str(name), str(base_url), str(api)
        if connection is None:  # lm_eval --model_args: the key as lm-eval's API models take it
            settings = {field: cast(model_args[arg]) for arg, (field, cast) in CONNECTION_ARGS.items()
                        if model_args.get(arg) is not None}
            connection = connection_from_model_args(model_args, **settings)
        self.connection = connection
        remember(self.base_url, connection)  # the task's /v1/models lookup uses the same key and headers
        self.client = ServerClient(self.base_url, self.model_name, self.api, connection=connection)
        self.concurrency = connection.concurrency
        self.journal_path = journal
        self.resume = bool(parse_flag(resume, "resume", default=True))
        self.tokenizer_source = tokenizer
        self.answer_hook: Any = None
        """Called ``(answer)`` as each answer arrives (``toolfid run``'s progress line)."""
        self.answers: Journal | None = None
        """The view's journal when its owner opened it beforehand (``toolfid run --server`` shares it with the view
        that asks for this one); None: opened from ``journal`` and ``resume`` at each ``generate_until``."""
        self.companions: list[Asks] = []
        """Other views' requests asked together with this view's, in one pool (``toolfid run --server``: the base
        and every adapter at once); asked once, by the next ``generate_until``."""

    def asks(self, requests: list[Any]) -> Asks:
        """This model's payloads for ``requests`` and the journal their answers go to."""
        journal = self.answers if self.answers is not None else Journal(self.journal_path, resume=self.resume)
        return Asks(self.client, [self._payload(r) for r in requests], journal)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> Any:
        from lm_eval.utils import simple_parse_args_string

        args = simple_parse_args_string(arg_string)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in ("device",
                                                                                                   "batch_size")}
        return cls(**args, **extra)

    def _payload(self, request: Any) -> dict[str, Any]:
        context, gen_kwargs = request.args[0], dict(request.args[1] or {})
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_tokens = int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
        if self.api == "chat":
            hints = hints_of(request)
            chat = hints.chat if hints is not None else None
            prompt = chat if chat is not None else {"messages": [{"role": "user", "content": context}]}
        else:
            prompt = context
        return self.client.payload(prompt, max_tokens, [u for u in until if u])

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        own, companions, hook = self.asks(requests), self.companions, self.answer_hook
        self.companions = []
        try:
            answers = ask_many([own, *companions], self.concurrency,
                               on_answer=(lambda j, i, a: hook(a)) if hook is not None else None)[0]
        finally:
            for job in (own, *companions):
                job.client.close()
        for request, answer in zip(requests, answers):
            request.toolfid_served = served_info(answer)
        return [a.text for a in answers]

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        raise ToolfidError("toolfid-server generates only (tool_use_fidelity); loglikelihood tasks need lm-eval's "
                           "local-completions")

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        raise ToolfidError("toolfid-server generates only (tool_use_fidelity)")


def served_info(answer: ServedAnswer) -> dict[str, Any]:
    """What a served answer says about how it came back (per case; summed by :func:`summarize_served`)."""
    return {"shape": answer.shape, "finish_reason": answer.finish_reason, "parser_error": answer.parser_error,
            "retries": answer.retries, "error": answer.error, "refused": answer.refused}


def summarize_served(infos: list[dict[str, Any] | None], echoed: int) -> dict[str, Any]:
    """Per view: which shape came back (``text`` / ``tool_calls`` / ``empty`` / ``server_error``), tool-call
    arguments the scorer could not read as JSON, answers cut by ``max_tokens``, retried requests, requests the
    server refused for a while (``rate_limited``: 429/503, asked again after its ``Retry-After``), ``server_errors``
    (always 0 now: a request a healthy server fails every time is a failed request, not an answer, and its view is
    not scored; results of earlier versions counted them here, scored as no call), and answers that carried the stop
    string (cut off before scoring)."""
    got = [i for i in infos if isinstance(i, dict)]
    out: dict[str, Any] = {"answers": len(got), "stop_string_echoed": echoed}
    if got:
        out["shapes"] = dict(Counter(i["shape"] for i in got))
        out["parser_errors"] = sum(1 for i in got if i.get("parser_error"))
        out["cut_by_max_tokens"] = sum(1 for i in got if i.get("finish_reason") == "length")
        out["retried"] = sum(1 for i in got if i.get("retries"))
        out["rate_limited"] = sum(1 for i in got if i.get("refused"))
        first = next((i["parser_error"] for i in got if i.get("parser_error")), None)
        if first:
            out["parser_error_example"] = first
        out["server_errors"] = sum(1 for i in got if i["shape"] == "server_error")
        failed = next((i["error"] for i in got if i.get("error")), None)
        if failed:
            out["server_error_example"] = failed
            log.warning("tool_use_fidelity: %d of %d requests failed on the server every time it was asked (e.g. %s); "
                        "they score as no call", out["server_errors"], len(got), failed)
    return out
