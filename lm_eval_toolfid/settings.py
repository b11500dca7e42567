"""The task's settings, read from lm-eval's merged ``config.metadata``.

lm-eval merges the YAML ``metadata``, ``--model_args`` and ``--metadata`` into one dict; this
module picks out what the task understands and validates it, so a typo'd value is a one-line
error instead of a silent default.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ToolfidError
from .prompting import PromptSettings
from .verdict import VerdictConfig


class TaskSettings(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    cases: str = "default"
    demos: int = Field(default=2, ge=0, le=8)
    allowed_tools: list[str] | None = None
    base_samples: str | None = None
    calibration: str | None = None
    write_reference: bool = True
    prompt_style: Literal["plain", "chat", "raw"] = "plain"
    system_prompt: str | None = None
    chat_template: str | None = None
    verdict: VerdictConfig = VerdictConfig()
    model_args: dict[str, Any] = Field(default_factory=dict)
    raw: dict[str, Any] = Field(default_factory=dict)

    @field_validator("allowed_tools", mode="before")
    @classmethod
    def _list_from_string(cls, value: Any) -> Any:
        if isinstance(value, str):  # from --model_args/--metadata strings: JSON list or comma-separated
            value = value.strip()
            return json.loads(value) if value.startswith("[") else [v for v in value.split(",") if v]
        return value

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> TaskSettings:
        known = {k: metadata[k] for k in ("cases", "demos", "allowed_tools", "base_samples", "calibration",
                                            "write_reference", "prompt_style", "system_prompt", "chat_template")
                 if metadata.get(k) is not None}
        try:
            return cls(**known, verdict=VerdictConfig.from_metadata(metadata), model_args=dict(metadata),
                       raw=dict(metadata))
        except (ValidationError, ValueError) as exc:
            first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
            where = ".".join(str(p) for p in first["loc"])
            raise ToolfidError(f"bad task setting {where}: {first['msg']}") from None

    @property
    def prompt(self) -> PromptSettings:
        """Plain/raw settings; the chat style's template hash is added by :class:`prompting.Prompter`."""
        return PromptSettings(demos=self.demos, style=self.prompt_style,
                              system_prompt=self.system_prompt if self.prompt_style == "chat" else None)

    @property
    def adapter_path(self) -> str | None:
        peft = self.model_args.get("peft")
        return str(peft) if peft else None

    @property
    def is_adapter_run(self) -> bool:
        return self.adapter_path is not None

    @property
    def uses_calibration(self) -> bool:
        """z-scores apply to adapter runs; a base run given a calibration ignores it."""
        return bool(self.calibration) and self.is_adapter_run
