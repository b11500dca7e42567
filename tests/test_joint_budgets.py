"""Views decoded together when cases carry their own ``max_new_tokens``.

lm-eval generates a view's requests in one batch per distinct generation settings, so a case set whose cases
set their own budget reaches the model as several batches. Each batch must be decoded together with the views
after it (a view is done with a request when its answer is computed, not after its first engine run), and the
record must say how many of a view's requests were: ``rows_together`` equals ``rows`` for every view. The
answers equal each view run alone (``--views-together 1``), case for case.

Twelve fixture cases, every other one with a budget of its own: two batches per view, the smallest set where a
second batch exists for every view (the defect this guards: only the first batch went together, the second
was decoded alone while the record still named the group).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from lm_eval_toolfid.cases.bundled import fixture_cases_path, fixture_paths
from lm_eval_toolfid.cli import main

from .lm_eval_helpers import FIXTURE_TASK

FIX = fixture_paths()
ADAPTERS = ["faithful", "hallucinating"]
N = 12


def _run(out: Path, cases: Path, *extra: Any) -> None:
    args: list[Any] = ["run", "--base", FIX["base"], "--task", FIXTURE_TASK, "--device", "cpu", "--cases", cases,
                       "--no-breakdown", "--no-verify", "--output", out, *extra]
    for name in ADAPTERS:
        args += ["--adapter", f"{name}={FIX['adapters'][name]}"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = main([str(a) for a in args])
    assert code in (0, 1), stderr.getvalue()[-3000:]


def _view(out: Path, view: str) -> tuple[dict[str, Any], dict[str, Any]]:
    results = json.loads((out / view / "results.json").read_text())
    rows = [json.loads(line) for line in (out / view / "samples.jsonl").read_text().splitlines()]
    return results["configs"][FIXTURE_TASK]["metadata"]["toolfid"]["generation"], \
        {r["doc"]["id"]: r["resps"] for r in rows}


def test_cases_with_their_own_budgets_are_decoded_together_and_recorded_so(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFID_HOME", str(tmp_path / "home"))
    rows = [json.loads(x) for x in fixture_cases_path().read_text(encoding="utf-8").splitlines() if x.strip()][:N]
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps({**row, "max_new_tokens": 40} if i % 2 else row) + "\n"
                             for i, row in enumerate(rows)), encoding="utf-8")
    _run(tmp_path / "together", cases)
    _run(tmp_path / "alone", cases, "--views-together", 1)
    for view in ["base", *ADAPTERS]:
        gen, answers = _view(tmp_path / "together", view)
        alone_gen, alone = _view(tmp_path / "alone", view)
        assert len(answers) == N and answers == alone, view
        assert gen["views_together"] == ["base", *ADAPTERS], (view, gen)
        assert gen["rows_together"] == gen["rows"] == N, (view, gen)  # both budgets' batches went together
        assert "views_together" not in alone_gen and "rows_together" not in alone_gen
