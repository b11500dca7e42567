"""lm-eval samples files of this task: reading them (one reader for every consumer), and a base
reference from a base run's samples (``base_samples``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterator

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.identity import RunKey, adapter_of
from lm_eval_toolfid.pairing.references import STOP_RULE, Reference, stale_under_primer
from lm_eval_toolfid.prompts.plain import restore_primer

log = logging.getLogger("lm_eval.toolfid")


# --- base_samples: a reference from an lm-eval samples file --------------------------------

def sibling_results(samples_path: Path) -> tuple[Path, dict[str, Any]] | None:
    """The results file written with a samples file: lm-eval's ``results_<stamp>.json`` beside
    ``samples_<task>_<stamp>.jsonl``, or toolfid run's ``results.json`` beside ``samples.jsonl``."""
    stamp = samples_path.stem.rsplit("_", 1)[-1]
    candidates = sorted(samples_path.parent.glob(f"results_{stamp}*.json")) + [samples_path.parent / "results.json"]
    for candidate in candidates:
        if candidate.is_file():
            try:
                return candidate, json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ToolfidError(f"base_samples: results file {candidate} is not readable JSON ({exc})") from None
    return None


def _model_args_of(results: dict[str, Any]) -> dict[str, Any]:
    raw = (results.get("config") or {}).get("model_args")
    if isinstance(raw, dict):
        return raw
    return dict(p.partition("=")[::2] for p in str(raw or "").split(",") if "=" in p)


def iter_sample_answers(path: Path) -> Iterator[tuple[int, str, str, dict[str, Any]]]:
    """``(line number, case id, generation, sample)`` for each sample of an lm-eval ``--log_samples``
    file of this task; one line naming ``file:line`` for anything else. The generation is the whole
    answer: a primer the prompt ended with (``plain-v3``) is put back in front. Lines split on ``\n`` only
    (a U+2028 inside a generation is not a line break)."""
    with path.open(encoding="utf-8", newline="\n") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
                cid = str(sample["doc"]["id"])
                text = sample["filtered_resps"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                raise ToolfidError(f"{path}:{lineno}: not an lm-eval sample of this task "
                                   "(needs doc.id and filtered_resps)") from None
            yield lineno, cid, restore_primer(sample_prompt(sample), text if isinstance(text, str) else str(text)), sample


def sample_prompt(sample: dict[str, Any]) -> str | None:
    """The prompt an lm-eval sample was generated from (``arguments.gen_args_0.arg_0``), if recorded."""
    args = sample.get("arguments")
    if isinstance(args, dict):
        first = args.get("gen_args_0")
        if isinstance(first, dict) and isinstance(first.get("arg_0"), str):
            return first["arg_0"]
    elif isinstance(args, (list, tuple)) and args and isinstance(args[0], (list, tuple)) and args[0] \
            and isinstance(args[0][0], str):  # samples.jsonl of toolfid run before 0.2 (lm-eval's in-memory shape)
        return args[0][0]
    return None


def reference_from_samples(path: str | Path, key: RunKey | None, task_names: tuple[str, ...] = (),
                           primed: bool = False) -> Reference:
    """A reference from an lm-eval ``--log_samples`` file of a base run of this task.

    The samples' results file must sit beside them: it proves the run was a base run (no adapter in
    its model args) of the same base, case set, prompt and generation settings (its recorded run key).
    ``primed``: the prompt writes the start of the answer; a run whose generations toolfid's early stop cut
    before it read the primer (no :data:`STOP_RULE` recorded) is refused.
    """
    samples_path = Path(path).expanduser()
    if not samples_path.is_file():
        raise ToolfidError(f"base_samples file not found: {samples_path}")
    found = sibling_results(samples_path)
    if found is None:
        raise ToolfidError(f"base_samples {samples_path}: its lm-eval results file (results_*.json) is not beside it, "
                           "so it cannot be confirmed to be a base run of this task; pass the samples file from the "
                           "base run's output folder")
    results_path, results = found
    model_args = _model_args_of(results)
    if adapter_of(model_args) is not None:
        raise ToolfidError(f"base_samples {samples_path} come from an adapter run ({adapter_of(model_args)[1]}); "
                           "need a base run")
    recorded = None
    provenance: dict[str, Any] = {}
    for name, cfg in (results.get("configs") or {}).items():
        if not task_names or name in task_names or name.startswith("tool_use_fidelity"):
            provenance = ((cfg or {}).get("metadata") or {}).get("toolfid", {}) or {}
            recorded = provenance.get("run_key")
            if recorded:
                break
    engine = (provenance.get("generation") or {}).get("engine")
    if primed and engine in ("toolfid", "generate", "mixed") and provenance.get("stop_rule") != STOP_RULE:
        raise ToolfidError(stale_under_primer(str(samples_path), provenance.get("stop_rule")))
    if key is not None:
        if not recorded:
            raise ToolfidError(f"base_samples {samples_path}: {results_path.name} records no toolfid run key "
                               "(not a tool_use_fidelity run, or an old version): re-run the base")
        differ = key.differences(recorded)
        if differ:
            raise ToolfidError(f"base_samples {samples_path} cannot be paired: the base run differs in "
                               f"{', '.join(differ)}")
    prompt_hashes: dict[str, str] = {}
    generations: dict[str, str] = {}
    for _, cid, text, sample in iter_sample_answers(samples_path):
        record = sample.get("cases_scored")
        prompt_hashes[cid] = str(record.get("request_hash") or "") if isinstance(record, dict) else ""
        generations[cid] = text
    if not generations:
        raise ToolfidError(f"base_samples {samples_path} holds no samples")
    return Reference(key=recorded or {}, prompt_hashes=prompt_hashes, generations=generations,
                     source=str(samples_path), subset=True, stop_rule=provenance.get("stop_rule") or (
                         STOP_RULE if engine not in ("toolfid", "generate", "mixed") else None))
