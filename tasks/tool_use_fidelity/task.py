"""lm-eval entry point; the task lives in the library (lm_eval_toolfid.integrations.lm_eval.task)."""

from lm_eval_toolfid.integrations.lm_eval.task import ToolUseFidelityTask

__all__ = ["ToolUseFidelityTask"]
