"""What a launcher's ranks computed, kept on disk until the views are saved: a rank that dies loses nothing finished.

Under ``torchrun`` every rank decodes its share of the cases for every view of an engine run (the base and its
adapters together) and only then hands the answers to rank 0, view by view, which scores and saves each view. A rank
that dies (out of memory, a lost node) while another is still decoding would take every rank's finished work with
it. So each rank writes the answers of each engine run it finishes to ``OUT/shards/rank<R>-<N>.json`` (atomically, as
views are saved), before any collective; ``--resume``, under the same or another number of ranks (or one process),
answers every request a shard holds from it and computes the rest, and rank 0 removes the shards once every view of
the run is saved.

An answer is reused only for the view it was computed for: the shard names the view's label and the digest of the
manifest it is saved with (the cases, the task, the base's and the adapter's weights, the settings:
:func:`lm_eval_toolfid.run.resume.view_manifest_of`), and a request must match its prompt and its generation
settings. A shard that does not parse or holds another run's answers is left out, said once. Answers are tokens as
the engine produced them, with their generation record: a resumed view's record and answers are those of the
uninterrupted run. Shards are read where they were written: ``--output`` must be one folder every rank sees (a
cluster's shared filesystem); a rank's shards rank 0 cannot see are computed again."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from lm_eval_toolfid.core.fsutil import atomic_write_json

log = logging.getLogger("lm_eval.toolfid")

FOLDER = "shards"
"""Under ``--output``: the ranks' finished answers of views not saved yet."""
FORMAT = 1


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """What names a view's inputs in a shard: the digest of the manifest the view is saved with."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()[:24]


def key_text(key: Sequence[Any]) -> str:
    """An answer's generation settings (:func:`~lm_eval_toolfid.integrations.lm_eval.hf_model.answer_key`) as a
    shard stores them."""
    return json.dumps(list(key), default=str)


@dataclasses.dataclass(frozen=True)
class StoredAnswer:
    """One view's answer to one prompt, read from a shard."""

    key: str
    tokens: list[int]
    info: Any
    """Its :class:`~lm_eval_toolfid.integrations.lm_eval.generation_record.GenerationInfo`."""
    check_text: str | None = None


class ShardStore:
    """The shards of one run's output folder: what this rank writes (:meth:`keep`) and, with ``--resume``, what
    every rank wrote before (:meth:`lookup`). ``digests``: view label -> :func:`manifest_digest` of the manifest it
    is saved with this run (a view not in it is neither written nor read: a null of ``--null-runs``)."""

    def __init__(self, out_dir: Path, digests: Mapping[str, str], rank: int = 0, world: int = 1,
                 resume: bool = False, write: bool = True, progress: Any = None) -> None:
        self.folder = Path(out_dir) / FOLDER
        self.digests = dict(digests)
        self.rank, self.world = rank, world
        self.resume = resume
        self.write = write
        """Keep this rank's answers (a launcher's ranks; one process resuming only reads)."""
        self.progress = progress
        self._held: dict[str, dict[str, StoredAnswer]] | None = None

    # --- reading (``--resume``) ---------------------------------------------------------------

    def _read(self) -> dict[str, dict[str, StoredAnswer]]:
        if self._held is not None:
            return self._held
        held: dict[str, dict[str, StoredAnswer]] = {}
        skipped = []
        if self.resume:
            for path in sorted(self.folder.glob("rank*.json")):
                try:
                    payload = json.loads(path.read_text(encoding="utf-8"))
                    views = payload["views"] if payload.get("format") == FORMAT else None
                    if not isinstance(views, dict):
                        raise ValueError("not a shard")
                    for label, part in views.items():
                        if self.digests.get(label) != part.get("manifest"):
                            continue  # another run's view (its cases, weights or settings changed since)
                        into = held.setdefault(label, {})
                        for context, answer in part["answers"].items():
                            into[context] = StoredAnswer(answer["key"], [int(t) for t in answer["tokens"]],
                                                         _info(answer.get("info")), answer.get("check"))
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    skipped.append(path.name)
        if skipped:
            log.warning("toolfid: --resume: %d shard file(s) in %s left out (not written completely by this run: "
                        "%s); their answers are computed again", len(skipped), self.folder, ", ".join(skipped[:3]))
        found = sum(len(v) for v in held.values())
        if found and self.progress is not None and self.rank == 0:
            self.progress.message(f"--resume: {found} answers of {len(held)} view(s) from the ranks' shards in "
                                  f"{self.folder}")
        self._held = held
        return held

    def lookup(self, label: str | None, contexts: Sequence[str], keys: Sequence[Sequence[Any]]) -> list[Any]:
        """Per request of view ``label``: its stored answer (same prompt, same generation settings) or None."""
        if label is None or label not in self.digests:
            return [None] * len(contexts)
        held = self._read().get(label, {})
        found = []
        for context, key in zip(contexts, keys):
            answer = held.get(context)
            found.append(answer if answer is not None and answer.key == key_text(key) else None)
        return found

    # --- writing --------------------------------------------------------------------------------

    def keep(self, answers: Mapping[str, Mapping[str, tuple[Sequence[Any], list[int], Any, str | None]]]) -> None:
        """One engine run's answers, finished on this rank: label -> context -> (key, tokens, generation record,
        run-on text), written as one shard file before the answers go to any other rank."""
        if not self.write:
            return
        views = {}
        for label, rows in answers.items():
            digest = self.digests.get(label)
            if digest is None or not rows:
                continue
            views[label] = {"manifest": digest, "answers": {
                context: {"key": key_text(key), "tokens": list(tokens), "info": _info_record(info), "check": check}
                for context, (key, tokens, info, check) in rows.items()}}
        if not views:
            return
        name = f"rank{self.rank}-{time.time_ns()}-{os.getpid()}.json"
        atomic_write_json(self.folder / name, {"format": FORMAT, "rank": self.rank, "world": self.world,
                                               "views": views}, indent=None)

    def remove(self) -> None:
        """Every view saved: the shards are not needed any more."""
        shutil.rmtree(self.folder, ignore_errors=True)


def clear(out_dir: Path) -> None:
    """A run that does not resume starts without the shards of an earlier one."""
    shutil.rmtree(Path(out_dir) / FOLDER, ignore_errors=True)


def _info_record(info: Any) -> Any:
    return dataclasses.asdict(info) if dataclasses.is_dataclass(info) else None


def _info(record: Any) -> Any:
    """A generation record read back (None when the shard holds none)."""
    if not isinstance(record, dict):
        return None
    from lm_eval_toolfid.integrations.lm_eval.generation_record import GenerationInfo

    names = {f.name for f in dataclasses.fields(GenerationInfo)}
    fields = {k: v for k, v in record.items() if k in names}
    if "views_together" in fields:
        fields["views_together"] = tuple(fields["views_together"] or ())
    return GenerationInfo(**fields)
