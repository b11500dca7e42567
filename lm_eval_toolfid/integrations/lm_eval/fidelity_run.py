"""One run of the task, from build to finish, independent of lm-eval's call order.

- :meth:`FidelityRun.resolve` — once, when requests are built and before any generation: the run
  key, the base references an adapter run can pair with (or why none), the calibration (refused
  here, in one line, if it does not fit).
- :meth:`FidelityRun.score` — per case, pure: generation → case record (:class:`PairScore`).
- :meth:`FidelityRun.finish` — once, from the per-case records alone (so it works on the records
  lm-eval gathers from every rank): summary, verdict, provenance, and the base reference. Every
  side effect of a run happens here; a failure to write a reference is one warning, never lost
  results. Calling it again returns the same conclusion and does nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from lm_eval_toolfid.calibration import fit as calib
from lm_eval_toolfid.cases.load import case_set_hash
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import MAX_TEXT, Case, Outcome, PairScore, Summary
from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings
from lm_eval_toolfid.pairing.identity import RunKey, lora_settings_demand
from lm_eval_toolfid.pairing.references import (STOP_RULE, Reference, find_references, reference_dir,
                                                 stale_under_primer, write_reference)
from lm_eval_toolfid.pairing.samples import reference_from_samples
from lm_eval_toolfid.scoring.compare import pair
from lm_eval_toolfid.scoring.metrics import off_format_rate, summarize
from lm_eval_toolfid.scoring.outcome import answer_text, score_generation
from lm_eval_toolfid.scoring.verdict import NullComparison, Verdict, judge

log = logging.getLogger("lm_eval.toolfid")


def _unwritable(directory: Any) -> str | None:
    """Why base runs cannot store references in ``directory`` (not writable by this user, or its nearest existing
    parent not), in words with what to do; None when they can."""
    from pathlib import Path

    path = Path(directory)
    for parent in [path, *path.parents]:
        if parent.exists():
            if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
                return None
            return (f"the reference folder {path} cannot be written by this user, so no base run could store its "
                    "answers there: set reference_dir (or TOOLFID_HOME) to a folder you can write, run the base "
                    "there, then this adapter")
    return None


@dataclass(frozen=True)
class Conclusion:
    """What a finished run concluded."""

    summary: Summary
    verdict: Verdict | None
    """None for a base run (nothing to judge)."""
    null: NullComparison | None = None

    @property
    def pass_value(self) -> float | None:
        """``fidelity_pass``: 1.0 for PASS, 0.0 for FAIL, None (null in lm-eval's results) when no verdict was
        reached (UNDECIDED) or there is nothing to judge (a base run)."""
        if self.verdict is None or self.verdict.passed is None:
            return None
        return 1.0 if self.verdict.passed else 0.0

    @property
    def decided_value(self) -> float | None:
        """``fidelity_decided``: 1.0 when the verdict is PASS or FAIL, 0.0 when UNDECIDED, None in a base run."""
        if self.verdict is None:
            return None
        return 0.0 if self.verdict.passed is None else 1.0


class FidelityRun:
    """State of one run of the task: fixed at build, per-case records in, one conclusion out."""

    def __init__(self, settings: TaskSettings, cases: dict[str, Case], task_names: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.cases = cases
        self.case_set = case_set_hash(list(cases.values()))
        self.task_names = task_names
        self.key: RunKey | None = None
        self.request_hashes: dict[str, str] = {}
        self.references: list[Reference] = []
        self.calibration: calib.Calibration | None = None
        self.provenance: dict[str, Any] = {}
        self._generations: dict[str, str] = {}
        self._conclusion: Conclusion | None = None
        self._resolved = False
        self.withheld: list[str] = []
        """Why this run's answers cannot carry a verdict or a base reference (answers from lm-eval's request cache
        that this model did not write, sampling): :meth:`withhold`."""

    def withhold(self, reason: str) -> None:
        """This run's answers are scored but cannot judge the adapter nor serve as a base reference: the verdict is
        UNDECIDED with ``reason`` (the verdict line says it), and a base run writes no reference (said in one line)."""
        if reason not in self.withheld:
            self.withheld.append(reason)
            self.provenance["verdict_withheld"] = list(self.withheld)

    # --- build time ----------------------------------------------------------------------

    def resolve(self, key: RunKey | None, request_hashes: dict[str, str], scored_ids: list[str] | None = None,
                primed: bool = False) -> None:
        """Fix the run's identity and find what it pairs with, before any generation.

        ``scored_ids``: the cases this run will score (default: all). References pair only when,
        together, they hold every one of them — never a paired metric over a covered subset.
        ``primed``: the prompt writes the start of each answer (plain-v3): a base run whose early stop did
        not read that primer (written before :data:`STOP_RULE`) is not used."""
        if self._resolved:
            return
        self._resolved = True
        self.key, self.request_hashes = key, dict(request_hashes)
        s = self.settings
        self.provenance.update(
            case_set=self.case_set, n_cases_total=len(self.cases),
            adapter=s.adapter_path, adapter_mechanism=s.adapter[0] if s.adapter else None,
            calibration=s.calibration, verdict_config=s.verdict.model_dump(),
            run_key=key.as_dict() if key is not None else None, stop_rule=STOP_RULE,
        )
        if not s.is_adapter_run:
            return
        if s.base_samples:
            ref = reference_from_samples(s.base_samples, key, self.task_names, primed=primed)
            self.references = [ref]
            self.provenance["pairing"] = f"base_samples: {ref.source}"
        elif key is not None:
            candidates = find_references(key, reference_dir(s.raw))
            usable = []
            for ref in candidates:
                problem = ref.mismatch({cid: h for cid, h in request_hashes.items() if cid in ref.generations})
                if problem is None and primed and ref.stop_rule is None:
                    problem = stale_under_primer(ref.source, None).removeprefix(f"base run {ref.source} ")
                if problem:
                    log.warning("tool_use_fidelity: base reference %s not used: %s", ref.source, problem)
                else:
                    usable.append(ref)
            self.references = usable
            if usable:
                self.provenance["pairing"] = "reference store: " + ", ".join(r.source for r in usable)
                log.info("tool_use_fidelity: paired with base reference %s", ", ".join(r.source for r in usable))
        scored = list(scored_ids) if scored_ids is not None else list(self.cases)
        covered = set().union(*(r.generations for r in self.references)) if self.references else set()
        missing = [cid for cid in scored if cid not in covered]
        if self.references and missing:
            held = len(scored) - len(missing)
            if s.base_samples:
                raise ToolfidError(f"base_samples {s.base_samples} hold {held} of the {len(scored)} cases this run "
                                   f"scores (e.g. not {missing[0]!r}): pass the samples of a base run of these cases")
            self.references = []
            self.provenance["pairing"] = (f"none: the stored base run covers {held} of the {len(scored)} cases this "
                                          "run scores (run the base on at least these cases)")
            log.warning("tool_use_fidelity: %s; reporting adapter metrics only (verdict UNDECIDED)",
                        self.provenance["pairing"].removeprefix("none: "))
        elif not self.references:
            why = ("no base reference matches this base, case set, prompt and generation settings"
                   if key is not None else "the run does not name its base model (no 'pretrained')")
            demand = lora_settings_demand(s.model_args, self.task_names[0] if self.task_names else "tool_use_fidelity") \
                if key is not None else None
            self.provenance["pairing"] = f"none: {why}" + (f"; {demand}" if demand else "")
            unwritable = _unwritable(reference_dir(s.raw)) if key is not None and not demand else None
            if demand:  # vLLM LoRA settings are part of the base: say which base run pairs, in one line
                log.warning("tool_use_fidelity: %s; reporting adapter metrics only (verdict UNDECIDED): %s", why, demand)
            elif unwritable:  # the base run could not have stored its answers: the advice is the folder, not a rerun
                self.provenance["pairing"] += f"; {unwritable}"
                log.warning("tool_use_fidelity: %s; reporting adapter metrics only (verdict UNDECIDED): %s", why,
                            unwritable)
            else:
                log.warning("tool_use_fidelity: %s; reporting adapter metrics only (verdict UNDECIDED). Run the same "
                            "command without the adapter first, or pass --metadata '{\"base_samples\": PATH}'.", why)
        if s.uses_calibration:
            self.calibration = calib.load_calibration(s.calibration)
            if key is None:
                raise ToolfidError("calibration needs the base model's identity: pass pretrained= in model_args")
            self.calibration.check_compatible(key, s.adapter_path)

    # --- per case ------------------------------------------------------------------------

    def base_text(self, case_id: str) -> str | None:
        """The paired base reference's text for a case (primer included), or None."""
        want = self.request_hashes.get(case_id)
        for ref in self.references:
            if case_id in ref.generations and (not ref.prompt_hashes.get(case_id) or want is None
                                               or ref.prompt_hashes[case_id] == want):
                return ref.generations[case_id]
        return None

    def _score_generation(self, text: str, case: Case) -> Outcome:
        """One answer's outcome under this run's scoring options (the task's allowed tools, string arguments)."""
        return score_generation(text, case, task_allowed=self.settings.allowed_tools,
                                string_arguments_valid=self.settings.string_arguments == "valid")

    def score(self, case_id: str, text: Any, primed: bool = False) -> PairScore:
        """One case's record (the adapter's view, paired with the base's when a reference has it).
        ``primed``: the prompt started the answer with a call (the false-call metrics leave the case out)."""
        case = self.cases[case_id]
        text = text if isinstance(text, str) else ("" if text is None else str(text))
        text = answer_text(text, case)
        self._generations[case_id] = text
        ft = self._score_generation(text, case)
        base_text = self.base_text(case_id) if self.settings.is_adapter_run else None
        if base_text is not None:
            base_text = answer_text(base_text, case)
        base = self._score_generation(base_text, case) if base_text is not None else None
        record = pair(case, ft, base, text, base_text)
        return record.model_copy(update={"request_hash": self.request_hashes.get(case_id), "primed": primed})

    def check_stops(self, rows: list[tuple[str, str, str]], asked: int) -> dict[str, Any]:
        """``check_stops``: each ``(case_id, answer as stopped, answer run on without the early stop)``
        (both with the prompt's primer in front) through :func:`answer_text`; a case whose scored answer
        differs is a defect of the stop rule on this model, reported in ``provenance["stop_check"]``."""
        differ = []
        for cid, stopped, full in rows:
            case = self.cases[cid]
            a, b = answer_text(stopped, case), answer_text(full, case)
            if a != b:
                differ.append({"case_id": cid, "stopped": a[-300:], "unstopped": b[-300:],
                               "outcome_stopped": self._score_generation(a, case).kind.value,
                               "outcome_unstopped": self._score_generation(b, case).kind.value})
        check: dict[str, Any] = {"asked": asked, "rows": len(rows), "differ": len(differ), "cases": differ[:20]}
        if not rows:
            check["note"] = ("not run: the model class generated no row a second time (only toolfid's model "
                             "classes stop early; plain lm-eval classes generate to the stop sequence, so there is "
                             "nothing to check)")
            log.warning("tool_use_fidelity: check_stops %s", check["note"])
        elif differ:
            log.warning("tool_use_fidelity: check_stops: %d of %d cases score differently when generation is not "
                        "stopped at the end of the call (e.g. %s: %s vs %s); please report it with the model name",
                        len(differ), len(rows), differ[0]["case_id"], differ[0]["outcome_stopped"],
                        differ[0]["outcome_unstopped"])
        else:
            log.info("tool_use_fidelity: check_stops: %d cases decoded again without the early stop; every scored "
                     "answer is the same", len(rows))
        self.provenance["stop_check"] = check
        return check

    # --- once, at the end ----------------------------------------------------------------

    @property
    def conclusion(self) -> Conclusion | None:
        """The run's conclusion once :meth:`finish` ran; None before."""
        return self._conclusion

    def finish(self, records: list[Any]) -> Conclusion:
        """Summary, verdict, provenance and (base run) reference, from the per-case records."""
        if self._conclusion is not None:
            return self._conclusion
        pairs = [r if isinstance(r, PairScore) else PairScore.model_validate(r) for r in records]
        summary = summarize(pairs)
        null = verdict = None
        if self.settings.is_adapter_run:
            if summary.n and not summary.paired and self.references:  # a case scored that build did not foresee
                covered = sum(p.base is not None for p in pairs)
                self.provenance["pairing"] = (f"none: the stored base run covers {covered} of the {summary.n} "
                                              "cases this run scores (run the base on at least these cases)")
            if self.calibration is not None:
                null = self.calibration.compare(summary, self.settings.verdict)
                self.provenance["null"] = null.model_dump()  # z, rank p over the nulls, K, notes
                self.provenance["z_profile"] = self.calibration.z_profile(summary.json_valid_rate,
                                                                          n=summary.n_relevant or None)
            verdict = judge(summary, self.settings.verdict, null)
            if self.withheld:  # the gates are shown; no label rests on these answers
                verdict = Verdict(passed=None, gates=verdict.gates, notes=verdict.notes,
                                  reason="; ".join(self.withheld))
            self.provenance["verdict"] = verdict.as_record()
            log.log(logging.INFO if verdict.passed else logging.WARNING, "tool_use_fidelity verdict: %s — %s%s",
                    verdict.label, verdict.reason, f" [{'; '.join(verdict.notes)}]" if verdict.notes else "")
        elif self.withheld:
            self.provenance["reference_not_written"] = "; ".join(self.withheld)
            log.warning("tool_use_fidelity: base reference not written: %s", self.provenance["reference_not_written"])
        else:
            self._store_reference(pairs)
        self.provenance.update(
            n_cases=summary.n,
            outcome_counts=summary.outcome_counts,
            surface_counts=summary.surface_counts,
            summary=summary.model_dump(mode="json", exclude={"outcome_counts", "surface_counts",
                                                             "base_surface_counts"}),
        )
        if summary.base_surface_counts is not None:
            self.provenance["base_surface_counts"] = summary.base_surface_counts
        expected = self.provenance.get("expected_format")
        if expected:  # format drift away from what the prompt asks for, per view
            self.provenance["off_format_rate"] = off_format_rate([p.ft for p in pairs], expected)
            if summary.paired:
                self.provenance["base_off_format_rate"] = off_format_rate([p.base for p in pairs if p.base], expected)
        self._conclusion = Conclusion(summary=summary, verdict=verdict, null=null)
        return self._conclusion

    def _store_reference(self, pairs: list[PairScore]) -> None:
        s = self.settings
        why_not = None
        if not s.write_reference:
            why_not = "write_reference is false"
        elif self.key is None:
            why_not = "the run does not name its base model"
        elif s.suspicious_adapter_keys:
            why_not = (f"model args {', '.join(s.suspicious_adapter_keys)} look like an adapter this task does not "
                       "know: not treated as a base run")
        elif int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) != 0:
            why_not = "not rank 0"
        elif not pairs:
            why_not = "no case scored"
        if why_not:
            self.provenance["reference_not_written"] = why_not
            if why_not not in ("write_reference is false", "not rank 0"):
                log.warning("tool_use_fidelity: base reference not written: %s", why_not)
            return
        assert self.key is not None
        ids = [p.case_id for p in pairs]
        generations = {p.case_id: self._generations.get(p.case_id, p.ft.text or "") for p in pairs}
        truncated = {cid for cid in ids if cid not in self._generations}
        hashes = {p.case_id: p.request_hash or self.request_hashes.get(p.case_id, "") for p in pairs}
        full = set(ids) == set(self.cases)
        try:
            path = write_reference(self.key, hashes, generations, reference_dir(s.raw), full=full,
                                   truncated={c for c in truncated if len(generations[c]) >= MAX_TEXT})
        except OSError as exc:
            self.provenance["reference_not_written"] = f"{type(exc).__name__}: {exc}"
            log.warning("tool_use_fidelity: could not write the base reference (%s: %s); the results of this run "
                        "are kept — set reference_dir to a writable folder to pair adapter runs with it",
                        type(exc).__name__, exc)
            return
        self.provenance["reference_written"] = str(path)
        self.provenance["reference_subset"] = not full
        log.info("tool_use_fidelity: wrote base reference %s (%d cases%s)", path, len(ids),
                 "" if full else ", a subset")
