"""Typed records that flow between the stages: case → parsed calls → outcome → pair → summary.

Data flows one way: ``cases`` builds :class:`Case`; ``parsing`` turns text into
:class:`ParsedGeneration`; ``scoring`` turns a generation plus a case into an
:class:`Outcome` and two outcomes into a :class:`PairScore`; ``stats``/``scoring``
aggregate those into a :class:`Summary`; ``verdict`` judges a summary.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


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


class Case(BaseModel):
    """One evaluation case: a request, the tools offered, the tool it should call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    tools: list[ToolSpec] = Field(min_length=1)
    gold_tool_name: str = Field(min_length=1)
    allowed_tools: list[str] | None = None
    max_new_tokens: int | None = Field(default=None, gt=0, le=8192)
    gold_arguments: dict[str, Any] | None = None

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
    def _gold_is_offered(self) -> Case:
        if self.gold_tool_name not in self.tool_names:
            raise ValueError(
                f"gold_tool_name {self.gold_tool_name!r} is not among the offered tools "
                f"({', '.join(self.tool_names)})"
            )
        return self

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    @property
    def gold_tool(self) -> ToolSpec:
        tool = self.tool(self.gold_tool_name)
        assert tool is not None  # guaranteed by _gold_is_offered
        return tool


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

    NO_CALL = "no_call"  # nothing JSON-like: prose, empty
    MALFORMED = "malformed"  # tried to write JSON, did not parse (truncated, syntax error)
    WRONG_SHAPE = "wrong_shape"  # parsed JSON, but not {"name": str, "arguments": object}
    SCHEMA_ERROR = "schema_error"  # arguments violate the tool's JSON schema
    VALID = "valid"

    @property
    def parsed(self) -> bool:
        return self not in (OutcomeKind.NO_CALL, OutcomeKind.MALFORMED)


class Outcome(BaseModel):
    """The scored result of one generation for one case (one view)."""

    model_config = ConfigDict(frozen=True)

    kind: OutcomeKind
    keyword: str | None = None
    """For SCHEMA_ERROR: the failing JSON-Schema keyword (``required``, ``enum``, ``type``...);
    for WRONG_SHAPE: which part was wrong (``name``, ``arguments``, ``arguments_string``)."""
    detail: str | None = None
    name: str | None = None
    arguments: dict[str, Any] | None = None
    surface: SurfaceFormat | None = None
    n_calls: int = 0
    hallucinated: bool | None = None
    """Only for VALID outcomes: the name is outside the declared surface (or ≠ gold)."""

    @property
    def valid(self) -> bool:
        return self.kind is OutcomeKind.VALID


class PairScore(BaseModel):
    """One case under both views."""

    model_config = ConfigDict(frozen=True)

    case_id: str
    ft: Outcome
    base: Outcome | None = None
    arg_disagreement: float | None = None
    """Leaf-field disagreement, only when both views are valid."""

    @property
    def validity_delta(self) -> int | None:
        if self.base is None:
            return None
        return int(self.ft.valid) - int(self.base.valid)


class Summary(BaseModel):
    """Aggregates over a run (one adapter, optionally paired with its base)."""

    model_config = ConfigDict(frozen=True)

    n: int
    json_valid_rate: float
    parse_rate: float
    hallucination_rate: float
    n_valid: int
    outcome_counts: dict[str, int]
    paired: bool = False
    base_json_valid_rate: float | None = None
    validity_delta: float | None = None
    validity_delta_stderr: float | None = None
    validity_mcnemar_p: float | None = None
    arg_disagreement: float | None = None
    n_arg_pairs: int = 0
