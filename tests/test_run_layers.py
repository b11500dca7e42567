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
    assert {"plan", "output", "resume", "views", "session", "served_session", "runner", "calibrate"} <= set(graph)
    assert "nulls" not in graph, "a calibration spec's files are the calibration layer's (calibration/nulls.py)"
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
    from lm_eval_toolfid.calibration.nulls import CalibrationSpec
    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.pairing.served import server_url
    from lm_eval_toolfid.run.plan import RunPlan, ServedOptions
    from lm_eval_toolfid.run.served_session import ServedSession

    session = object.__new__(ServedSession)  # no server needed: the refusal reads nothing of it
    spec = CalibrationSpec(runs=1, out=tmp_path / "calibration.json")
    served = ServedOptions(server=server_url("http://127.0.0.1:9"))
    plan = RunPlan("base", {"a": "a"}, "task", models=served, calibration=spec)
    with pytest.raises(ToolfidError, match=r"^null calibration runs in process \(the session must load the base\)$"):
        session.calibrate(spec, plan)
    assert not (tmp_path / "calibration.json").exists()


def test_the_command_line_becomes_one_frozen_record_before_anything_loads(tmp_path: Path) -> None:
    """``toolfid run``'s arguments are parsed and checked into one frozen :class:`RunCommand` (the plan the runner
    executes, the report's options, what decides the exit code) without opening a session or contacting a server."""
    import dataclasses

    from lm_eval_toolfid.cli import parse_args
    from lm_eval_toolfid.cli.run import RunCommand, plan_command
    from lm_eval_toolfid.run.plan import ServedOptions

    args = parse_args(["run", "--base", "b", "--adapter", "x=a1", "--server", "http://127.0.0.1:9", "--concurrency",
                       "3", "--output", str(tmp_path / "out"), "--gate", "--json", "--limit", "2"])
    command = plan_command(args)
    assert isinstance(command, RunCommand) and isinstance(command.plan.models, ServedOptions)
    assert command.plan.models.connection.concurrency == 3 and dict(command.plan.adapters) == {"x": "a1"}
    assert (command.plan.models.server.root, command.plan.models.model_args()["base_url"]) == (
        "http://127.0.0.1:9/v1", "http://127.0.0.1:9")  # resolved once; model args record the URL as given
    assert (command.plan.limit, command.plan.out_dir, command.gate) == (2, tmp_path / "out", True)
    assert (command.report.json, command.report.base, command.report.task) == (True, "b", command.plan.task)
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.gate = False  # type: ignore[misc]
    assert not (tmp_path / "out").exists()


def test_a_malformed_server_url_fails_in_the_plan_in_one_line() -> None:
    from lm_eval_toolfid.cli import parse_args
    from lm_eval_toolfid.cli.run import plan_command
    from lm_eval_toolfid.core.errors import ToolfidError

    args = parse_args(["run", "--base", "b", "--adapter", "a", "--server", "localhost:8000"])
    with pytest.raises(ToolfidError, match=r"^base_url 'localhost:8000' is not an http\(s\) URL"):
        plan_command(args)


def test_a_served_session_contacts_its_server_when_checked_not_when_made() -> None:
    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.pairing.served import server_url
    from lm_eval_toolfid.run.plan import RunPlan, ServedOptions
    from lm_eval_toolfid.run.served_session import ServedSession
    from lm_eval_toolfid.serving.connection import Connection

    options = ServedOptions(server=server_url("http://127.0.0.1:9"), connection=Connection(max_retries=0, timeout=2.0))
    session = ServedSession("b", options)  # nothing asked yet
    with pytest.raises(ToolfidError, match="is not reachable"):
        session.check(RunPlan("b", {"x": "a"}, "task", models=options))


def test_the_run_arguments_travel_no_further_than_measured() -> None:
    """``scripts/run_arg_path.py`` (docs/architecture.md, "How far the arguments travel"): a change that sends
    ``toolfid run``'s arguments through more modules, or back up more often, says so here (update the bound and
    the docs when that is the intent)."""
    from scripts.run_arg_path import measure

    path, ups, _ = measure()
    assert len(path) <= 33 and ups <= 8, (len(path), ups, path)


def _package(root: Path, files: dict[str, str]) -> Path:
    """A tiny ``lm_eval_toolfid`` tree for the walk (module path -> source)."""
    for name, source in files.items():
        path = root / "lm_eval_toolfid" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root / "lm_eval_toolfid"


def test_the_walk_follows_an_argument_read_with_getattr_or_converted(tmp_path: Path) -> None:
    """``Connection(timeout=float(args.timeout), key=getattr(args, "key", None))`` hands the arguments on (as
    ``cli/served_options.connection_from_args`` does); a computed value (``len``, arithmetic) does not."""
    from scripts.run_arg_path import measure

    conn = "class Conn:\n    def __init__(self, timeout, key=None):\n        self.timeout = timeout\n"
    given = _package(tmp_path / "a", {
        "cli/run.py": "from lm_eval_toolfid.serving.conn import Conn\n\n\ndef cmd_run(args):\n"
                      "    return Conn(timeout=float(args.timeout), key=getattr(args, 'key', None))\n",
        "serving/conn.py": conn})
    computed = _package(tmp_path / "b", {
        "cli/run.py": "from lm_eval_toolfid.serving.conn import Conn\n\n\ndef cmd_run(args):\n"
                      "    return Conn(timeout=len(args.items) * 2.0)\n",
        "serving/conn.py": conn})
    assert measure(given)[0] == ["lm_eval_toolfid.cli.run", "lm_eval_toolfid.serving.conn"]
    assert measure(computed)[0] == ["lm_eval_toolfid.cli.run"]
