"""The tree shows the architecture: concept subpackages in one-way layers, nothing loose in the root."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lm_eval_toolfid"

# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS = ["core", "formats", "scoring", "cases", "prompts", "pairing", "reporting", "calibration", "engine", "serving",
          "integrations", "run", "cli"]
NO_LM_EVAL = ["engine", "serving"]
"""Layers that must work without lm-eval: the engine runs on a bare GPU machine (bench/gpu.py), the client anywhere."""
DATA_PACKAGES = {"fixtures"}  # package data (the tiny model), no code of its own


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``lm_eval_toolfid.X`` this module imports (top level or inside functions)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "lm_eval_toolfid" else [f"lm_eval_toolfid.{a.name}"
                                                                             for a in node.names]
            out += [(node.lineno, n) for n in names if n.startswith("lm_eval_toolfid.")]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append((node.lineno, "<relative>"))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("lm_eval_toolfid.")]
    return out


def test_package_root_holds_only_init_and_subpackages():
    loose = sorted(p.name for p in PKG.iterdir() if p.is_file() and p.name != "__init__.py")
    assert loose == []
    subpackages = sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert sorted(set(subpackages) - DATA_PACKAGES) == sorted(LAYERS)


def test_layers_import_downward_only():
    upward = []
    for path in sorted(PKG.rglob("*.py")):
        layer = path.relative_to(PKG).parts[0]
        if layer not in LAYERS:
            continue
        for lineno, name in _imports(path):
            where = f"{path.relative_to(PKG.parent)}:{lineno}"
            if name == "<relative>":
                upward.append(f"{where}: relative import (use lm_eval_toolfid.<layer>...)")
                continue
            target = name.split(".")[1]
            if target == "__version__":
                continue
            assert target in LAYERS, f"{where}: imports {name}, which is in no layer"
            if LAYERS.index(target) > LAYERS.index(layer):
                upward.append(f"{where}: {layer} imports {name}")
    assert upward == []


def test_every_module_says_what_it_is():
    missing = [str(p.relative_to(PKG.parent)) for p in sorted(PKG.rglob("*.py"))
               if p.parts[-2] not in DATA_PACKAGES and ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) is None]
    assert missing == []


def test_engine_and_serving_import_no_lm_eval():
    found = []
    for layer in NO_LM_EVAL:
        for path in sorted((PKG / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                found += [f"{path.relative_to(PKG.parent)}:{node.lineno}: {n}" for n in names
                          if n == "lm_eval" or n.startswith("lm_eval.")]
    assert found == []
