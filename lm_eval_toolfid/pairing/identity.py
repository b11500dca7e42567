"""A run's identity: which base model (everything that changes its greedy outputs), which adapter,
and the :class:`RunKey` two runs must share for their per-case outcomes to be compared.

Base identity comes from the model arguments that can change greedy outputs, the backend, and for a
local folder a content fingerprint (for a hub id, the commit its revision resolves to). Keys that
lm-eval itself adds (``config_source``), placement and batching keys, and adapter keys are left out,
so one base is the same base in every flow (``toolfid run``, ``toolfid calibrate``, plain ``lm_eval``,
``simple_evaluate``).
"""

from __future__ import annotations

import hashlib
import time
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError

log = logging.getLogger("lm_eval.toolfid")


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
    "max_loras", "max_cpu_loras",  # vLLM: how many LoRAs are resident at once (capacity, not what a row computes)
}
LM_EVAL_BOOKKEEPING_KEYS = {"config_source"}
"""Keys lm-eval itself adds to a task's metadata (the YAML's path): never part of a model's identity."""

_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
           "fp32": "float32", "float32": "float32", "float": "float32"}

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


_FINGERPRINTS: dict[tuple, str] = {}
"""(folder, every file's name, size, mtime and inode) -> its fingerprint: a run asks for the base's identity in every
view, and reading a large model's windows again for each of a hundred views costs seconds."""


def dir_fingerprint(path: str | Path) -> str:
    """Content fingerprint of a local model/adapter directory (or single file); computed once per process while
    no file of it changes (its files' size, modification time and inode are the key)."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    names = [str(file.relative_to(root) if root.is_dir() else file.name) for file in files]
    stats = [file.stat() for file in files]
    key = (str(root.resolve()), tuple((n, st.st_size, st.st_mtime_ns, st.st_ino) for n, st in zip(names, stats)))
    found = _FINGERPRINTS.get(key)
    if found is not None:
        return found
    h = hashlib.sha256()
    for name, file in zip(names, files):
        h.update(name.encode())
        _file_digest(file, h)
    digest = h.hexdigest()[:16]
    # a file changed in the last two seconds may change again within the clock's granularity, its size and time the
    # same: such a folder is not remembered (git's "racily clean" rule)
    if all(time.time_ns() - st.st_mtime_ns > 2_000_000_000 for st in stats):
        if len(_FINGERPRINTS) > 256:
            _FINGERPRINTS.clear()
        _FINGERPRINTS[key] = digest
    return digest


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


def canonical_dtype(value: Any, local: Path | None = None) -> str:
    """The dtype a model loads in: aliases folded (``bf16``, ``torch.bfloat16`` → ``bfloat16``); ``auto`` or
    absent → the dtype a local folder's config records (what HF's ``auto`` loads), else ``auto``."""
    text = str(value).removeprefix("torch.").lower() if value not in (None, "") else "auto"
    if text != "auto":
        return _DTYPES.get(text, text)
    if local is not None and (local / "config.json").is_file():
        try:
            config = json.loads((local / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "auto"
        recorded = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
        return _DTYPES.get(str(recorded).lower(), str(recorded)) if recorded else "float32"
    return "auto"


def base_identity(model_args: dict[str, Any], backend: str = "unknown") -> dict[str, Any]:
    """What identifies the base model of a run: what can change its greedy outputs, and nothing else.

    - a local folder by its content fingerprint (not its path: a copy or a move is the same model), a hub
      id by name and the commit its revision resolves to in the local cache;
    - the dtype it loads in (``auto`` resolved from a local folder's config, aliases folded);
    - every other model argument except placement and batching keys, adapter keys and lm-eval's own
      bookkeeping (``config_source``);
    - the backend.
    So one base is the same base in ``toolfid run``, ``toolfid calibrate``, plain ``lm_eval`` and
    ``simple_evaluate``, whichever task folder path or spelling of the dtype each used.
    """
    ident = {k: str(v) for k, v in sorted(model_args.items())
             if k not in NON_IDENTITY_KEYS and k not in ADAPTER_KEYS and k not in LM_EVAL_BOOKKEEPING_KEYS
             and v not in (None, "")}
    pretrained = ident.get("pretrained")
    if pretrained is None:
        raise ToolfidError("model_args has no 'pretrained': cannot identify the base model")
    ident["backend"] = backend
    local = Path(pretrained).expanduser()
    if local.exists():
        del ident["pretrained"]
        ident["fingerprint"] = dir_fingerprint(local)
        ident["dtype"] = canonical_dtype(model_args.get("dtype"), local)
    else:
        ident["dtype"] = canonical_dtype(model_args.get("dtype"))
        commit = resolved_hub_commit(pretrained, ident.get("revision"))
        if commit:
            ident["revision"] = commit
        elif ident.get("revision") in (None, "main"):
            log.warning("tool_use_fidelity: base %s is a hub id with no pinned revision and no cached commit; "
                        "pin a commit (toolfid run --revision C; lm_eval: revision=C) so a later change of the hub model "
                        "cannot pair silently", pretrained)
    return ident


def describe_base(identity: dict[str, Any]) -> str:
    """A base identity in a few words, for messages: the hub id, or the local folder's fingerprint."""
    name = identity.get("pretrained") or f"local model {identity.get('fingerprint', '?')}"
    extra = [f"{k}={v}" for k, v in sorted(identity.items()) if k not in ("pretrained", "fingerprint", "backend")]
    backend = identity.get("backend")
    return f"{name} ({', '.join(extra + [f'backend={backend}'])})"


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



def lora_settings_demand(model_args: dict[str, Any], task: str = "tool_use_fidelity") -> str | None:
    """For an adapter run that carries LoRA engine settings (vLLM's ``enable_lora``, ``max_lora_rank`` …): one line
    naming them and the base command that pairs with it, else None.

    Those settings stay in the base's identity: vLLM with LoRA enabled runs the base through another path (punica
    kernels, padded ranks), and users report base outputs that move with it, so only a base run given the same
    settings is this run's base. The base command is this run's model args without the adapter key."""
    if adapter_of(model_args) is None:
        return None
    settings = {k: v for k, v in model_args.items() if k in _ADAPTER_SETTINGS and k not in NON_IDENTITY_KEYS
                and v not in (None, "", False, "False")}
    if not settings:
        return None
    base_args = ",".join(f"{k}={v}" for k, v in model_args.items()
                         if k not in ADAPTER_KEYS and k not in LM_EVAL_BOOKKEEPING_KEYS and v not in (None, ""))
    named = ", ".join(f"{k}={v}" for k, v in settings.items())
    return (f"the base run must be given this run's LoRA settings ({named}): run `lm_eval --model vllm --model_args "
            f"{base_args} --tasks {task} …` (this command without the adapter) first")
