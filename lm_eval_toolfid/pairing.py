"""Pairing an adapter run with its base run.

A base run stores a *reference*: for every case it scored, the request hash and the raw
generation. An adapter run looks references up by a key built from everything that changes what
the base generates — base identity (path or hub id pinned to a commit, a content fingerprint of
local folders, every model argument except the few known not to change outputs, the backend),
case set, prompt settings, generation settings and lm-eval's own request settings (chat
template, system instruction) — and checks every case's request hash. Request hashes are
computed by toolfid from the rendered prompt, never from what lm-eval happened to construct (so
``--cache_requests`` cannot empty them). A reference that does not match is never used.

A partial base run (``--limit``/``--samples``) writes a *subset* reference, keyed by its subset;
an adapter run pairs only when references of its key cover every case it scores.

References are re-scored from their stored text with the current scoring core, so a fix to
scoring never leaves a stale outcome behind.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .errors import ToolfidError
from .fsutil import atomic_write_json
from .prompting import restore_primer

log = logging.getLogger("lm_eval.toolfid")

REFERENCE_FORMAT = "toolfid-reference/2"

# How lm-eval backends attach an adapter: model-args key → mechanism.
ADAPTER_KEYS = {
    "peft": "peft",  # HF: PEFT adapter, loaded unmerged
    "delta": "delta",  # HF: delta weights added to the base
    "lora_local_path": "vllm-lora",  # vLLM: LoRARequest
    "lora_path": "lora",
    "lora_paths": "lora",
    "adapter": "adapter",
    "adapter_path": "adapter",
}
# Adapter-looking keys that are settings, not adapters.
_ADAPTER_SETTINGS = {"enable_lora", "max_lora_rank", "max_loras", "max_cpu_loras", "lora_dtype", "lora_extra_vocab_size",
                     "fully_sharded_loras"}
_ADAPTER_LIKE = re.compile(r"lora|adapter|peft|delta", re.IGNORECASE)

# Model-args keys known not to change what greedy generation produces: placement, batching, memory.
NON_IDENTITY_KEYS = {
    "device", "device_map", "batch_size", "max_batch_size", "parallelize", "max_memory_per_gpu",
    "max_cpu_memory", "offload_folder", "gpu_memory_utilization", "data_parallel_size", "swap_space",
    "logits_cache", "softmax_dtype", "num_proc", "seed",
}


def toolfid_home() -> Path:
    return Path(os.environ.get("TOOLFID_HOME") or Path.home() / ".cache" / "lm_eval_toolfid").expanduser()


def reference_dir(metadata: dict[str, Any] | None = None) -> Path:
    explicit = (metadata or {}).get("reference_dir")
    return Path(explicit).expanduser() if explicit else toolfid_home() / "references"


def hash_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str, ensure_ascii=False)


def request_hash(context: Any, gen_kwargs: Any) -> str:
    """Hash of exactly what is asked of the model for one case: prompt and generation settings."""
    ctx = context if isinstance(context, str) else canonical(context)
    return hash_text(ctx + "\x00" + canonical(gen_kwargs))


# --- adapters and identity -----------------------------------------------------------------

def adapter_of(model_args: dict[str, Any]) -> tuple[str, str] | None:
    """``(mechanism, path)`` of the adapter these model args attach, or None for a base run."""
    for key, mechanism in ADAPTER_KEYS.items():
        value = model_args.get(key)
        if value not in (None, "", False, "None"):
            return mechanism, str(value)
    return None


def suspicious_keys(model_args: dict[str, Any], known: set[str]) -> list[str]:
    """Keys that look like an adapter but are not a known mechanism or setting: a run with one of
    them must not write a base reference (it may not be a base run)."""
    return sorted(k for k, v in model_args.items()
                  if _ADAPTER_LIKE.search(k) and k not in ADAPTER_KEYS and k not in _ADAPTER_SETTINGS
                  and k not in known and v not in (None, "", False, "None", "False"))


def _file_digest(path: Path, h: Any) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}".encode())
    with path.open("rb") as fh:
        if size <= 256 * 1024 * 1024:
            for block in iter(lambda: fh.read(1024 * 1024), b""):
                h.update(block)
            return
        for i in range(32):  # very large weight files: 32 evenly spaced 1 MiB windows plus the size
            fh.seek((size - 1024 * 1024) * i // 31)
            h.update(fh.read(1024 * 1024))


def dir_fingerprint(path: str | Path) -> str:
    """Content fingerprint of a local model/adapter directory (or single file)."""
    root = Path(path)
    h = hashlib.sha256()
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    for file in files:
        h.update(str(file.relative_to(root) if root.is_dir() else file.name).encode())
        _file_digest(file, h)
    return h.hexdigest()[:16]


def resolved_hub_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit a hub id (and branch/tag) resolves to in the local cache, or None."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return None
    ref = Path(HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "refs" / (revision or "main")
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return commit if re.fullmatch(r"[0-9a-f]{40}", commit) else None


def base_identity(model_args: dict[str, Any], backend: str = "unknown") -> dict[str, Any]:
    """What identifies the base model of a run: every model argument that can change its greedy
    outputs (adapter and placement keys excluded), the backend, and for local folders a content
    fingerprint, for hub ids the resolved commit."""
    ident = {k: str(v) for k, v in sorted(model_args.items())
             if k not in NON_IDENTITY_KEYS and k not in ADAPTER_KEYS and v not in (None, "")}
    pretrained = ident.get("pretrained")
    if pretrained is None:
        raise ToolfidError("model_args has no 'pretrained': cannot identify the base model")
    ident["backend"] = backend
    local = Path(pretrained).expanduser()
    if local.exists():
        ident["pretrained"] = str(local.resolve())
        ident["fingerprint"] = dir_fingerprint(local)
    else:
        commit = resolved_hub_commit(pretrained, ident.get("revision"))
        if commit:
            ident["revision"] = commit
        elif ident.get("revision") in (None, "main"):
            log.warning("tool_use_fidelity: base %s is a hub id with no pinned revision and no cached commit; "
                        "pass revision=<commit> so a later change of the hub model cannot pair silently", pretrained)
    return ident


@dataclass(frozen=True)
class RunKey:
    """Everything two runs must share for their per-case outcomes to be compared."""

    base: dict[str, Any]
    case_set: str
    prompt: str
    generation: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"base": self.base, "case_set": self.case_set, "prompt": self.prompt, "generation": self.generation}

    def digest(self) -> str:
        return hashlib.sha256(canonical(self.as_dict()).encode()).hexdigest()[:20]

    def differences(self, other: dict[str, Any]) -> list[str]:
        """Top-level (and base-level) fields where ``other`` differs from this key."""
        mine = json.loads(canonical(self.as_dict()))
        out = []
        for k, v in mine.items():
            theirs = other.get(k) if isinstance(other, dict) else None
            if k == "base" and isinstance(v, dict) and isinstance(theirs, dict):
                out += [f"base.{b}" for b in sorted(set(v) | set(theirs)) if v.get(b) != theirs.get(b)]
            elif v != theirs:
                out.append(k)
        return out


@dataclass
class Reference:
    """A base run's per-case request hashes and generations."""

    key: dict[str, Any]
    prompt_hashes: dict[str, str]
    generations: dict[str, str]
    source: str
    subset: bool = False
    truncated: set[str] = field(default_factory=set)

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


def iter_samples(path: Path) -> Iterator[tuple[int, str, str, dict[str, Any]]]:
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
            and isinstance(args[0][0], str):
        return args[0][0]
    return None


def reference_from_samples(path: str | Path, key: RunKey | None, task_names: tuple[str, ...] = ()) -> Reference:
    """A reference from an lm-eval ``--log_samples`` file of a base run of this task.

    The samples' results file must sit beside them: it proves the run was a base run (no adapter in
    its model args) of the same base, case set, prompt and generation settings (its recorded run key).
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
    for name, cfg in (results.get("configs") or {}).items():
        if not task_names or name in task_names or name.startswith("tool_use_fidelity"):
            recorded = ((cfg or {}).get("metadata") or {}).get("toolfid", {}).get("run_key")
            if recorded:
                break
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
    for _, cid, text, sample in iter_samples(samples_path):
        record = sample.get("cases_scored")
        prompt_hashes[cid] = str(record.get("request_hash") or "") if isinstance(record, dict) else ""
        generations[cid] = text
    if not generations:
        raise ToolfidError(f"base_samples {samples_path} holds no samples")
    return Reference(key=recorded or {}, prompt_hashes=prompt_hashes, generations=generations,
                     source=str(samples_path), subset=True)
