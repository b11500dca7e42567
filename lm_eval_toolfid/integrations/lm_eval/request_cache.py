"""lm-eval's request cache (``--use_cache DB``) and this task: which answers a run did not generate itself.

lm-eval's ``CachingLM`` keys an answer by the request alone (``hash_args``: the method name, the prompt and the
generation settings), not by the model that produced it. A base run and an adapter run of this task send the same
requests, so with one cache path the adapter run would be answered with the base's answers and pass every gate
(identical output, no change). lm-eval does not tell a task which answers came from the cache; this module works
it out before any generation, from the same ``hash_args`` lm-eval uses and the database it will read.

Each answer this task's runs put into a cache is recorded as this model's (base identity, adapter and its content
fingerprint) in ``$TOOLFID_HOME/lm_eval_cache/<the cache file's digest>.json``. A cached answer is trusted only when
that record says the same model wrote it (a cache path per model, re-used: lm-eval's purpose for the flag); any other
cached answer — another model's, or one written before toolfid recorded owners — withholds the verdict and the base
reference (:class:`CacheUse`), said in one line.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from lm_eval_toolfid.core.fsutil import atomic_write_json, exclusive, toolfid_home

log = logging.getLogger("lm_eval.toolfid")

REQUEST_TYPE = "generate_until"


def find_caching_lm() -> Any | None:
    """The ``CachingLM`` lm-eval wrapped the model in for this evaluation (``--use_cache``), found on the call stack
    (``simple_evaluate``/``evaluate`` hold it as ``lm``); None when the run uses no request cache."""
    try:
        from lm_eval.api.model import CachingLM
    except ImportError:  # pragma: no cover - lm-eval always has it
        return None
    frame = inspect.currentframe()
    while frame is not None:
        lm = frame.f_locals.get("lm")
        if isinstance(lm, CachingLM):
            return lm
        frame = frame.f_back
    return None


def lm_eval_hash(args: Any) -> str:
    """The key lm-eval's ``CachingLM`` files a ``generate_until`` request's answer under."""
    from lm_eval.api.model import hash_args

    return hash_args(REQUEST_TYPE, args)


def owners_file(cache_db: str) -> Path:
    """Where the owners of the answers this task put into ``cache_db`` are recorded."""
    digest = hashlib.sha256(os.path.realpath(cache_db).encode()).hexdigest()[:24]
    return toolfid_home() / "lm_eval_cache" / f"{digest}.json"


def _read_owners(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    owners = data.get("owners") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in owners.items()} if isinstance(owners, dict) else {}


@dataclass
class CacheUse:
    """This run's requests against lm-eval's request cache, known before generation."""

    cache_db: str
    model: str
    """This run's model, as the owner records name it (base identity + adapter and its content)."""
    total: int = 0
    """Requests lm-eval will look up in the cache (sampled ones it never caches)."""
    foreign: set[str] = field(default_factory=set)
    """Documents (their ids) the cache will answer with an answer this model is not recorded to have written."""
    own: int = 0
    """Requests the cache will answer with this model's own earlier answer."""
    fresh: list[str] = field(default_factory=list)
    """Cache keys of the requests this run generates (lm-eval stores their answers)."""

    @property
    def path_given(self) -> str:
        """The ``--use_cache`` path as the user gave it (lm-eval adds ``_rank<N>.db``)."""
        return self.cache_db.removesuffix(".db").rsplit("_rank", 1)[0]

    def record_generated(self) -> None:
        """After generation: the answers this run generated are this model's (the owners file, under a lock)."""
        if not self.fresh:
            return
        path = owners_file(self.cache_db)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with exclusive(path.with_suffix(".lock")):
                owners = _read_owners(path)
                owners.update({h: self.model for h in self.fresh})
                atomic_write_json(path, {"cache_db": os.path.realpath(self.cache_db), "owners": owners}, indent=None)
        except OSError as exc:  # the answers stay scored; a later run with this cache withholds its verdict
            log.warning("tool_use_fidelity: could not record which model wrote the cached answers (%s: %s); a later "
                        "run reading them from %s gets no verdict", type(exc).__name__, exc, self.cache_db)


def check_cache(instances: Iterable[Any], model: str) -> CacheUse | None:
    """Which of ``instances`` lm-eval's request cache will answer, and whether those answers are this model's;
    None when the run uses no cache. Sampled requests are never cached by lm-eval (it says so) and are not
    counted."""
    lm = find_caching_lm()
    if lm is None:
        return None
    use = CacheUse(cache_db=str(lm.cache_db), model=model)
    owners = _read_owners(owners_file(use.cache_db))
    db = lm.dbdict
    for inst in instances:
        if getattr(inst, "request_type", REQUEST_TYPE) != REQUEST_TYPE:
            continue
        args = inst.args
        if isinstance(args[1], dict) and args[1].get("do_sample", False):
            continue
        key = lm_eval_hash(args)
        use.total += 1
        if key not in db:
            use.fresh.append(key)
        elif owners.get(key) == model:
            use.own += 1
        else:
            use.foreign.add(str((inst.doc or {}).get("id")) if isinstance(inst.doc, dict) else key)
    return use


def cache_reason(foreign: int, total: int, path: str | None) -> str:
    """Why a run some of whose answers came from another model's cached answers has no verdict, in one line."""
    return (f"{foreign} of {total} answers came from lm-eval's request cache (--use_cache {path or 'PATH'}), which "
            "keys answers by request, not by model: they may be another model's. Run this task without --use_cache, "
            "or give each model (the base and every adapter) a cache path of its own")


def model_identity(base: dict[str, Any] | None, adapter: tuple[str, str] | None) -> str:
    """A model as the owner records name it: the base's identity and the adapter (a local folder by content)."""
    from lm_eval_toolfid.pairing.identity import canonical, dir_fingerprint

    ident: dict[str, Any] = {"base": base}
    if adapter is not None:
        mechanism, path = adapter
        local = Path(path).expanduser()
        ident["adapter"] = [mechanism, dir_fingerprint(local) if local.is_dir() else path]
    return hashlib.sha256(canonical(ident).encode()).hexdigest()[:24]
