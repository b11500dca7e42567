"""Pairing an adapter run with its base run.

A base run (no ``peft`` in the model args) stores a *reference*: for every case, the prompt
hash and the raw generation. An adapter run looks the reference up by a key built from
everything that must match — base identity (path or name + revision + a content fingerprint
for local directories), case set, prompt settings and generation settings — and then checks
every case's prompt hash. A reference that does not match in full is never used.

References are re-scored from their stored text with the current scoring core, so a fix to
scoring never leaves a stale outcome behind.
"""

from __future__ import annotations

import datetime as _dt
import glob
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ToolfidError

REFERENCE_FORMAT = "toolfid-reference/1"

# model_args keys that change what the base model generates (others — device, batch size — do not)
IDENTITY_KEYS = ("pretrained", "revision", "gguf_file", "subfolder", "tokenizer", "dtype", "trust_remote_code")

_SAMPLED_FILE_BYTES = 256 * 1024 * 1024
_CHUNK = 1024 * 1024


def toolfid_home() -> Path:
    return Path(os.environ.get("TOOLFID_HOME") or Path.home() / ".cache" / "lm_eval_toolfid").expanduser()


def reference_dir(metadata: dict[str, Any] | None = None) -> Path:
    explicit = (metadata or {}).get("reference_dir")
    return Path(explicit).expanduser() if explicit else toolfid_home() / "references"


def hash_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def request_hash(context: Any, gen_kwargs: Any) -> str:
    """Hash of exactly what was asked of the model for one case: prompt text and generation kwargs."""
    ctx = context if isinstance(context, str) else json.dumps(context, sort_keys=True, default=str)
    return hash_text(ctx + "\x00" + json.dumps(gen_kwargs, sort_keys=True, default=str))


def _file_digest(path: Path, h: Any) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}".encode())
    with path.open("rb") as fh:
        if size <= _SAMPLED_FILE_BYTES:
            for block in iter(lambda: fh.read(_CHUNK), b""):
                h.update(block)
            return
        # Very large weight files: 32 evenly spaced 1 MiB windows plus the size.
        for i in range(32):
            fh.seek((size - _CHUNK) * i // 31)
            h.update(fh.read(_CHUNK))


def dir_fingerprint(path: str | Path) -> str:
    """Content fingerprint of a local model/adapter directory (or single file)."""
    root = Path(path)
    h = hashlib.sha256()
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    for file in files:
        h.update(str(file.relative_to(root) if root.is_dir() else file.name).encode())
        _file_digest(file, h)
    return h.hexdigest()[:16]


def base_identity(model_args: dict[str, Any]) -> dict[str, Any]:
    """What identifies the base model of a run (adapter excluded)."""
    ident = {k: str(model_args[k]) for k in IDENTITY_KEYS if model_args.get(k) not in (None, "")}
    pretrained = ident.get("pretrained")
    if pretrained is None:
        raise ToolfidError("model_args has no 'pretrained': cannot identify the base model")
    local = Path(pretrained).expanduser()
    if local.exists():
        ident["pretrained"] = str(local.resolve())
        ident["fingerprint"] = dir_fingerprint(local)
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
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True, default=str).encode()).hexdigest()[:20]


@dataclass
class Reference:
    """A base run's per-case prompts and generations."""

    key: dict[str, Any]
    prompt_hashes: dict[str, str]
    generations: dict[str, str]
    source: str

    def mismatch(self, prompt_hashes: dict[str, str]) -> str | None:
        """Why this reference cannot serve a run with these prompts, or None."""
        missing = [cid for cid in prompt_hashes if cid not in self.generations]
        if missing:
            return f"reference lacks {len(missing)} of {len(prompt_hashes)} cases (e.g. {missing[0]!r})"
        differ = [cid for cid, h in prompt_hashes.items() if self.prompt_hashes.get(cid) != h]
        if differ:
            return f"prompt or generation settings differ for {len(differ)} cases (e.g. {differ[0]!r})"
        return None


def write_reference(key: RunKey, prompt_hashes: dict[str, str], generations: dict[str, str],
                    directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{key.digest()}.json"
    payload = {
        "format": REFERENCE_FORMAT,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "key": key.as_dict(),
        "cases": {cid: {"prompt_hash": prompt_hashes[cid], "generation": generations[cid]} for cid in generations},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return path


def read_reference(path: Path) -> Reference:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ToolfidError(f"cannot read base reference {path}: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != REFERENCE_FORMAT:
        raise ToolfidError(f"{path} is not a toolfid base reference ({REFERENCE_FORMAT})")
    cases = payload.get("cases", {})
    return Reference(
        key=payload.get("key", {}),
        prompt_hashes={cid: c["prompt_hash"] for cid, c in cases.items()},
        generations={cid: c["generation"] for cid, c in cases.items()},
        source=str(path),
    )


def find_reference(key: RunKey, directory: Path) -> Reference | None:
    path = directory / f"{key.digest()}.json"
    if not path.is_file():
        return None
    ref = read_reference(path)
    if ref.key != json.loads(json.dumps(key.as_dict(), default=str)):
        return None  # digest collision or hand-edited file: never use
    return ref


def _sibling_results(samples_path: Path) -> dict[str, Any] | None:
    """The lm-eval results file written next to a samples file in the same run, if any."""
    stamp = samples_path.stem.rsplit("_", 1)[-1]
    for candidate in sorted(glob.glob(str(samples_path.parent / f"results_{stamp}*.json"))):
        try:
            return json.loads(Path(candidate).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    return None


def reference_from_samples(path: str | Path, case_ids: set[str]) -> Reference:
    """A reference from an lm-eval ``--log_samples`` file of a base run of this task."""
    samples_path = Path(path).expanduser()
    if not samples_path.is_file():
        raise ToolfidError(f"base_samples file not found: {samples_path}")
    prompt_hashes: dict[str, str] = {}
    generations: dict[str, str] = {}
    with samples_path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
                cid = str(sample["doc"]["id"])
                args = sample["arguments"]
                ctx, gen_kwargs = (args["gen_args_0"]["arg_0"], args["gen_args_0"]["arg_1"]) if isinstance(args, dict) \
                    else (args[0][0], args[0][1])
                text = sample["filtered_resps"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                raise ToolfidError(f"{samples_path}:{lineno}: not an lm-eval sample of this task") from None
            prompt_hashes[cid] = request_hash(ctx, gen_kwargs)
            generations[cid] = text if isinstance(text, str) else str(text)
    results = _sibling_results(samples_path)
    if results is not None:
        model_args = str((results.get("config") or {}).get("model_args") or "")
        if "peft=" in model_args or "'peft'" in model_args:
            raise ToolfidError(f"base_samples {samples_path} come from an adapter run ({model_args}); need a base run")
    if not case_ids & set(generations):
        raise ToolfidError(f"base_samples {samples_path} share no case ids with this case set")
    return Reference(key={}, prompt_hashes=prompt_hashes, generations=generations, source=str(samples_path))
