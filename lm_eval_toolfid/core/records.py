"""Typed records that flow between the stages: case → parsed calls → outcome → pair → summary.

Data flows one way: ``cases`` builds :class:`Case`; ``parsing`` turns text into
:class:`ParsedGeneration`; ``scoring`` turns a generation plus a case into an
:class:`Outcome` and two outcomes into a :class:`PairScore`; ``stats``/``scoring``
aggregate those into a :class:`Summary`; ``verdict`` judges a summary.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lm_eval_toolfid.core.jsonsafe import bounded_copy, clean_text


class ToolSpec(BaseModel):
    """An OpenAI-style function spec: ``{"name", "description", "parameters"}``.

    The wrapped form ``{"type": "function", "function": {...}}`` is accepted and unwrapped.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @model_validator(mode="before")
    @classmethod
    def _unwrap(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") == "function" and isinstance(data.get("function"), dict):
            return data["function"]
        return data

    def for_prompt(self) -> dict[str, Any]:
        """The spec exactly as the model is shown it."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


class GoldCall(BaseModel):
    """One expected call.

    ``arguments``: the exact expected values. ``options``: acceptable values per parameter, BFCL-style —
    each parameter maps to a list of acceptable values; ``""`` in the list means the parameter may be
    omitted; an acceptable value that is a dict is itself an options map (nested parameters), and an
    acceptable list value is compared element-wise with the same rules. Give one of the two, or neither
    (only the name is checked).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | None = None
    options: dict[str, list[Any]] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> GoldCall:
        if self.arguments is not None and self.options is not None:
            raise ValueError("a gold call gives 'arguments' or 'options', not both")
        return self

    @property
    def has_values(self) -> bool:
        return self.arguments is not None or self.options is not None


class HistoryCall(BaseModel):
    """A call the assistant made earlier in the conversation (an OpenAI ``tool_calls`` entry, normalised).

    Accepted as ``{"id", "type": "function", "function": {"name", "arguments"}}`` (``arguments`` a JSON
    object or a string holding one, as the OpenAI API sends it) or flat ``{"id", "name", "arguments"}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = None
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _openai_shape(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("function"), dict):
            if data.get("type", "function") != "function":
                raise ValueError(f"tool_calls entry of type {data.get('type')!r}: only 'function' calls are known")
            extra = sorted(set(data) - {"id", "type", "function"})
            if extra:
                raise ValueError(f"unknown field(s) in a tool_calls entry: {', '.join(extra)}")
            fn = data["function"]
            data = {"id": data.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments", {})}
        if isinstance(data, dict) and isinstance(data.get("arguments"), str):
            try:
                decoded = json.loads(data["arguments"])
            except ValueError:
                raise ValueError("a history call's 'arguments' is a string that is not JSON") from None
            data = {**data, "arguments": decoded}
        if isinstance(data, dict) and data.get("arguments") is None and "arguments" in data:
            data = {**data, "arguments": {}}
        return data


class Message(BaseModel):
    """One earlier turn of the conversation, in the OpenAI message shape.

    - ``user``: ``content`` (the user's words);
    - ``assistant``: ``content`` and/or ``tool_calls`` (the calls it made);
    - ``tool``: ``content`` (the recorded result; a JSON value is stored as its JSON text),
      ``tool_call_id`` (the call it answers) and ``name`` (the tool that answered; filled in from the
      call when absent).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[HistoryCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _result_as_text(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("role") == "tool" and isinstance(data.get("content"), (dict, list)):
            data = {**data, "content": json.dumps(data["content"], ensure_ascii=False)}
        if isinstance(data, dict) and data.get("role") == "system":
            raise ValueError("a system message cannot be part of a case's history: put it in the task's "
                             "system_prompt setting (chat style) or at the start of the prompt")
        return data

    @model_validator(mode="after")
    def _shape_fits_role(self) -> Message:
        if self.role == "user":
            if not self.content or self.tool_calls or self.tool_call_id:
                raise ValueError("a user turn has non-empty 'content' only")
        elif self.role == "assistant":
            if self.tool_call_id or self.name:
                raise ValueError("an assistant turn has 'content' and/or 'tool_calls' only")
            if not self.content and not self.tool_calls:
                raise ValueError("an assistant turn needs 'content' or 'tool_calls'")
        else:
            if self.tool_calls:
                raise ValueError("a tool turn carries a result ('content'), not 'tool_calls'")
            if self.content is None:
                raise ValueError("a tool turn needs 'content' (the recorded result)")
        return self


class Case(BaseModel):
    """One evaluation case: a request, the tools offered, the call(s) it should make — or none.

    - one expected call: ``gold_tool_name`` (and optionally ``gold_arguments``);
    - several (parallel) calls: ``gold_calls`` (matched order-insensitively, by name);
    - irrelevance (no offered tool fits, the right answer is no call): ``gold_tool_name: null``
      with no ``gold_calls``, or ``irrelevant: true``.

    ``prompt`` is the user's first request. ``history`` (optional) is the conversation that followed it,
    in the OpenAI message shape: assistant turns with the ``tool_calls`` they made, ``tool`` turns with
    the recorded results, further user turns. The case asks for the assistant's *next* step after the
    history: the expected call(s), or no call (answer from the results, like an irrelevance case).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    tools: list[ToolSpec]
    """The tools offered; empty only for an irrelevance case (no tool at all: any call is a false call)."""
    gold_tool_name: str | None = None
    allowed_tools: list[str] | None = None
    max_new_tokens: int | None = Field(default=None, gt=0, le=8192)
    gold_arguments: dict[str, Any] | None = None
    gold_calls: list[GoldCall] | None = None
    irrelevant: bool = False
    category: str | None = None
    """Where the case comes from (e.g. a BFCL category); used by breakdowns only."""
    history: list[Message] = Field(default_factory=list)
    """The conversation after ``prompt`` and before the step this case asks for (empty: single-turn)."""

    @model_validator(mode="before")
    @classmethod
    def _accept_single_tool_spec(cls, data: Any) -> Any:
        """The original design's single ``tool_spec`` becomes a one-tool ``tools`` list."""
        if isinstance(data, dict) and "tool_spec" in data:
            if "tools" in data:
                raise ValueError("give either 'tools' or 'tool_spec', not both")
            data = {**data, "tools": [data["tool_spec"]]}
            del data["tool_spec"]
        if isinstance(data, dict) and isinstance(data.get("id"), int):
            data = {**data, "id": str(data["id"])}
        return data

    @field_validator("tools")
    @classmethod
    def _unique_tool_names(cls, tools: list[ToolSpec]) -> list[ToolSpec]:
        names = [t.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate tool names offered: {', '.join(dupes)}")
        return tools

    @model_validator(mode="after")
    def _gold_is_consistent(self) -> Case:
        calls = self.gold_calls or []
        if self.irrelevant:
            if self.gold_tool_name is not None or calls or self.gold_arguments is not None:
                raise ValueError("an irrelevant case (no call expected) cannot name a gold tool or gold calls")
            return self
        if self.gold_tool_name is None and not calls:
            if "gold_tool_name" not in self.model_fields_set:  # said nothing: never an irrelevance case by default
                raise ValueError("the case does not say what it expects: give gold_tool_name (or gold_calls) for "
                                 "the expected call, or \"irrelevant\": true (or \"gold_tool_name\": null) when "
                                 "the right answer is no call")
            object.__setattr__(self, "irrelevant", True)  # gold_tool_name: null → no call expected
            if self.gold_arguments is not None:
                raise ValueError("gold_arguments need a gold_tool_name")
            return self
        if not self.tools:
            raise ValueError("the case expects a call but offers no tools: 'tools' may be empty only for an "
                             "irrelevance case (irrelevant: true, or gold_tool_name: null)")
        if self.gold_tool_name is None:
            object.__setattr__(self, "gold_tool_name", calls[0].name)
        if calls and self.gold_arguments is not None:
            raise ValueError("give gold_arguments (one call) or gold_calls, not both")
        if calls and self.gold_tool_name not in {c.name for c in calls}:
            raise ValueError(f"gold_tool_name {self.gold_tool_name!r} is not among gold_calls")
        for name in [self.gold_tool_name, *(c.name for c in calls)]:
            if name not in self.tool_names:
                raise ValueError(
                    f"gold tool {name!r} is not among the offered tools ({', '.join(self.tool_names)})"
                )
        return self

    @model_validator(mode="after")
    def _history_is_a_conversation(self) -> Case:
        """Calls in the history name offered tools; each assistant turn's calls are answered, one tool
        turn per call, before the conversation goes on; the history ends where the assistant speaks next."""
        if not self.history:
            return self
        offered = set(self.tool_names)
        messages = list(self.history)
        fixed: list[Message] = []
        pending: list[HistoryCall] = []
        n_calls = 0
        for i, msg in enumerate(messages):
            where = f"history[{i}]"
            if msg.role == "tool":
                if not pending:
                    raise ValueError(f"{where}: a tool turn must answer a call of the assistant turn before it")
                if msg.tool_call_id is not None:
                    call = next((c for c in pending if c.id == msg.tool_call_id), None)
                    if call is None:
                        raise ValueError(f"{where}: tool_call_id {msg.tool_call_id!r} answers no pending call "
                                         f"(pending: {', '.join(str(c.id) for c in pending)})")
                else:
                    call = pending[0]
                if msg.name is not None and msg.name != call.name:
                    raise ValueError(f"{where}: tool turn names {msg.name!r} but answers a call of {call.name!r}")
                pending.remove(call)
                fixed.append(msg.model_copy(update={"tool_call_id": call.id, "name": call.name}))
                continue
            if pending:
                raise ValueError(f"{where}: the calls of the assistant turn before it are not all answered "
                                 f"(no tool turn for {', '.join(c.name for c in pending)})")
            if msg.role == "assistant" and msg.tool_calls:
                calls = []
                for call in msg.tool_calls:
                    if call.name not in offered:
                        raise ValueError(f"{where}: the history calls {call.name!r}, which is not among the "
                                         f"offered tools ({', '.join(self.tool_names)})")
                    calls.append(call if call.id is not None else call.model_copy(update={"id": f"call_{n_calls}"}))
                    n_calls += 1
                ids = [c.id for c in calls]
                if len(set(ids)) != len(ids):
                    raise ValueError(f"{where}: two tool_calls share an id")
                pending = list(calls)
                msg = msg.model_copy(update={"tool_calls": calls})
            fixed.append(msg)
        if pending:
            raise ValueError(f"history ends with unanswered calls ({', '.join(c.name for c in pending)}): add "
                             "their tool turns")
        if fixed[-1].role == "assistant":
            raise ValueError("history ends with an assistant turn: the case asks for the assistant's next step, "
                             "so the history ends with a tool result or a user turn")
        object.__setattr__(self, "history", fixed)
        return self

    @property
    def turn_depth(self) -> int:
        """1 for a single request; 1 + the assistant turns in the history for a conversation."""
        return 1 + sum(1 for m in self.history if m.role == "assistant")

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    @property
    def gold_tool(self) -> ToolSpec | None:
        """The expected tool (the first expected call's); None for an irrelevance case."""
        return self.tool(self.gold_tool_name) if self.gold_tool_name is not None else None

    @property
    def expected_calls(self) -> list[GoldCall]:
        """Every call the case expects (empty for irrelevance)."""
        if self.irrelevant:
            return []
        if self.gold_calls:
            return list(self.gold_calls)
        assert self.gold_tool_name is not None
        return [GoldCall(name=self.gold_tool_name, arguments=self.gold_arguments)]


class SurfaceFormat(str, Enum):
    """How a call was written: the most specific convention the parser recognised.

    Marker-delimited formats (Hermes ``<tool_call>``, Mistral ``[TOOL_CALLS]``, Llama
    ``<|python_tag|>``, Qwen3-coder ``<function=...>``) win; otherwise an object convention
    (OpenAI ``function`` wrapper / string-encoded arguments, Llama ``"parameters"``); otherwise
    where the JSON sat (whole text, fenced block, embedded in prose). See ``docs/formats.md``.
    """

    BARE_JSON = "bare_json"
    FENCED = "fenced"
    EMBEDDED = "embedded"
    HERMES = "hermes"
    QWEN_XML = "qwen_xml"
    LLAMA = "llama"
    MISTRAL = "mistral"
    OPENAI = "openai"
    PYTHONIC = "pythonic"


class ToolCall(BaseModel):
    """One call as written by the model; ``name``/``arguments`` are raw (not yet checked)."""

    model_config = ConfigDict(frozen=True)

    name: Any = None
    arguments: Any = None
    surface: SurfaceFormat
    raw: dict[str, Any]
    flags: tuple[str, ...] = ()
    """Parser notes, e.g. ``arguments_string_decoded`` (arguments arrived as a JSON string)."""


class ParsedGeneration(BaseModel):
    """Everything the parser found in one generation."""

    model_config = ConfigDict(frozen=True)

    calls: list[ToolCall] = Field(default_factory=list)
    saw_object_start: bool = False
    """A ``{`` appeared but nothing parsed: the text tried to be JSON and failed."""
    malformed_formats: tuple[SurfaceFormat, ...] = ()
    """Formats whose markers or shape appeared (``<tool_call>``, ``[TOOL_CALLS]``, ``<function=``,
    ``f(...)``...) but yielded no call: an attempted call in that format that did not parse."""

    @property
    def malformed(self) -> bool:
        """No call, but the text attempted one (JSON or any other format)."""
        return not self.calls and (self.saw_object_start or bool(self.malformed_formats))


class OutcomeKind(str, Enum):
    """Taxonomy of what a generation amounted to, worst to best."""

    NO_CALL = "no_call"  # nothing call-like: prose, empty
    MALFORMED = "malformed"  # tried to write a call, did not parse (truncated, syntax error)
    WRONG_SHAPE = "wrong_shape"  # parsed, but not {"name": str, "arguments": object}
    SCHEMA_ERROR = "schema_error"  # arguments violate the tool's JSON schema
    VALID = "valid"

    @property
    def parsed(self) -> bool:
        return self not in (OutcomeKind.NO_CALL, OutcomeKind.MALFORMED)

    @property
    def rank(self) -> int:
        return _KIND_ORDER.index(self)


_KIND_ORDER = [OutcomeKind.NO_CALL, OutcomeKind.MALFORMED, OutcomeKind.WRONG_SHAPE, OutcomeKind.SCHEMA_ERROR,
               OutcomeKind.VALID]

# --- bounded copies: records never hold unbounded model output -----------------------------
MAX_DEPTH = 24
"""Nesting kept in a record's copy of arguments; deeper values become the string ``"<…depth>"``."""
MAX_ITEMS = 200
"""Items kept per object/array in a record's copy; the rest become one ``"<…N more>"`` marker."""
MAX_STR = 2_000
"""Characters kept per string of a record's copy of arguments."""
MAX_TEXT = 65_536
"""Characters kept of a generation's text in a record (generations are bounded by ``max_gen_toks``;
a longer one is cut and marked, and a base reference built from it says so)."""


def bounded(value: Any) -> Any:
    """A JSON-safe copy of ``value`` with nesting, width and string length capped (see the constants;
    :func:`lm_eval_toolfid.core.jsonsafe.bounded_copy` says what is cut and how the cut is marked).

    Scoring validates the model's full arguments; only the copy kept in records (samples files,
    references, reports) is bounded, so serialising a record can never hit a depth or size limit.
    """
    return bounded_copy(value, max_depth=MAX_DEPTH, max_items=MAX_ITEMS, max_str=MAX_STR)


def bounded_text(text: str | None) -> str | None:
    """A generation as records keep it: lone surrogates replaced, cut at :data:`MAX_TEXT` characters."""
    if text is None:
        return None
    text = clean_text(text)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"<…{len(text) - MAX_TEXT} chars>"


class CallOutcome(BaseModel):
    """One call of a generation, scored against the tool it names."""

    model_config = ConfigDict(frozen=True)

    kind: OutcomeKind
    keyword: str | None = None
    """SCHEMA_ERROR: the failing JSON-Schema keyword (``required``, ``enum``, ``type``…);
    WRONG_SHAPE: which part was wrong (``name``, ``arguments``, ``arguments_string``)."""
    detail: str | None = None
    name: str | None = None
    arguments: Any = None
    """A bounded copy (see :func:`bounded`) of the arguments as written."""
    surface: str | None = None
    flags: list[str] = Field(default_factory=list)
    offered: bool | None = None
    """The call names one of the case's offered tools (None: no usable name)."""
    hallucinated: bool | None = None
    """The call names a tool outside the declared surface (or ≠ any expected tool when none is declared);
    None when the call has no usable name."""


class Outcome(BaseModel):
    """One view (base or adapter) of one case: every call scored, and what the case amounts to.

    ``kind`` is the case's outcome: ``no_call``/``malformed`` when no call was parsed, else the worst
    call's kind (the case is ``valid`` only when every call is). ``keyword``/``detail`` come from that
    worst call; ``name``/``arguments``/``surface`` from the first call (for tables and reports).
    """

    model_config = ConfigDict(frozen=True)

    kind: OutcomeKind
    keyword: str | None = None
    detail: str | None = None
    name: str | None = None
    arguments: Any = None
    surface: str | None = None
    n_calls: int = 0
    calls: list[CallOutcome] = Field(default_factory=list)
    hallucinated: bool | None = None
    """Only for VALID outcomes (the original definition): some call is outside the declared surface."""
    attempted: bool = False
    """The text tried to make a call (a call parsed, or a malformed attempt): for irrelevance cases."""
    gold_tool: bool | None = None
    """The called tools are exactly the expected ones (a multiset); None for irrelevance cases."""
    gold_args: bool | None = None
    """Every expected call is matched by a call with the expected values; None when the case gives none."""
    result_grounding: tuple[int, int] | None = None
    """(reproduced, expected): of the expected argument values that come from a tool result in the case's
    history, how many the calls reproduce; None when no expected value comes from a result."""
    text: str | None = None
    """A bounded copy of the generation."""

    @property
    def valid(self) -> bool:
        return self.kind is OutcomeKind.VALID


class PairScore(BaseModel):
    """One case under both views: the per-case record every metric is computed from."""

    model_config = ConfigDict(frozen=True)

    case_id: str
    ft: Outcome
    base: Outcome | None = None
    relevant: bool = True
    """The case expects a call (False: an irrelevance case, where the right answer is no call)."""
    arg_disagreement: float | None = None
    """Leaf-field disagreement of matched calls, only when both views are valid."""
    identical_output: bool | None = None
    """The adapter's generation is byte-identical to the base's."""
    tool: str | None = None
    """The expected (first) tool, for breakdowns."""
    request_hash: str | None = None
    """Hash of the prompt and generation settings this case was generated with (pairing checks it)."""
    turn_depth: int = 1
    """The case's turn depth (1: a single request; 1 + the assistant turns of its history), for the
    per-depth breakdowns and the multi-turn gate."""
    primed: bool = False
    """The prompt wrote the start of a call for the model (plain-v3's ``{"name": "``): whether the model would
    have called a tool cannot be seen, so the false-call metrics leave such a case out."""
    answer_source: str | None = None
    """Where the answer came from when the model did not generate it in this run: ``request_cache`` (lm-eval's
    ``--use_cache`` answered it, and this model is not recorded to have written that answer). Such a run gets no
    verdict and writes no base reference."""

    @property
    def validity_delta(self) -> int | None:
        if self.base is None or not self.relevant:
            return None
        return int(self.ft.valid) - int(self.base.valid)


class Summary(BaseModel):
    """Aggregates over a run (one adapter, optionally paired with its base). Built by scoring.summarize."""

    model_config = ConfigDict(frozen=True)

    n: int
    n_relevant: int
    n_irrelevant: int = 0
    metrics: dict[str, float | None]
    """Every metric of :data:`lm_eval_toolfid.scoring.metrics.METRICS` this run has (None: no denominator)."""
    denominators: dict[str, int] = Field(default_factory=dict)
    outcome_counts: dict[str, int]
    base_outcome_counts: dict[str, int] | None = None
    surface_counts: dict[str, int] = Field(default_factory=dict)
    """How this run's view wrote each case: the first call's surface format (``hermes``, ``fenced``,
    ``bare_json``…), ``malformed[:<format>]`` or ``none`` (see ``scoring.metrics.surface_key``)."""
    base_surface_counts: dict[str, int] | None = None
    """The same for the paired base's view."""
    paired: bool = False
    validity_delta_ci: tuple[float, float] | None = None
    hallucination_delta_ci: tuple[float, float] | None = None
    validity_discordant: tuple[int, int] | None = None
    """(cases lost, cases gained) by the adapter: McNemar's discordant cells."""
    by_depth: dict[str, Summary] | None = None
    """When some case has a history: the same summary over the cases of each turn depth (``"1"``, ``"2"``,
    ``"3+"``) and over the multi-turn cases together (``"2+"``); None for a single-turn case set."""

    def get(self, name: str) -> float | None:
        return self.metrics.get(name)

    @property
    def json_valid_rate(self) -> float:
        return self.metrics.get("json_valid_rate") or 0.0

    @property
    def base_json_valid_rate(self) -> float | None:
        return self.metrics.get("base_json_valid_rate")

    @property
    def validity_delta(self) -> float | None:
        return self.metrics.get("validity_delta")

    @property
    def hallucination_rate(self) -> float:
        return self.metrics.get("hallucination_rate") or 0.0

    @property
    def n_valid(self) -> int:
        return self.denominators.get("hallucination_rate", 0)
