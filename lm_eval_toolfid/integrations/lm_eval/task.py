"""The ``tool_use_fidelity`` lm-eval task: thin glue around :class:`FidelityRun`.

lm-eval builds the requests (→ :meth:`FidelityRun.resolve`, before generation), calls
``process_results`` per case (→ :meth:`FidelityRun.score`, whose record and per-metric items are
returned), and aggregates each metric. Every metric's aggregation is the scoring core's; the
case records travel under one key (``fidelity_pass`` in adapter runs, ``cases_scored`` in base
runs), whose aggregation is the run's one finish step.
"""

from __future__ import annotations

import inspect
import json
import logging
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import datasets
from lm_eval.api.metrics import bypass_agg, mean
from lm_eval.api.task import ConfigurableTask

from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.integrations.lm_eval import data_parallel
from lm_eval_toolfid.integrations.lm_eval.fidelity_run import FidelityRun
from lm_eval_toolfid.integrations.lm_eval.greedy import not_greedy, sampling_reason
from lm_eval_toolfid.integrations.lm_eval.request_cache import CacheUse, cache_reason, check_cache, model_identity
from lm_eval_toolfid.integrations.lm_eval.hints import RequestHints, ViewHints, attach as attach_hints
from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings
from lm_eval_toolfid.pairing.identity import RunKey, base_identity, canonical, request_hash
from lm_eval_toolfid.pairing.served import SERVED_BACKENDS, served_adapter, served_identity, server_url
from lm_eval_toolfid.prompts.auto import AUTO
from lm_eval_toolfid.prompts.chat import shipped_chat_template, template_sha
from lm_eval_toolfid.prompts.history import conversation_text
from lm_eval_toolfid.prompts.plain import render_demo_call
from lm_eval_toolfid.prompts.prompter import Prompter, shared_prompter
from lm_eval_toolfid.integrations.lm_eval.generation_record import summarize_generation
from lm_eval_toolfid.scoring.metrics import METRICS, case_items, higher_is_better_map
from lm_eval_toolfid.serving.client import list_models
from lm_eval_toolfid.serving.connection import connection_for

log = logging.getLogger("lm_eval.toolfid")

BACKENDS = {"HFLM": "hf", "VLLM": "vllm", "SGLangLM": "sglang", "HFMultimodalLM": "hf-multimodal",
            "ToolfidServerLM": "toolfid-server", "LocalCompletionsAPI": "local-completions",
            "OpenAICompletionsAPI": "openai-completions", "LocalChatCompletion": "local-chat-completions",
            "OpenAIChatCompletion": "openai-chat-completions"}
MODEL_ALIASES = {"toolfid-hf": "hf", "hf-auto": "hf", "huggingface": "hf"}
"""lm-eval model names that are the ``hf`` backend (``toolfid-hf`` is HFLM with toolfid's engine)."""
LM_EVAL_REQUEST_KEYS = ("system_instruction", "apply_chat_template", "fewshot_as_multiturn", "tokenizer_name")


class _ExpectedUnevenCounts(logging.Filter):
    """Our metrics leave out cases outside their denominator (e.g. hallucination_rate counts valid
    calls only), so lm-eval's "Metrics were not scored on the same number of documents" warning is
    expected for these tasks — and harmless, as they form no groups. Drop it for our tasks only."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("[tool_use_fidelity") and "not scored on the same number" in message)


logging.getLogger("lm_eval.evaluator_utils").addFilter(_ExpectedUnevenCounts())


def cut_at_until(text: str, until: Any) -> str:
    """lm-eval's cut of a generation at its stop sequences (each in turn, as HFLM does)."""
    for term in [until] if isinstance(until, str) else list(until or []):
        if term:
            text = text.split(term)[0]
    return text


def _fail(exc: ToolfidError) -> SystemExit:
    """Inside lm-eval a user error ends the run with one line, not a traceback; ``toolfid lm-eval`` exits with the
    error's own code (a refused key: 7)."""
    out = SystemExit(f"tool_use_fidelity: {exc}")
    out.toolfid_exit_code = exc.exit_code  # type: ignore[attr-defined]
    return out


