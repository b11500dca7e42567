"""The ``tool_use_fidelity`` lm-eval task.

Thin glue: cases come from :mod:`cases`, prompts from :mod:`prompting`, every per-case number
from :mod:`scoring`, pairing from :mod:`pairing`, z from :mod:`calibration`, the verdict
from :mod:`verdict`. lm-eval calls ``process_results`` per case and the aggregations once.
"""

from __future__ import annotations

import json
import logging
from functools import cached_property
from typing import Any, Callable

import datasets
from lm_eval.api.metrics import mean
from lm_eval.api.task import ConfigurableTask

from . import calibration as calib
from .cases import case_set_hash, load_cases
from .errors import ToolfidError
from .pairing import (
    Reference,
    RunKey,
    base_identity,
    find_reference,
    request_hash,
    reference_dir,
    reference_from_samples,
    write_reference,
)
from .prompting import Prompter, render_call
from .records import Case, Outcome, PairScore
from .scoring import arg_disagreement, hallucination_item, hallucination_rate, pair, score_generation, summarize
from .settings import TaskSettings
from .stats import mcnemar_exact_p
from .verdict import judge

log = logging.getLogger("lm_eval.toolfid")

UNPAIRED_METRICS = ("json_valid_rate", "parse_rate", "hallucination_rate")
PAIRED_METRICS = ("base_json_valid_rate", "validity_delta", "validity_mcnemar_p", "arg_disagreement", "fidelity_pass")
HIGHER_IS_BETTER = {
    "json_valid_rate": True, "parse_rate": True, "hallucination_rate": False, "base_json_valid_rate": True,
    "validity_delta": True, "validity_mcnemar_p": True, "arg_disagreement": False, "fidelity_pass": True,
    "json_valid_z": True,
}


def _fail(exc: ToolfidError) -> SystemExit:
    """Inside lm-eval a user error ends the run with one line, not a traceback."""
    return SystemExit(f"tool_use_fidelity: {exc}")


