"""lm-eval entry point; the task lives in the library (lm_eval_toolfid.task)."""

from lm_eval_toolfid.task import ToolUseFidelityTask

__all__ = ["ToolUseFidelityTask"]