def backend_name(model: Any) -> str:
    """A registry name as given (``hf``, ``vllm``), or the backend of an LM object: a subclass such
    as ``ToolfidHFLM`` (what ``toolfid run`` loads) is its base class's backend, so in-process and
    CLI runs of one base share a pairing key."""
    if isinstance(model, str):
        return MODEL_ALIASES.get(model, model)
    for cls in type(model).__mro__:
        if cls.__name__ in BACKENDS:
            return BACKENDS[cls.__name__]
    return type(model).__name__.lower()


def _simple_evaluate_locals() -> dict[str, Any] | None:
    """The locals of the ``simple_evaluate`` call running this task (lm-eval's CLI goes through it too)."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "simple_evaluate" and "model" in frame.f_locals:
            return frame.f_locals
        frame = frame.f_back
    return None


def detect_backend() -> str:
    """The lm-eval backend running this task: the ``model`` given to ``simple_evaluate`` (a registry
    name such as ``hf``/``vllm``, or an LM object), found on the call stack; ``unknown`` otherwise."""
    caller = _simple_evaluate_locals()
    return backend_name(caller["model"]) if caller is not None else "unknown"


def caller_model_args() -> dict[str, Any]:
    """The model arguments of the ``simple_evaluate`` call running this task.

    lm-eval copies ``model_args`` into a task's metadata only when it builds the ``TaskManager`` itself;
    with a ``TaskManager`` of the caller's (which this task needs: it is found through ``include_path``)
    the task would not know its model and could neither pair nor store a reference. The arguments come
    from the call (a ``k=v,...`` string or a dict), or from the LM object it was given (HFLM keeps
    ``pretrained``, ``peft``, ``delta``, ``revision``; the loaded weights' dtype).
    """
    caller = _simple_evaluate_locals()
    if caller is None:
        return {}
    raw = caller.get("model_args")
    if isinstance(raw, str) and raw.strip():
        from lm_eval.utils import simple_parse_args_string

        args = dict(simple_parse_args_string(raw))
    elif isinstance(raw, dict):
        args = dict(raw)
    else:
        args = {}
    lm = caller.get("model")
    if not args.get("pretrained") and not isinstance(lm, str) and isinstance(getattr(lm, "pretrained", None), str):
        args = {"pretrained": lm.pretrained, **{k: getattr(lm, k) for k in ("peft", "delta", "revision")
                                              if isinstance(getattr(lm, k, None), str)}}
        dtype = getattr(getattr(lm, "model", None), "dtype", None)
        if dtype is not None:
            args["dtype"] = str(dtype)
    return args


_DOCUMENTS: dict[tuple[int, ...], tuple[list[Case], datasets.DatasetDict, list[dict[str, Any]]]] = {}
"""The ids of a loaded case list's (frozen) cases -> (the list, held; its documents; the same as plain rows): every
view of a run (a hundred adapters) builds its task from the same cases, and an Arrow table of them costs milliseconds
each time."""


class Documents(list):  # type: ignore[type-arg]
    """The task's test documents as plain dicts, with the Arrow table's ``features`` (what lm-eval reads of the
    table): lm-eval iterates a task's documents several times per view (its task's set-up, the requests, the
    results), and an Arrow table formats every row again each time (milliseconds per view; seconds for a hundred
    views)."""

    features: Any = None


def _documents(cases: list[Case]) -> tuple[datasets.DatasetDict, list[dict[str, Any]]]:
    """The task's documents (one row per case: id, prompt, gold tool, expected calls; a conversation's text and depth
    when any case has a history), built once per loaded case list (read only: lm-eval maps into new datasets), and
    the same rows as dicts (each task copies them)."""
    key = tuple(map(id, cases))
    held = _DOCUMENTS.get(key)
    if held is None:
        rows = [{"id": c.id, "prompt": c.prompt, "gold_tool_name": c.gold_tool_name or "",
                 "expected_calls": len(c.expected_calls)} for c in cases]
        if any(c.history for c in cases):  # reports show the conversation and its depth
            for row, c in zip(rows, cases):
                row.update(turn_depth=c.turn_depth, conversation=conversation_text(c))
        if len(_DOCUMENTS) > 16:
            _DOCUMENTS.clear()
        table = datasets.Dataset.from_list(rows)
        held = _DOCUMENTS[key] = (cases, datasets.DatasetDict({"test": table}), list(table))
    return held[1], held[2]


class ToolUseFidelityTask(ConfigurableTask):
    """Generates the call(s) for each case and scores them against the tools' JSON schemas."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        metadata = config.get("metadata") or {}
        if not metadata.get("pretrained"):  # simple_evaluate with a TaskManager of the caller's
            metadata = {**caller_model_args(), **metadata}
        try:
            self.settings = TaskSettings.from_metadata(metadata)
        except ToolfidError as exc:
            raise _fail(exc) from None
        self.backend = self.settings.backend or detect_backend()
        self.served_chat = self.settings.served and str(self.settings.model_args.get("api", "")) == "chat"
        if self.served_chat:  # the server renders its chat template with tools=: the chat style is what it sees
            if self.settings.prompt_style in ("plain", "raw") and metadata.get("prompt_style"):
                raise _fail(ToolfidError(f"api=chat sends the conversation and tools to the server's chat template; "
                                         f"prompt_style {self.settings.prompt_style} cannot apply (drop it, or use "
                                         "api=completions)"))
            self.settings = self.settings.model_copy(update={"prompt_style": "chat"})
        self._echoed: set[str] = set()
        self._prefill = False
        """lm-eval's --apply_chat_template on a style that writes the start of the answer: the prompt goes in the
        user's turn and the primer is the assistant's prefill (:meth:`plain_messages`)."""
        self._cache: CacheUse | None = None
        self._predict_only = False
        self._records: list[dict[str, Any]] = []
        self._scored: dict[int, Any] = {}
        """id of a record handed to lm-eval (held in :attr:`_records`) -> its :class:`PairScore`: the finish step
        reads this process's records back without validating them again (other ranks' arrive as plain dicts)."""
        super().__init__(config=config, **kwargs)

    # --- docs and prompts ------------------------------------------------------------------

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        try:
            self.cases: dict[str, Case] = {c.id: c for c in load_cases(self.settings.cases)}
        except ToolfidError as exc:
            raise _fail(exc) from None
        # expected_calls: how many calls answer the case; a backend that stops generating at the end
        # of the first call (ToolfidHFLM) does so only when every request in its batch expects <= 1
        self.dataset, self._rows_of_docs = _documents(list(self.cases.values()))
        self._position = {cid: i for i, cid in enumerate(self.cases)}
        """case id -> its place in the documents (a launcher's ranks: rank 0 orders the gathered values by it)."""
        self.run = FidelityRun(self.settings, self.cases, task_names=(str(self.config.task),))

    def has_training_docs(self) -> bool:
        return False

    def has_validation_docs(self) -> bool:
        return False

    def has_test_docs(self) -> bool:
        return True

    def test_docs(self) -> Documents:
        """The documents as plain dicts (:class:`Documents`; this task's own copies, built once per task): what
        the Arrow table gives, row by row."""
        docs = self.__dict__.get("_test_docs")
        if docs is None:
            docs = self.__dict__["_test_docs"] = Documents(dict(row) for row in self._rows_of_docs)
            docs.features = self.dataset["test"].features
        return docs

    def case_of(self, doc: dict[str, Any]) -> Case:
        return self.cases[str(doc["id"])]

    @cached_property
    def prompter(self) -> Prompter:
        """The prompt style (``auto`` resolved to plain/chat, or as given); the chat style loads the
        model's chat template once. An ``auto`` run logs one line saying what it chose and why."""
        try:
            prompter = shared_prompter(self.settings.prompt_style, self.settings.demos, self.settings.system_prompt,
                                       self.settings.prompt_model_args, self.settings.chat_template,
                                       self.settings.prompt_template, list(self.cases.values()),
                                       self.settings.plain_demos)
        except ToolfidError as exc:
            raise _fail(exc) from None
        if prompter.choice.requested == AUTO:
            log.info("tool_use_fidelity: %s", prompter.choice.note())
        return prompter

    @property
    def style(self) -> str:
        """The resolved prompt style (``auto`` never)."""
        return self.prompter.settings.style

    def prompt_for(self, case: Case) -> str:
        """The prompt text of a case: what ``doc_to_text`` returns and what the request hash covers."""
        try:
            return self.prompter.render(case)
        except ToolfidError as exc:
            raise _fail(exc) from None

    def doc_iterator(self, *, rank: int = 0, limit: int | None = None, world_size: int = 1,
                     samples: list[int] | None = None) -> Any:
        """lm-eval's documents (``--limit``, ``--samples`` as lm-eval reads them); a launcher's rank takes its share
        dealt by prompt length (:func:`~lm_eval_toolfid.integrations.lm_eval.data_parallel.deal`), not round robin."""
        if int(world_size) <= 1:
            return super().doc_iterator(rank=rank, limit=limit, world_size=world_size, samples=samples)
        docs = list(super().doc_iterator(rank=0, limit=limit, world_size=1, samples=samples))
        lengths = [len(self.prompt_for(self.case_of(doc))) for _, doc in docs]
        return iter([docs[i] for i in data_parallel.deal(lengths, int(rank), int(world_size))])

    def doc_to_text(self, doc: dict[str, Any], doc_to_text: Any = None) -> str:
        return self.prompt_for(self.case_of(doc))

    def fewshot_context(self, doc: dict[str, Any], num_fewshot: int, *args: Any, **kwargs: Any) -> Any:
        """The chat style renders the model's template itself (with per-case tools); lm-eval's
        ``--apply_chat_template`` would wrap that text in the template a second time, so for this
        style the task's rendering wins and lm-eval's is skipped (said once, as a warning)."""
        if self.style == "chat":
            if kwargs.get("apply_chat_template") and not getattr(self, "_warned_double_template", False):
                self._warned_double_template = True
                log.warning("tool_use_fidelity: prompt_style chat renders the chat template itself, with each "
                            "case's tools; lm-eval's --apply_chat_template is ignored for this task (it passes "
                            "no tools and would wrap the rendered prompt a second time)")
            if kwargs.get("system_instruction") and not getattr(self, "_warned_system_instruction", False):
                self._warned_system_instruction = True
                log.warning("tool_use_fidelity: prompt_style chat does not use lm-eval's --system_instruction; "
                            "pass --metadata '{\"system_prompt\": ...}' instead")
            return self.doc_to_text(doc)
        template = kwargs.get("chat_template")
        if not kwargs.get("apply_chat_template") or not callable(template):
            return super().fewshot_context(doc, num_fewshot, *args, **kwargs)
        primer = ""
        try:
            if self.style != "plain":  # raw: the request as the user's turn, the answer the assistant's
                return super().fewshot_context(doc, num_fewshot, *args, **kwargs)
            messages = self.plain_messages(self.case_of(doc), kwargs.get("system_instruction"),
                                           kwargs.get("fewshot_as_multiturn"))
            primer = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
            return template(messages, add_generation_prompt=not primer)
        except Exception as exc:  # noqa: BLE001 - the template's own error, named in one line
            what = ("cannot continue an assistant turn the task starts (the answer's opening is the assistant's "
                    "prefill)" if primer else "cannot render this prompt")
            said = str(exc).split(". ")[0].strip()[:200]
            raise _fail(ToolfidError(
                f"--apply_chat_template: the model's chat template {what} ({type(exc).__name__}: {said}); drop the "
                "flag, or use --metadata '{\"prompt_style\": \"chat\"}' (the task renders the model's own chat "
                "template with each case's tools)")) from None

    def plain_messages(self, case: Case, system: str | None = None, multiturn: bool | None = False) -> list[dict[str, str]]:
        """The plain prompt as chat turns, for lm-eval's ``--apply_chat_template``: lm-eval's system instruction, the
        prompt in the user's turn (``--fewshot_as_multiturn``: each demonstration a user turn and its call the
        assistant's, the case's request the last user turn) and, where the prompt starts the answer (plain-v3's
        primer), that start as the assistant's turn for the model to continue."""
        turns = self.prompter.plain_turns(case)
        messages = [{"role": "system", "content": system}] if system else []
        if multiturn and turns.demos:
            lead = turns.instruction + "\n\n" if turns.instruction else ""
            for head, call in turns.demos:
                messages += [{"role": "user", "content": lead + head}, {"role": "assistant", "content": call}]
                lead = ""
            messages.append({"role": "user", "content": lead + turns.request})
        else:
            text = turns.text()
            messages.append({"role": "user", "content": text[:len(text) - len(turns.primer)]})
        if turns.primer:
            messages.append({"role": "assistant", "content": turns.primer})
        return messages

    def doc_to_target(self, doc: dict[str, Any], doc_to_target: Any = None) -> str:
        case = self.case_of(doc)
        if case.irrelevant:
            return ""
        if case.gold_arguments is not None:
            return render_demo_call(case.gold_tool_name, case.gold_arguments)
        return case.gold_tool_name or ""

    def gen_kwargs_for(self, case: Case) -> dict[str, Any]:
        """The generation settings one case is generated with."""
        gen = dict(self.config.generation_kwargs or {})
        if case.max_new_tokens is not None:
            gen["max_gen_toks"] = case.max_new_tokens
        return gen

    # --- build: identity and pairing, before any generation --------------------------------

    def build_all_requests(self, **kwargs: Any) -> None:
        gen = dict(self.config.generation_kwargs or {})
        if self.style == "chat":  # the chat style's stop sequences: the template's end of turn, no "\n###"
            given = gen.get("until")
            given = [given] if isinstance(given, str) else list(given or [])
            until = self.prompter.until(given)
            if until != given:
                self.config.generation_kwargs = {**gen, "until": until}
        self._prefill = bool(kwargs.get("apply_chat_template")) and self.style == "plain" and bool(self.prompter.primer)
        lm_requests = {k: kwargs.get(k) for k in LM_EVAL_REQUEST_KEYS if kwargs.get(k) not in (None, False, "")}
        if not lm_requests.get("apply_chat_template"):  # these act only through lm-eval's chat template
            lm_requests = {k: v for k, v in lm_requests.items() if k not in ("fewshot_as_multiturn", "tokenizer_name")}
        if self.style == "chat":  # the task renders the template; lm-eval's wrapping is skipped
            lm_requests = {k: v for k, v in lm_requests.items()
                           if k not in ("apply_chat_template", "system_instruction", "fewshot_as_multiturn",
                                        "tokenizer_name")}
        # every case this run will score (all ranks): lm-eval's own iterator with its limit/samples
        scored = [str(doc["id"]) for _, doc in self.doc_iterator(rank=0, world_size=1, limit=kwargs.get("limit"),
                                                                 samples=kwargs.get("samples"))]
        try:
            self.run.resolve(self._run_key(lm_requests), scored_ids=scored, request_hashes={
                cid: request_hash(self.prompt_for(case),
                                  {**self.gen_kwargs_for(case), **({"lm_eval": lm_requests} if lm_requests else {})})
                for cid, case in self.cases.items()}, primed=bool(self.prompter.primer))
        except ToolfidError as exc:
            raise _fail(exc) from None
        self.run.provenance.update(prompt=self.prompter.settings.fingerprint(), **self.prompter.provenance())
        if lm_requests.get("apply_chat_template"):
            self.run.provenance["lm_eval_chat_template"] = (
                "the prompt in the user's turn, the answer's opening as the assistant's prefill" if self._prefill
                else "the prompt in the user's turn, the answer in the assistant's")
        sampling = not_greedy(self.config.generation_kwargs)
        if sampling:
            self.run.provenance["not_greedy"] = sampling
            self.run.withhold(sampling_reason(sampling))
        self._note_adapter_template()
        data_parallel.start(str(self.config.task))
        data_parallel.rows_from(str(self.config.task), self._request_rows)
        super().build_all_requests(**kwargs)
        self._attach_generation_hints()
        self._check_request_cache()

    def _check_request_cache(self) -> None:
        """lm-eval's request cache (``--use_cache``): which of this run's answers it will give, and whether this
        model wrote them (:mod:`~lm_eval_toolfid.integrations.lm_eval.request_cache`)."""
        key = self.run.key
        use = check_cache(self._instances or [], model_identity(key.base if key is not None else None,
                                                                self.settings.adapter))
        self._cache = use
        if use is None:
            return
        # what the cache gives is said with the verdict (or the base reference not written), at the end
        self.run.provenance["request_cache"] = {"path": use.path_given, "requests": use.total,
                                                "from_cache_other_model": len(use.foreign), "from_cache_own": use.own}

    def _attach_generation_hints(self) -> None:
        """Tell the LM, per request, what the scorer puts in front of the generation (the stop rule reads
        it too), whether to verify and the base's answer to verify, and whether to decode it a second time
        without the early stop (``check_stops``): one :class:`RequestHints` per request (its view's settings in
        one shared :class:`ViewHints`), read by toolfid's model classes, ignored by other LMs. Set on every
        instance, cached ones included."""
        to_check = self.settings.check_stops
        view = ViewHints(verify=self.settings.verify, prefix_cache=self.settings.prefix_cache)
        for inst in self._instances or []:
            case = self.cases.get(str(inst.doc.get("id"))) if isinstance(inst.doc, dict) else None
            primer = self.prompter.answer_prefix(case) if case is not None else ""
            check = bool(to_check) and case is not None and len(case.expected_calls) <= 1
            to_check -= check
            draft = None
            if self.settings.verify is not False and self.settings.is_adapter_run and isinstance(inst.doc, dict):
                text = self.run.base_text(str(inst.doc.get("id")))
                if text is not None:
                    draft = text[len(primer):] if primer and text.startswith(primer) else text
            chat = self.prompter.chat_request(case) if self.served_chat and case is not None else None
            attach_hints(inst, RequestHints(answer_prefix=primer, chat=chat, check_stop=check, draft=draft, view=view))

    def _note_adapter_template(self) -> None:
        """An adapter folder that ships its own chat template: both views are rendered with the base's
        tokenizer (what lm-eval's HFLM loads too), and the run says so — or why they are not."""
        path = self.settings.adapter_path
        if not path or not Path(path).is_dir():
            return
        shipped = shipped_chat_template(path)
        source = self.settings.model_args.get("tokenizer") or self.settings.model_args.get("pretrained")
        if shipped is None:
            if any((Path(path) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
                self.run.provenance["adapter_chat_template"] = (
                    f"{path} ships a tokenizer (no chat template), not used: both views are tokenized and rendered "
                    f"with the tokenizer of {source}")
            return
        file, template = shipped
        chat, sha = self.prompter.chat, template_sha(template)
        if chat is None:
            note = (f"{file} ships a chat template (sha256 {sha[:12]}); both views use the {self.style} prompt "
                    f"style ({self.prompter.choice.reason})")
        elif sha == chat.sha:
            note = f"{file}: the same chat template as the one rendering both views ({chat.source})"
        else:
            note = (f"{file} ships another chat template (sha256 {sha[:12]}), not used: both views are rendered "
                    f"with the chat template of {chat.source}, as lm-eval loads the tokenizer of pretrained= "
                    "(or tokenizer=)")
            log.warning("tool_use_fidelity: adapter %s", note)
        if self.settings.model_args.get("tokenizer") and not self.run.references:
            note += ("; this adapter run renders with tokenizer=" + str(self.settings.model_args["tokenizer"]) +
                     ": a base run pairs only if it rendered with the same chat template (pass the same tokenizer=)")
        self.run.provenance["adapter_chat_template"] = note

    def _served_base(self) -> dict[str, Any]:
        """A served run's base identity (the server asked what it serves); an adapter run that names no base
        but is served as an adapter is refused here, in one line."""
        s = self.settings
        base_url = str(s.model_args["base_url"])
        listing = list_models(server_url(base_url), connection_for(base_url, s.model_args))  # its key and headers
        served_adapter(s.model_args, s.base_model, listing)
        if self.backend in ("local-chat-completions", "openai-chat-completions"):
            raise ToolfidError(f"lm-eval's {self.backend} sends no per-case tools= and wraps the prompt in messages: use "
                               "--model toolfid-server with api=chat (the conversation and the case's tools), or "
                               "--model local-completions with tokenized_requests=False (the prompt the task renders)")
        if self.backend == "local-completions" and str(s.model_args.get("tokenized_requests", "true")).lower() != "false":
            raise ToolfidError("tool_use_fidelity sends the prompt text it renders: add tokenized_requests=False to "
                               "--model_args (token ids would be re-tokenized client-side and cut at max_length)")
        shape = SERVED_BACKENDS.get(self.backend, self.backend)
        if self.backend == "toolfid-server" and str(s.model_args.get("api", "completions")) == "chat":
            shape = "openai-chat-tools"
        if s.base_server and not s.is_adapter_run:
            raise ToolfidError("base_server names the base's server for an adapter run: pass base_model too")
        return served_identity(s.model_args, s.base_model, shape, listing, s.tokenizer_source,
                               s.base_server if s.is_adapter_run else None)

    def _run_key(self, lm_requests: dict[str, Any]) -> RunKey | None:
        if self.settings.served:
            base = self._served_base()
        elif self.settings.model_args.get("pretrained"):
            base = base_identity(self.settings.model_args, self.backend)
        else:
            log.warning("tool_use_fidelity: no 'pretrained' in model_args/metadata: cannot pair or store a reference")
            return None
        generation = json.loads(canonical(dict(self.config.generation_kwargs or {})))
        if lm_requests:
            generation["lm_eval"] = json.loads(canonical(lm_requests))
        return RunKey(base=base, case_set=self.run.case_set, prompt=self.prompter.settings.fingerprint(),
                      generation=generation)

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any) -> Any:
        instance = super().construct_requests(doc, ctx, **kwargs)
        case = self.case_of(doc)
        if case.max_new_tokens is not None:
            instance.arguments[1]["max_gen_toks"] = case.max_new_tokens
        return instance

    # --- per case --------------------------------------------------------------------------

    @property
    def record_key(self) -> str:
        return "fidelity_pass" if self.settings.is_adapter_run else "cases_scored"

    def override_metric(self, metric_name: str) -> None:
        """lm-eval's ``--predict_only`` (``bypass``): answers and samples only — no metrics, no verdict, no base
        reference."""
        super().override_metric(metric_name)
        self._predict_only = True

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        if self._predict_only:
            data_parallel.emitted(str(self.config.task), self._position.get(str(doc["id"]), 0), ("bypass",))
            return {"bypass": None}
        text = results[0] if results else ""
        text = text if isinstance(text, str) else ("" if text is None else str(text))
        if self.settings.served:  # servers may return the stop string (transformers serve): lm-eval's cut, as HF's
            cut = cut_at_until(text, (self.config.generation_kwargs or {}).get("until"))
            if cut != text:
                self._echoed.add(str(doc["id"]))
            text = cut
        case = self.case_of(doc)
        record = self.run.score(str(doc["id"]), self.prompter.answer(text, case), primed=self.prompter.primed(case))
        if self._cache is not None and str(doc["id"]) in self._cache.foreign:
            record = record.model_copy(update={"answer_source": "request_cache"})
        dumped = record.model_dump(mode="json")
        self._records.append(dumped)
        self._scored[id(dumped)] = record  # what the finish step reads back (held: the id stays this dict's)
        # the record first: its aggregation is the run's finish step, which the verdict's columns read
        items: dict[str, Any] = {self.record_key: dumped}
        if self.settings.is_adapter_run:  # run-level columns: no per-case value (samples hold the record once)
            items.update(cases_scored=None, fidelity_decided=None)
        else:
            items.update(fidelity_pass=None, fidelity_decided=None)
        if not self._paired:  # the paired columns, present and null in a run with no base to pair with
            items.update({m.name: None for m in METRICS if m.paired})
        # a custom aggregate's column is there even when no case is in its denominator (null; lm-eval's mean
        # cannot take a null item, so a rate with no case in its denominator has no column: docs/metrics.md)
        items.update({m.name: None for m in METRICS if m.kind != "rate" and (self._paired or not m.paired)})
        items.update(case_items(record))
        if self.run.calibration is not None and record.relevant:
            items["json_valid_z"] = int(record.ft.valid)
        data_parallel.emitted(str(self.config.task), self._position.get(str(doc["id"]), 0), items)
        return items

    @property
    def _paired(self) -> bool:
        """The run has a base to pair with (an adapter run that found its base's answers): the paired columns have
        values; otherwise they are present and null (a base run, an adapter run with no base run)."""
        return self.settings.is_adapter_run and bool(self.run.references)

    # --- aggregation -----------------------------------------------------------------------

    def _request_rows(self) -> list[tuple[int, Any, str, str | None, str | None]]:
        """Per request of this process: (the case's position, its generation record, the case id, the answer, the
        answer run on past the early stop (``check_stops``) or None)."""
        rows = []
        for inst in self._instances or []:
            doc = inst.doc if isinstance(inst.doc, dict) else {}
            cid = str(doc.get("id", ""))
            answer = inst.resps[0] if inst.resps else None
            rows.append((self._position.get(cid, 0), getattr(inst, "toolfid_generation", None), cid,
                         answer if isinstance(answer, str) or answer is None else str(answer),
                         getattr(inst, "toolfid_unstopped", None)))
        return rows

    def _rows(self) -> list[tuple[int, Any, str, str | None, str | None]]:
        """Every request's row: every rank's, gathered to rank 0, under a launcher; this process's otherwise."""
        gathered = data_parallel.gathered_rows(str(self.config.task))
        return gathered if gathered is not None else self._request_rows()

    def _finish(self, records: list[dict[str, Any]]) -> float:
        rows = self._rows()
        infos = [row[1] for row in rows]
        self.run.provenance["generation"] = summarize_generation(infos, verify=self.settings.verify,
                                                               adapter_view=self.settings.is_adapter_run)
        if self.settings.served:
            from lm_eval_toolfid.integrations.lm_eval.served_model import summarize_served

            self.run.provenance["served"] = summarize_served(
                [getattr(inst, "toolfid_served", None) for inst in self._instances or []], len(self._echoed))
        if self.settings.check_stops:
            self._check_stops(rows)
        foreign = sum(1 for r in records if isinstance(r, dict) and r.get("answer_source") == "request_cache")
        if foreign:
            self.run.withhold(cache_reason(foreign, len(records), (self.run.provenance.get("request_cache") or {}).get(
                "path")))
        if self._cache is not None:
            self._cache.record_generated()
        conclusion = self.run.finish([self._scored.get(id(r), r) for r in records])
        if isinstance(self.config.metadata, dict):
            self.config.metadata["toolfid"] = self.run.provenance
        return conclusion.pass_value if self.settings.is_adapter_run else float(conclusion.summary.n)

    def _decided(self, items: list[Any]) -> float | None:
        """``fidelity_decided``, from the run's conclusion (its finish runs first: the record is the first column;
        where lm-eval aggregated in another order, the records this process scored finish it)."""
        if self.run.conclusion is None and self._records:
            self._finish(list(self._records))
        conclusion = self.run.conclusion
        return conclusion.decided_value if conclusion is not None else None

    def _check_stops(self, requests: list[tuple[int, Any, str, str | None, str | None]]) -> None:
        """``check_stops``: the rows the LM decoded a second time without the early stop, scored both ways."""
        rows = []
        for _, _, cid, stopped, full in requests:
            case = self.cases.get(cid)
            if full is None or stopped is None or case is None:
                continue
            rows.append((case.id, self.prompter.answer(stopped, case), self.prompter.answer(full, case)))
        self.run.check_stops(rows, asked=self.settings.check_stops)

    def _z(self, items: list[int]) -> float:
        assert self.run.calibration is not None
        return self.run.calibration.z(mean(items), n=len(items))

    def aggregation(self) -> dict[str, Callable[[list[Any]], Any]]:
        if self._predict_only:
            return {"bypass": bypass_agg}
        adapter = self.settings.is_adapter_run
        aggs: dict[str, Callable[[list[Any]], Any]] = {
            m.name: (_null if m.paired and not self._paired else mean if m.kind == "rate" else _defined(m.aggregate))
            for m in METRICS}
        aggs.update(fidelity_pass=_null, fidelity_decided=self._decided if adapter else _null, cases_scored=len)
        aggs[self.record_key] = self._finish
        aggs["json_valid_z"] = self._z
        return aggs

    def higher_is_better(self) -> dict[str, bool]:
        """What a leaderboard sorts by: every metric whose direction means better. Left out where neither does
        (a metric whose ``higher_is_better`` is None, ``cases_scored``, ``fidelity_decided``: p-values, counts,
        flags)."""
        if self._predict_only:
            return {"bypass": True}
        return {**higher_is_better_map(), "fidelity_pass": True, "json_valid_z": True}


def _defined(aggregate: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """A custom aggregation over the cases in its denominator (the items that are not null); null when none is."""
    def over_defined(items: list[Any]) -> Any:
        defined = [i for i in items if i is not None]
        return aggregate(defined) if defined else None
    return over_defined


def _null(items: list[Any]) -> None:
    """The aggregate of a column that has no value in this run (an adapter-run metric in a base run)."""
    return None
