"""Base references: a base run's per-case request hashes and generations, stored by run key.

A partial base run (``--limit``/``--samples``) writes a *subset* reference, keyed by its subset; an
adapter run pairs only when references of its key cover every case it scores. References are
written atomically and re-scored from their stored text with the current scoring core, so a fix to
scoring never leaves a stale outcome behind.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_json, toolfid_home
from lm_eval_toolfid.pairing.identity import RunKey, canonical, hash_text

log = logging.getLogger("lm_eval.toolfid")


REFERENCE_FORMAT = "toolfid-reference/2"
STOP_RULE = "settled-answer/1"
"""The early stop that wrote a run's generations: rows end once the answer the scorer reads (the prompt's
primer + the generation) is settled. Runs before it fed the stop rule the generation alone, so
under a primed prompt (plain-v3) their answers could be cut one brace short: such a reference or samples
file is refused for a primed prompt (:func:`stale_under_primer`)."""


def stale_under_primer(source: str, stop_rule: Any) -> str:
    """The one line that refuses a base run written before :data:`STOP_RULE` for a primed prompt."""
    return (f"base run {source} was written before toolfid's early stop read the prompt's primer: under "
            "this primed prompt (plain-v3) its answers may be cut one brace short; re-run the base")


def reference_dir(metadata: dict[str, Any] | None = None) -> Path:
    explicit = (metadata or {}).get("reference_dir")
    return Path(explicit).expanduser() if explicit else toolfid_home() / "references"


@dataclass
class Reference:
    """A base run's per-case request hashes and generations."""

    key: dict[str, Any]
    prompt_hashes: dict[str, str]
    generations: dict[str, str]
    source: str
    subset: bool = False
    truncated: set[str] = field(default_factory=set)
    stop_rule: str | None = None
    """The early stop that wrote it (:data:`STOP_RULE`; None: written before it was recorded)."""

    def mismatch(self, prompt_hashes: dict[str, str]) -> str | None:
        """Why this reference cannot serve these cases (ids → request hashes), or None."""
        missing = [cid for cid in prompt_hashes if cid not in self.generations]
        if missing:
            return f"reference lacks {len(missing)} of {len(prompt_hashes)} cases (e.g. {missing[0]!r})"
        differ = [cid for cid, h in prompt_hashes.items() if self.prompt_hashes.get(cid) != h]
        if differ:
            return f"prompt or generation settings differ for {len(differ)} cases (e.g. {differ[0]!r})"
        return None


def reference_path(key: RunKey, directory: Path, case_ids: list[str] | None = None) -> Path:
    """``<key>.json`` for a full run; ``<key>.subset-<ids>.json`` for a partial one."""
    if case_ids is None:
        return directory / f"{key.digest()}.json"
    return directory / f"{key.digest()}.subset-{hash_text(canonical(sorted(case_ids)))}.json"


def write_reference(key: RunKey, prompt_hashes: dict[str, str], generations: dict[str, str], directory: Path,
                    full: bool = True, truncated: set[str] | None = None) -> Path:
    """Atomically write a reference (unique temp file + rename: concurrent writers leave one valid file)."""
    path = reference_path(key, directory, None if full else list(generations))
    payload = {
        "format": REFERENCE_FORMAT,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "key": key.as_dict(),
        "stop_rule": STOP_RULE,
        "subset": not full,
        "cases": {cid: {"prompt_hash": prompt_hashes[cid], "generation": generations[cid],
                        **({"truncated": True} if cid in (truncated or set()) else {})}
                  for cid in generations},
    }
    return atomic_write_json(path, payload, indent=None)


def read_reference(path: Path) -> Reference:
    """A reference file, or one line saying what is wrong with it."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ToolfidError(f"cannot read base reference {path}: {exc}; delete it and re-run the base") from None
    if not isinstance(payload, dict) or payload.get("format") != REFERENCE_FORMAT:
        raise ToolfidError(f"{path} is not a toolfid base reference ({REFERENCE_FORMAT}); "
                           "delete it and re-run the base")
    cases = payload.get("cases")
    if not isinstance(cases, dict) or not isinstance(payload.get("key"), dict) or not all(
            isinstance(c, dict) and isinstance(c.get("prompt_hash"), str) and isinstance(c.get("generation"), str)
            for c in cases.values()):
        raise ToolfidError(f"{path}: corrupt base reference (cases without prompt_hash/generation); "
                           "delete it and re-run the base")
    return Reference(
        key=payload["key"],
        prompt_hashes={cid: c["prompt_hash"] for cid, c in cases.items()},
        generations={cid: c["generation"] for cid, c in cases.items()},
        source=str(path), subset=bool(payload.get("subset")),
        truncated={cid for cid, c in cases.items() if c.get("truncated")},
        stop_rule=payload.get("stop_rule") if isinstance(payload.get("stop_rule"), str) else None,
    )


def find_references(key: RunKey, directory: Path) -> list[Reference]:
    """Every reference of this key (full first, then subsets, newest first); unreadable or
    mismatching files are skipped with a warning, never used."""
    if not directory.is_dir():
        return []
    want = json.loads(canonical(key.as_dict()))
    full = reference_path(key, directory)
    subsets = sorted(directory.glob(f"{key.digest()}.subset-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    found = []
    for path in ([full] if full.is_file() else []) + subsets:
        try:
            ref = read_reference(path)
        except ToolfidError as exc:
            log.warning("tool_use_fidelity: %s", exc)
            continue
        if ref.key == want:  # a digest collision or hand-edited file is never used
            found.append(ref)
    return found


def find_reference(key: RunKey, directory: Path) -> Reference | None:
    """The full reference of this key, if any."""
    return next((r for r in find_references(key, directory) if not r.subset), None)

