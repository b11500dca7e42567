"""The run/ package imports only downwards: its modules' imports of one another (read with ``ast``, those inside
functions included) form no cycle, and the served session does not import the in-process one; calibration is a
session's method, which the served session refuses in one line."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import lm_eval_toolfid.run as run_pkg

RUN = Path(run_pkg.__file__).parent
PREFIX = "lm_eval_toolfid.run."


def _graph() -> dict[str, set[str]]:
    """run/ module name -> the run/ modules it imports (anywhere in the file)."""
    names = {p.stem for p in RUN.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        tree = ast.parse((RUN / f"{name}.py").read_text(encoding="utf-8"))
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module
                if module == "lm_eval_toolfid.run":
                    deps.update(a.name for a in node.names if a.name in names)
                elif module.startswith(PREFIX):
                    deps.add(module[len(PREFIX):].split(".")[0])
                elif node.level == 1:  # from .x import y
                    deps.add(module.split(".")[0])
            elif isinstance(node, ast.Import):
                deps.update(a.name[len(PREFIX):].split(".")[0] for a in node.names if a.name.startswith(PREFIX))
        graph[name] = deps - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the path that closes it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path, node, dep][[*path, node].index(dep):]
            if dep not in state:
                found = visit(dep, [*path, node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_every_run_module_imports_and_the_run_import_graph_has_no_cycle() -> None:
    graph = _graph()
    assert {"plan", "views", "session", "served_session", "runner", "calibrate"} <= set(graph)
    for name in graph:
        importlib.import_module(PREFIX + name)
    assert graph["plan"] == set(), "the plan is plain data: it imports no other run/ module"
    cycle = _cycle(graph)
    assert cycle is None, "run/ import cycle: " + " -> ".join(cycle or [])


def test_the_served_session_does_not_import_the_in_process_session() -> None:
    assert "session" not in _graph()["served_session"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_served_session_refuses_a_calibration_in_one_line(tmp_path: Path) -> None:
    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.run.plan import CalibrationSpec, RunPlan, ServedOptions
    from lm_eval_toolfid.run.served_session import ServedSession

    session = object.__new__(ServedSession)  # no server needed: the refusal reads nothing of it
    spec = CalibrationSpec(runs=1, out=tmp_path / "calibration.json")
    plan = RunPlan("base", {"a": "a"}, "task", models=ServedOptions(server="http://127.0.0.1:9"), calibration=spec)
    with pytest.raises(ToolfidError, match=r"^null calibration runs in process \(the session must load the base\)$"):
        session.calibrate(spec, plan)
    assert not (tmp_path / "calibration.json").exists()