class ToolUseFidelityTask(ConfigurableTask):
    """Generates one tool call per case and scores it against the tool's JSON schema."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        try:
            self.settings = TaskSettings.from_metadata(config.get("metadata") or {})
        except ToolfidError as exc:
            raise _fail(exc) from None
        self._prompt_hashes: dict[str, str] = {}
        self._generations: dict[str, str] = {}
        self._reference: Reference | None = None
        self._pairing_resolved = False
        self._provenance: dict[str, Any] = {}
        super().__init__(config=config, **kwargs)

    # --- docs and prompts ------------------------------------------------------------------

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        try:
            self.cases: dict[str, Case] = {c.id: c for c in load_cases(self.settings.cases)}
        except ToolfidError as exc:
            raise _fail(exc) from None
        rows = [{"id": c.id, "prompt": c.prompt, "gold_tool_name": c.gold_tool_name} for c in self.cases.values()]
        self.dataset = datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
        self.case_set_hash = case_set_hash(list(self.cases.values()))

    def has_training_docs(self) -> bool:
        return False

    def has_validation_docs(self) -> bool:
        return False

    def has_test_docs(self) -> bool:
        return True

    def test_docs(self) -> datasets.Dataset:
        return self.dataset["test"]

    def case_of(self, doc: dict[str, Any]) -> Case:
        return self.cases[str(doc["id"])]

    @cached_property
    def prompter(self) -> Prompter:
        """The prompt style (plain/chat/raw); the chat style loads the model's chat template once."""
        try:
            return Prompter(self.settings.prompt_style, self.settings.demos, self.settings.system_prompt,
                            self.settings.model_args, self.settings.chat_template)
        except ToolfidError as exc:
            raise _fail(exc) from None

    def doc_to_text(self, doc: dict[str, Any], doc_to_text: Any = None) -> str:
        try:
            return self.prompter.render(self.case_of(doc))
        except ToolfidError as exc:
            raise _fail(exc) from None

    def fewshot_context(self, doc: dict[str, Any], num_fewshot: int, *args: Any, **kwargs: Any) -> Any:
        """The chat style renders the model's template itself (with per-case tools); lm-eval's
        ``--apply_chat_template`` would wrap that text in the template a second time, so for this
        style the task's rendering wins and lm-eval's is skipped (said once, as a warning)."""
        if self.settings.prompt_style == "chat":
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
        return super().fewshot_context(doc, num_fewshot, *args, **kwargs)

    def doc_to_target(self, doc: dict[str, Any], doc_to_target: Any = None) -> str:
        case = self.case_of(doc)
        if case.gold_arguments is not None:
            return render_call(case.gold_tool_name, case.gold_arguments)
        return case.gold_tool_name

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any) -> Any:
        instance = super().construct_requests(doc, ctx, **kwargs)
        if self.settings.uses_calibration:
            _ = self.null  # refuse an incompatible calibration before any generation, not after
        case = self.case_of(doc)
        context, gen_kwargs = instance.arguments[0], instance.arguments[1]
        if case.max_new_tokens is not None:
            gen_kwargs["max_gen_toks"] = case.max_new_tokens
        self._prompt_hashes[case.id] = request_hash(context, gen_kwargs)
        return instance

    # --- identity and pairing --------------------------------------------------------------

    @cached_property
    def run_key(self) -> RunKey | None:
        """None when the run does not say which base model it used (e.g. an LM object, no model_args)."""
        if not self.settings.model_args.get("pretrained"):
            log.warning("tool_use_fidelity: no 'pretrained' in model_args/metadata: cannot pair or store a reference")
            return None
        gen = dict(self.config.generation_kwargs or {})
        try:
            base = base_identity(self.settings.model_args)
        except ToolfidError as exc:
            raise _fail(exc) from None
        return RunKey(base=base, case_set=self.case_set_hash, prompt=self.prompter.settings.fingerprint(),
                      generation=json.loads(json.dumps(gen, sort_keys=True, default=str)))

    def _resolve_pairing(self) -> None:
        """Once per run: find the base reference an adapter run pairs with (or say why not)."""
        if self._pairing_resolved:
            return
        self._pairing_resolved = True
        if not self.settings.is_adapter_run:
            return
        try:
            if self.settings.base_samples:
                ref = reference_from_samples(self.settings.base_samples, set(self.cases))
                origin = "base_samples (user-supplied; base identity not checked)"
            elif self.run_key is not None:
                ref = find_reference(self.run_key, reference_dir(self.settings.raw))
                origin = "reference store"
            else:
                ref, origin = None, ""
        except ToolfidError as exc:
            raise _fail(exc) from None
        if ref is None:
            self._provenance["pairing"] = "none: no base reference matches this base, case set, prompt and generation"
            log.warning(
                "tool_use_fidelity: no base reference for this base model/case set/prompt/generation settings; "
                "reporting adapter metrics only. Run the same command without peft= first, or pass "
                "--metadata '{\"base_samples\": PATH}'."
            )
            return
        problem = ref.mismatch({cid: self._prompt_hashes[cid] for cid in self._prompt_hashes})
        if problem:
            if self.settings.base_samples:
                raise _fail(ToolfidError(f"base_samples {ref.source} cannot be paired: {problem}"))
            self._provenance["pairing"] = f"none: stale reference {ref.source} ({problem})"
            log.warning("tool_use_fidelity: base reference %s not used: %s", ref.source, problem)
            return
        self._reference = ref
        self._provenance["pairing"] = f"{origin}: {ref.source}"
        log.info("tool_use_fidelity: paired with base reference %s", ref.source)

    # --- per-case scoring ------------------------------------------------------------------

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        case = self.case_of(doc)
        text = results[0] if results else ""
        self._generations[case.id] = text if isinstance(text, str) else str(text)
        ft = score_generation(self._generations[case.id], case, self.settings.allowed_tools)
        self._resolve_pairing()
        base: Outcome | None = None
        if self._reference is not None:
            base = score_generation(self._reference.generations[case.id], case, self.settings.allowed_tools)
        scored = pair(case.id, ft, base)
        items: dict[str, Any] = {
            "json_valid_rate": int(ft.valid),
            "parse_rate": int(ft.kind.parsed),
            "hallucination_rate": hallucination_item(ft),
        }
        if base is not None:
            items.update(
                base_json_valid_rate=int(base.valid),
                validity_delta=scored.validity_delta,
                validity_mcnemar_p=scored.validity_delta,
                arg_disagreement=scored.arg_disagreement,
                fidelity_pass=scored.model_dump(mode="json"),
            )
        if self.settings.uses_calibration:
            items["json_valid_z"] = int(ft.valid)
        return items

    # --- aggregation -----------------------------------------------------------------------

    @cached_property
    def null(self) -> calib.Calibration | None:
        if not self.settings.uses_calibration:
            return None  # a base run has nothing to z-score
        try:
            calibration = calib.load_calibration(self.settings.calibration)
            if self.run_key is None:
                raise ToolfidError("calibration needs the base model's identity: pass pretrained= in model_args")
            calibration.check_compatible(self.run_key, self.settings.adapter_path)
        except ToolfidError as exc:
            raise _fail(exc) from None
        return calibration

    def _hallucination(self, items: list[int | None]) -> float:
        self._finish_base_run(len(items))
        return hallucination_rate(items)

    def _finish_base_run(self, n_items: int) -> None:
        """A base run leaves a reference behind for adapter runs to pair with."""
        if self.settings.is_adapter_run or not self.settings.write_reference or self.run_key is None:
            return
        if len(self._generations) != n_items:
            log.warning("tool_use_fidelity: base reference not written (multi-process run: %d of %d cases here)",
                        len(self._generations), n_items)
            return
        path = write_reference(self.run_key, self._prompt_hashes, self._generations, reference_dir(self.settings.raw))
        self._provenance["reference_written"] = str(path)
        log.info("tool_use_fidelity: wrote base reference %s", path)

    def _verdict(self, items: list[dict[str, Any]]) -> float:
        summary = summarize([PairScore.model_validate(i) for i in items])
        null = self.null.compare(summary, self.settings.verdict) if self.null is not None else None
        verdict = judge(summary, self.settings.verdict, null)
        self._provenance["verdict"] = verdict.model_dump(mode="json")
        failed = [f"{g.name} {g.value:+.3f} (limit {g.op} {g.threshold:+.3f})" for g in verdict.gates if g.passed is False]
        log.info("tool_use_fidelity verdict: %s%s%s", verdict.label, f" — {'; '.join(failed)}" if failed else "",
                 f" [{'; '.join(verdict.notes)}]" if verdict.notes else "")
        self._provenance["outcome_counts"] = summary.outcome_counts
        return float(bool(verdict.passed))

    def _z(self, items: list[int]) -> float:
        if self.null is None:
            return float("nan")
        self._provenance["z_profile"] = self.null.z_profile(mean(items))
        return self.null.z(mean(items))

    def aggregation(self) -> dict[str, Callable[[list[Any]], float]]:
        self._record_provenance()
        return {
            "json_valid_rate": mean,
            "parse_rate": mean,
            "hallucination_rate": self._hallucination,
            "base_json_valid_rate": mean,
            "validity_delta": mean,
            "validity_mcnemar_p": mcnemar_exact_p,
            "arg_disagreement": arg_disagreement,
            "fidelity_pass": self._verdict,
            "json_valid_z": self._z,
        }

    def higher_is_better(self) -> dict[str, bool]:
        return dict(HIGHER_IS_BETTER)

    def _record_provenance(self) -> None:
        """Expose what this run was compared with in the results file (``configs.<task>.metadata.toolfid``)."""
        if not isinstance(self.config.metadata, dict):
            return
        self._provenance.update(
            case_set=getattr(self, "case_set_hash", None),
            n_cases=len(getattr(self, "cases", {})),
            prompt=self.prompter.settings.fingerprint(),
            **self.prompter.provenance(),
            adapter=self.settings.adapter_path,
            calibration=self.settings.calibration,
            verdict_config=self.settings.verdict.model_dump(),
            run_key=self.run_key.as_dict() if self.run_key is not None else None,
        )
        self.config.metadata["toolfid"] = self._provenance
