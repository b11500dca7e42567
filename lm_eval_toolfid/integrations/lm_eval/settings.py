"""The task's settings, read from lm-eval's merged ``config.metadata``.

lm-eval merges the YAML ``metadata``, ``--model_args`` and ``--metadata`` into one dict; this
module picks out what the task understands and validates it, so a typo'd value is a one-line
error instead of a silent default. Everything else in that dict is a model argument.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.flags import parse_flag
from lm_eval_toolfid.pairing.identity import adapter_of, suspicious_keys
from lm_eval_toolfid.pairing.served import is_served
from lm_eval_toolfid.scoring.verdict import VerdictConfig

SETTING_KEYS = ("cases", "demos", "plain_demos", "allowed_tools", "base_samples", "calibration", "write_reference",
                "string_arguments", "backend", "prompt_style", "prompt_template", "system_prompt",
                "chat_template", "verify", "check_stops", "prefix_cache", "base_model", "base_server")
OTHER_TASK_KEYS = {"reference_dir", "version", "toolfid", "config_source"}
"""Keys the task (or lm-eval's YAML) owns that are not model arguments."""


def _model_arg_names() -> set[str]:
    """The model arguments lm-eval's model classes take (their constructors' parameters), and the adapter keys."""
    import inspect

    from lm_eval_toolfid.pairing.identity import ADAPTER_KEYS, NON_IDENTITY_KEYS

    names = set(ADAPTER_KEYS) | set(NON_IDENTITY_KEYS) | {"pretrained", "model", "dtype", "revision", "tokenizer",
                                                          "base_url", "api", "tokenized_requests", "trust_remote_code"}
    try:
        from lm_eval.models.huggingface import HFLM

        names |= set(inspect.signature(HFLM.__init__).parameters)
    except Exception:  # noqa: BLE001 - an lm-eval without it: the fixed names above
        pass
    return names


def misspelt_setting(key: str, settings: set[str]) -> str | None:
    """The task setting ``key`` is a near-miss of (``validity_delta_flor``: ``validity_delta_floor``), unless ``key``
    is a model argument lm-eval knows; None for any other key (a model argument)."""
    import difflib

    close = difflib.get_close_matches(key, sorted(settings), n=1, cutoff=0.85)
    if not close or key in _model_arg_names():
        return None
    return close[0]


class TaskSettings(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    cases: str = "default"
    demos: int | None = Field(default=None, ge=0, le=8)
    """Demonstrations in the prompt; None: the resolved style's default (chat 0, plain/raw ``plain_demos``)."""
    plain_demos: int = Field(default=2, ge=0, le=8)
    """The plain (and raw) style's demonstrations when ``demos`` is not given (``tool_use_fidelity``: 1)."""
    allowed_tools: list[str] | None = None
    base_samples: str | None = None
    calibration: str | None = None
    write_reference: bool = True
    string_arguments: Literal["valid", "invalid"] = "valid"
    """Whether OpenAI-style string-encoded arguments (decoded and flagged) count as valid."""
    backend: str | None = None
    """The lm-eval model backend (``hf``, ``vllm``…); detected when not given."""
    prompt_style: Literal["auto", "plain", "chat", "raw"] = "plain"
    """``auto`` (``tool_use_fidelity``'s default): the chat style when the model's chat template renders
    ``tools=``, else plain (:mod:`lm_eval_toolfid.prompts.auto`)."""
    prompt_template: Literal["plain-v1", "plain-v2", "plain-v3"] = "plain-v1"
    """Plain style only: how tools are shown (see :mod:`lm_eval_toolfid.prompts.plain`)."""
    system_prompt: str | None = None
    chat_template: str | None = None
    verify: bool | None = None
    """Adapter runs, toolfid's model classes (``toolfid run``, ``toolfid-hf``): check the base's answer in one
    forward pass instead of decoding it again. Not given: verify in float32 (the same outputs, cheaper), decode
    in float16/bfloat16, where a verified pass rounds differently from the base's decoding
    (:mod:`lm_eval_toolfid.integrations.lm_eval.verify_policy`); true forces verification, false decodes in every dtype."""
    prefix_cache: bool = True
    """toolfid's model classes: compute prompt prefixes that cases share once per view (same outputs; near ties
    counted); false computes every prompt whole."""
    check_stops: int = Field(default=0, ge=0)
    """Decode this many rows again without the early stop at the end of the call and report any case whose
    scored answer would change (toolfid's model classes; ``toolfid run --check-stops N``)."""
    base_model: str | None = None
    """Served runs (``base_url=`` in the model args): the served model name of the base this adapter run pairs
    with; absent, the run is a base run (a model the server lists as an adapter is refused)."""
    base_server: str | None = None
    """Served adapter runs whose base is served elsewhere (llama.cpp: a server per adapter): the base's server URL."""
    verdict: VerdictConfig = VerdictConfig()
    model_args: dict[str, Any] = Field(default_factory=dict)
    raw: dict[str, Any] = Field(default_factory=dict)

    @field_validator("write_reference", "verify", "prefix_cache", mode="before")
    @classmethod
    def _flag(cls, value: Any, info: Any) -> Any:
        if value is None and info.field_name != "verify":
            return value  # pydantic reports a missing yes/no as it does any other field
        return parse_flag(value, info.field_name)

    @field_validator("allowed_tools", mode="before")
    @classmethod
    def _list_from_string(cls, value: Any) -> Any:
        if isinstance(value, str):  # from --model_args/--metadata strings: JSON list or comma-separated
            value = value.strip()
            return json.loads(value) if value.startswith("[") else [v for v in value.split(",") if v]
        return value

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> TaskSettings:
        known = {k: metadata[k] for k in SETTING_KEYS if metadata.get(k) is not None}
        task_keys = set(SETTING_KEYS) | OTHER_TASK_KEYS | set(VerdictConfig.model_fields)
        model_args = {k: v for k, v in metadata.items() if k not in task_keys}
        for key in model_args:
            meant = misspelt_setting(key, task_keys)
            if meant:
                raise ToolfidError(f"unknown task setting {key!r}: did you mean {meant!r}? (a setting misspelt would "
                                   "be ignored, and the run judged with the default)")
        try:
            return cls(**known, verdict=VerdictConfig.from_metadata(metadata), model_args=model_args,
                       raw=dict(metadata))
        except (ValidationError, ValueError) as exc:
            first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
            where = ".".join(str(p) for p in first["loc"])
            raise ToolfidError(f"bad task setting {where}: {first['msg']}") from None

    @property
    def served(self) -> bool:
        """The model is behind an OpenAI-compatible server (``base_url=``)."""
        return is_served(self.model_args)

    @property
    def adapter(self) -> tuple[str, str] | None:
        """``(mechanism, path)`` of the adapter this run attaches (peft, delta, vLLM LoRA…; a served adapter:
        ``("served", model name)``), or None."""
        if self.served:
            name = str(self.model_args.get("model") or self.model_args.get("pretrained") or "")
            return ("served", name) if self.base_model and self.base_model != name else None
        return adapter_of(self.model_args)

    @property
    def tokenizer_source(self) -> str | None:
        """Where the prompts' tokenizer comes from: ``tokenizer=``, else ``pretrained=``; a served run whose model
        names are local folders (``transformers serve``) uses the base's folder."""
        given = self.model_args.get("tokenizer") or (None if self.served else self.model_args.get("pretrained"))
        if given or not self.served:
            return str(given) if given else None
        from pathlib import Path

        base = self.base_model or self.model_args.get("model") or self.model_args.get("pretrained")
        return str(base) if base and Path(str(base)).expanduser().is_dir() else None

    @property
    def prompt_model_args(self) -> dict[str, Any]:
        """The model args the prompt renderer reads (its tokenizer)."""
        source = self.tokenizer_source if self.served else None
        return {**self.model_args, "tokenizer": source} if source else dict(self.model_args)

    @property
    def adapter_path(self) -> str | None:
        return self.adapter[1] if self.adapter else None

    @property
    def is_adapter_run(self) -> bool:
        return self.adapter is not None

    @property
    def suspicious_adapter_keys(self) -> list[str]:
        return suspicious_keys(self.model_args, set())

    @property
    def uses_calibration(self) -> bool:
        """z-scores apply to adapter runs; a base run given a calibration ignores it."""
        return bool(self.calibration) and self.is_adapter_run
