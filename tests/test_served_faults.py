"""Served models: every fault is a one-line error or a resumable stop, nothing lost (an in-process endpoint that
misbehaves on purpose; the real ``transformers serve`` runs in tests/test_served.py)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from lm_eval_toolfid.cli import main

from .fake_server import Fake, serve
from .lm_eval_helpers import FIXTURE_TASK

# in-process `toolfid lm-eval` calls: lm-eval's own task folder indexed once per process (tests/lm_eval_helpers.py)

N_CASES = 12  # the first cases of the fixture set (--limit)


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOOLFID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "home"


def _run(url: str, out: Path, *extra: str, adapter: str = "fake-ad") -> list[str]:
    limit = [] if "--limit" in extra else ["--limit", str(N_CASES)]
    return ["run", "--server", url, "--base", "fake-base", "--adapter", f"ad={adapter}", "--task", FIXTURE_TASK,
            "--output", str(out), "--json", *limit, *extra]


@pytest.fixture
def backoff(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The served client's waits before asking again (``pause``: 0.5 s, doubling, where the server says nothing of
    when to come back), recorded, and slept a tenth as long: the retries run as they do, the test does not idle
    through half-seconds, and it asserts the waits the client chose."""
    from lm_eval_toolfid.serving import client, pacing

    waits: list[float] = []

    def pause(seconds: float, cancel: object = None) -> bool:
        waits.append(seconds)
        return pacing.pause(seconds / 10, cancel)  # type: ignore[arg-type]

    monkeypatch.setattr(client, "pause", pause)
    return waits


def _toolfid(out: Path, label: str) -> dict:
    results = json.loads((out / label / "results.json").read_text())
    return results["configs"][FIXTURE_TASK]["metadata"]["toolfid"]


def _samples(out: Path, label: str) -> dict[str, dict]:
    rows = [json.loads(line) for line in (out / label / "samples.jsonl").read_text().splitlines() if line.strip()]
    return {r["doc"]["id"]: r for r in rows}


def test_server_down_at_start_is_one_line(home: Path, tmp_path: Path) -> None:
    url, stop = serve(Fake())
    stop()  # nothing listens on that port now
    code, _, err = _main(_run(url, tmp_path / "out"))
    assert code == 4
    assert "not reachable" in err and len(err.strip().splitlines()) == 1, err


def test_a_served_pair_scores_and_reports_what_came_back(home: Path, tmp_path: Path) -> None:
    """The base alone, then both adapter views asked together in one pool: the first adapter request answered
    2.5 s late, the other adapter's requests are all sent meanwhile (not after the first adapter view); no base
    request shares the adapters' stream."""
    fake = Fake(models=[{"id": "fake-base"}, {"id": "fake-ad", "parent": "fake-base"},
                        {"id": "fake-ad2", "parent": "fake-base"}],
                plan=lambda n, body: "slow" if n == N_CASES else None)
    url, stop = serve(fake)
    try:
        code, stdout, err = _main(_run(url, tmp_path / "out", "--concurrency", "4", "--adapter", "ad2=fake-ad2"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    models = [model for _, model in fake.answered_at]
    assert models[:N_CASES] == ["fake-base"] * N_CASES and "fake-base" not in models[N_CASES:]
    slow_sent = fake.answered_at[N_CASES][0]
    second_sent = [t for t, model in fake.answered_at if model == "fake-ad2"]
    assert models[N_CASES] == "fake-ad" and len(second_sent) == N_CASES
    assert max(second_sent) < slow_sent + 2.0, (slow_sent, second_sent)  # before ad's first answer came
    assert f"ad + ad2, asked together: 2 × {N_CASES} cases in" in err, err
    assert f"ad2: {N_CASES} cases (asked above, together with ad)" in err, err
    assert "no base reference" not in err, err  # the later adapter's requests were built after the base view
    assert json.loads(stdout)["adapters"]["ad2"]["metrics"]["base_json_valid_rate"] is not None, stdout
    fake.requests[:] = [r for r in fake.requests if r["model"] != "fake-ad2"]  # the checks below: base and ad
    report = json.loads(stdout)
    assert report["adapters"]["ad"]["metrics"]["base_json_valid_rate"] is not None  # paired
    assert len(fake.requests) == 2 * N_CASES
    assert {r["model"] for r in fake.requests} == {"fake-base", "fake-ad"}
    assert all(r["temperature"] == 0 and r["stop"] == ["\n###"] for r in fake.requests)
    served = _toolfid(tmp_path / "out", "ad")["served"]
    assert served["shapes"] == {"text": N_CASES} and served["retried"] == 0
    assert _toolfid(tmp_path / "out", "ad")["adapter_mechanism"] == "served"
    # the report and the gate see a served adapter run as an adapter run of its base
    code, stdout, err = _main(["compare", str(tmp_path / "out"), "--format", "json"])
    rows = json.loads(stdout)
    rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
    assert code == 0 and any(r.get("adapter") == "fake-ad" and r.get("model") == "fake-base" for r in rows), stdout
    code, _, err = _main(["gate", str(tmp_path / "out")])
    assert code in (0, 1, 2) and "ad" in err + _
    # every view records lm-eval's environment block (collected once per process: run/views.py)
    envs = {json.loads((tmp_path / "out" / label / "results.json").read_text())["pretty_env_info"]
            for label in ("base", "ad")}
    assert len(envs) == 1 and "PyTorch version" in envs.pop()


def test_lm_evals_environment_is_collected_once_per_process_and_copied_into_each_view(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-eval's ``add_env_info`` runs torch's collect_env (a ``pip list`` subprocess) for every
    ``simple_evaluate``: a run of N views collects it once (per working directory, whose parent's git hash it
    records) and gives each view its own copy of the same keys."""
    import os

    from lm_eval_toolfid.run.views import _env_info_once

    calls: list[str] = []

    def collect(storage: dict) -> None:
        calls.append(os.getcwd())
        storage.update(pretty_env_info=f"env {len(calls)}", upper_git_hash=None, nested={"k": 1})

    once = _env_info_once(collect)
    first, second = {"results": 1}, {}
    once(first)
    once(second)
    assert calls == [os.getcwd()]
    assert first == {"results": 1, "pretty_env_info": "env 1", "upper_git_hash": None, "nested": {"k": 1}}
    first["nested"]["k"] = 2  # a view's copy is its own
    assert second == {"pretty_env_info": "env 1", "upper_git_hash": None, "nested": {"k": 1}}
    monkeypatch.chdir(tmp_path)
    elsewhere: dict = {}
    once(elsewhere)
    assert len(calls) == 2 and elsewhere["pretty_env_info"] == "env 2"


def test_transient_failures_are_retried(home: Path, tmp_path: Path, backoff: list[float]) -> None:
    url, stop = serve(Fake(plan=lambda n, body: "503" if n in (0, 1) else None))
    try:
        code, _, err = _main(_run(url, tmp_path / "out", "--concurrency", "1"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    assert _toolfid(tmp_path / "out", "base")["served"]["retried"] == 1  # one request, asked three times
    assert backoff == [0.5, 1.0]


def test_a_timed_out_request_is_asked_again(home: Path, tmp_path: Path, backoff: list[float]) -> None:
    fake = Fake(plan=lambda n, body: "slow" if n == 0 else None)
    url, stop = serve(fake)
    try:
        code, _, err = _main(_run(url, tmp_path / "out", "--concurrency", "1", "--timeout", "1", "--limit", "3"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    assert _toolfid(tmp_path / "out", "base")["served"]["retried"] == 1
    assert len(_samples(tmp_path / "out", "base")) == 3
    assert backoff == [0.5]


def test_a_server_failing_mid_view_stops_it_and_resume_asks_only_the_rest(home: Path, tmp_path: Path,
                                                                           backoff: list[float]) -> None:
    out = tmp_path / "out"
    failing = {"on": True}
    fake = Fake(plan=lambda n, body: "down" if failing["on"] and n >= 5 else None)
    url, stop = serve(fake)
    try:
        code, _, err = _main(_run(url, out, "--concurrency", "1", "--max-retries", "1"))
        assert code == 6, err[-2000:]
        assert "failed a request" in err and "--resume" in err and "5 answers kept" in err
        journal = out / ".served" / "base.jsonl"
        assert len(journal.read_text().splitlines()) == 5
        failing["on"], fake.down = False, False
        fake.requests.clear()
        code, stdout, err = _main(_run(url, out, "--concurrency", "3", "--resume"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    assert len(fake.requests) == (N_CASES - 5) + N_CASES  # the base view's rest, then the adapter view
    assert len(_samples(out, "base")) == N_CASES and not journal.exists()
    assert json.loads(stdout)["adapters"]["ad"]["metrics"]["base_json_valid_rate"] is not None
    assert backoff == [0.5]  # the one retry --max-retries 1 allows


@pytest.mark.parametrize("what, words", [("garbage", "malformed response"), ("nochoices", "no choices"),
                                         ("400", "refused a request"), ("down", "failed a request")])
def test_bad_answers_stop_the_view_in_one_line(home: Path, tmp_path: Path, what: str, words: str,
                                               backoff: list[float]) -> None:
    fake = Fake(plan=lambda n, body: what)
    url, stop = serve(fake)
    try:
        code, _, err = _main(_run(url, tmp_path / "out", "--concurrency", "1", "--max-retries", "1"))
    finally:
        stop()
    assert code == 6 and words in err, err[-2000:]
    assert len(fake.requests) == (1 if what == "400" else 2)  # a 400 is not retried
    assert backoff == ([] if what == "400" else [0.5])
    assert "Traceback" not in err


@pytest.mark.parametrize("failing", ["all", "one"])
def test_requests_a_healthy_server_fails_are_not_answers(home: Path, tmp_path: Path, backoff: list[float],
                                                         failing: str) -> None:
    """The server answers 500 to one adapter's requests (all of them, or one), the base's, the other adapter's and
    /v1/models fine: no view with a failed request is scored, --gate turns nothing into FAIL (exit 6, one line: how
    many failed of how many, what --resume does); the finished views are kept, and --resume asks only the failed
    requests. (transformers serve's tool parser answers 500 to a call whose JSON does not close: not an answer.)"""
    out, broken = tmp_path / "out", {"on": True}

    def plan(n: int, body: dict) -> str | None:
        mine = body.get("model") == "fake-ad" and broken["on"]
        return "500" if mine and (failing == "all" or "Osaka" in json.dumps(body)) else None

    fake = Fake(models=[{"id": "fake-base"}, {"id": "fake-ad"}, {"id": "fake-ad2"}], plan=plan)
    url, stop = serve(fake)
    args = _run(url, out, "--concurrency", "2", "--max-retries", "1", "--limit", "6", "--adapter", "ad2=fake-ad2",
                "--gate")
    try:
        code, stdout, err = _main(args)
        n = 6 if failing == "all" else 1
        assert code == 6, err[-2000:]
        assert stdout == "" and "FAIL" not in err and "Traceback" not in err
        errors = [line for line in err.splitlines() if line.startswith("toolfid: error")]
        assert len(errors) == 1 and f"{n} of 18 requests failed on the server past their retries (ad: {n} of 6" \
            in errors[0] and "HTTP 500" in errors[0] and "--resume retries the failed ones" in errors[0], err
        assert "finished views kept" in errors[0] and "(ad2, base)" in errors[0], errors[0]
        assert not (out / "ad").exists() and (out / "ad2" / "manifest.json").is_file()
        asked_ad = sum(r["model"] == "fake-ad" for r in fake.requests)
        assert asked_ad == 2 * 6 if failing == "all" else asked_ad == 6 + 1  # each failed one asked twice
        broken["on"] = False
        fake.requests.clear()
        code, stdout, err = _main(args + ["--resume"])
    finally:
        stop()
    assert code in (0, 2), err[-2000:]  # a gate on 6 cases: PASS or UNDECIDED, never FAIL
    assert [r["model"] for r in fake.requests] == ["fake-ad"] * n  # only what failed
    report = json.loads(stdout)
    assert len(_samples(out, "ad")) == 6 and report["adapters"]["ad"]["metrics"]["base_json_valid_rate"] is not None
    assert report["adapters"]["ad"]["metrics"] == report["adapters"]["ad2"]["metrics"]  # the same answers
    assert _toolfid(out, "ad")["served"].get("server_errors", 0) == 0


def test_a_cut_answer_and_an_echoed_stop_string_are_counted(home: Path, tmp_path: Path) -> None:
    url, stop = serve(Fake(plan=lambda n, body: {0: "cut", 1: "echo"}.get(n)))
    try:
        code, _, err = _main(_run(url, tmp_path / "out", "--concurrency", "1", "--limit", "4"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    served = _toolfid(tmp_path / "out", "base")["served"]
    assert served["cut_by_max_tokens"] == 1 and served["stop_string_echoed"] == 1
    samples = _samples(tmp_path / "out", "base")
    outcomes = sorted(s["cases_scored"]["ft"]["kind"] for s in samples.values())
    assert outcomes.count("malformed") == 1 and outcomes.count("valid") == 3  # the echo was cut off and scores


def test_chat_path_sends_tools_and_scores_structured_calls(home: Path, tmp_path: Path, smollm2: Path) -> None:
    plan = {0: "bad_args", 1: "tool_calls", 2: "tool_calls"}
    fake = Fake(plan=lambda n, body: plan.get(n))
    url, stop = serve(fake)
    try:
        code, _, err = _main(_run(url, tmp_path / "out", "--api", "chat", "--tokenizer", str(smollm2),
                                  "--concurrency", "1", "--limit", "4"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    first = fake.requests[0]
    assert first["tools"] and first["tools"][0]["type"] == "function" and first["messages"][-1]["role"] == "user"
    served = _toolfid(tmp_path / "out", "base")["served"]
    assert served["shapes"] == {"tool_calls": 3, "text": 1}, served
    assert served["parser_errors"] == 1 and "not JSON" in served["parser_error_example"]
    kinds = [s["cases_scored"]["ft"]["kind"] for s in _samples(tmp_path / "out", "base").values()]
    assert kinds.count("valid") == 3  # two structured calls and one text call; the unreadable arguments are not
    assert kinds.count("wrong_shape") == 1
    assert _toolfid(tmp_path / "out", "base")["run_key"]["base"]["backend"] == "openai-chat-tools"


def test_an_adapter_named_without_its_base_is_refused(home: Path, tmp_path: Path) -> None:
    url, stop = serve(Fake(models=[{"id": "fake-base"}, {"id": "fake-ad", "parent": "fake-base"}]))
    try:
        code, _, err = _main(["lm-eval", "--tasks", FIXTURE_TASK, "--model", "toolfid-server", "--model_args",
                              f"model=fake-ad,base_url={url}", "--limit", "2"])
    finally:
        stop()
    assert code == 4
    assert "is an adapter of 'fake-base'" in err and "base_model" in err and "Traceback" not in err


def test_served_names_the_server_does_not_serve_are_refused(home: Path, tmp_path: Path) -> None:
    url, stop = serve(Fake())
    try:
        code, _, err = _main(_run(url, tmp_path / "out", adapter="no-such-lora"))
    finally:
        stop()
    assert code == 4 and "does not serve 'no-such-lora'" in err


def test_an_adapter_served_by_another_server_pairs_through_base_server(home: Path, tmp_path: Path) -> None:
    """llama.cpp serves one model (with its --lora) per server: the adapter run names the base's server."""
    base_url, stop_a = serve(Fake())
    ad_url, stop_b = serve(Fake(models=[{"id": "fake-ad"}]))
    common = ["--tasks", FIXTURE_TASK, "--model", "toolfid-server", "--limit", "4", "--log_samples"]
    try:
        code, _, err = _main(["lm-eval", *common, "--model_args", f"model=fake-base,base_url={base_url}",
                              "--output_path", str(tmp_path / "base")])
        assert code == 0, err[-2000:]
        meta = {"base_model": "fake-base", "base_server": base_url}
        code, _, err = _main(["lm-eval", *common, "--model_args", f"model=fake-ad,base_url={ad_url}",
                              "--metadata", json.dumps(meta), "--output_path", str(tmp_path / "ad")])
        assert code == 0, err[-2000:]
        code, _, err = _main(["lm-eval", *common, "--model_args", f"model=fake-ad,base_url={ad_url}",
                              "--metadata", json.dumps({"base_model": "fake-base"}), "--output_path",
                              str(tmp_path / "unpaired")])
        assert code == 0, err[-2000:]
    finally:
        stop_a()
        stop_b()

    def pairing(folder: Path) -> str:
        results = json.loads(sorted(folder.rglob("results_*.json"))[-1].read_text())
        return results["configs"][FIXTURE_TASK]["metadata"]["toolfid"]["pairing"]

    assert pairing(tmp_path / "ad").startswith("reference store: ")
    assert pairing(tmp_path / "unpaired").startswith("none: ")  # another server is another base


def test_real_structured_tool_calls_recorded_from_transformers_serve(home: Path, tmp_path: Path, smollm2: Path) -> None:
    """Responses of a real ``transformers serve`` (SmolLM2 + a LoRA trained to write ``<tool_call>``, merged, its
    tokenizer declaring the ``<tool_call>`` response template), recorded by bench/record_served_tool_calls.py:
    4 structured ``tool_calls`` and 2 HTTP 500s (its tool parser failing on a call whose JSON does not close): the
    500s are failed requests (exit 6, nothing scored); without those two cases the calls are scored as they came."""
    from lm_eval_toolfid.cases.bundled import default_cases_path

    from .fake_server import recorded_replay

    data = Path(__file__).parent / "data" / "served_tool_calls.jsonl"
    recorded = {json.loads(x)["case_id"]: json.loads(x) for x in data.read_text().splitlines() if x.strip()}
    rows = [json.loads(x) for x in default_cases_path().read_text().splitlines() if x.strip()]
    cases, answered = tmp_path / "cases.jsonl", tmp_path / "answered.jsonl"
    cases.write_text("".join(json.dumps(r) + "\n" for r in rows if r["id"] in recorded))
    answered.write_text("".join(json.dumps(r) + "\n" for r in rows
                                if r["id"] in recorded and recorded[r["id"]]["status"] == 200))
    url, stop = serve(Fake(replay=recorded_replay(str(data))))

    def run(case_file: Path, out: str) -> tuple[int, str]:
        code, _, err = _main(["run", "--server", url, "--api", "chat", "--base", "fake-base", "--adapter",
                              "ad=fake-ad", "--task", FIXTURE_TASK, "--tokenizer", str(smollm2), "--cases",
                              str(case_file), "--output", str(tmp_path / out), "--json", "--max-retries", "0"])
        return code, err

    try:
        code, err = run(cases, "out-all")
        assert code == 6 and "2 of 6 requests failed on the server" in err and "HTTP 500" in err, err[-2000:]
        code, err = run(answered, "out")
    finally:
        stop()
    assert code in (0, 1, 2), err[-2000:]
    served = _toolfid(tmp_path / "out", "ad")["served"]
    assert served["shapes"] == {"tool_calls": 4} and served["parser_errors"] == 0
    samples = _samples(tmp_path / "out", "ad")
    for cid in ("hr-0013", "travel-0002", "music-0005", "home-0002"):
        call = json.loads(recorded[cid]["body"])["choices"][0]["message"]["tool_calls"][0]["function"]
        ft = samples[cid]["fidelity_pass"]["ft"]
        assert ft["n_calls"] == 1 and ft["name"] == call["name"]  # the server's structured call, as scored
        assert ft["arguments"] == json.loads(call["arguments"])


def test_lm_evals_chat_completions_class_is_refused_in_one_line(home: Path, tmp_path: Path) -> None:
    url, stop = serve(Fake())
    try:
        code, _, err = _main(["lm-eval", "--tasks", FIXTURE_TASK, "--model", "local-chat-completions", "--model_args",
                              f"model=fake-base,base_url={url}/v1/chat/completions,tokenizer_backend=None",
                              "--apply_chat_template", "--limit", "2"])
    finally:
        stop()
    assert code == 4 and "api=chat" in err and "Traceback" not in err, err[-2000:]


def test_engine_check_reports_what_the_engine_moves_by_itself(home: Path, tmp_path: Path) -> None:
    """``--engine-check``: the base asked again after the adapter. A server that answers the repeat of two base
    prompts otherwise (cut short) moves 2 of 4 cases by itself; the adapter changed one case, one of those two:
    the check, the adapter's count and its verdict's note say so; --resume reuses the check."""
    seen: dict[tuple[str, str], int] = {}
    first_prompts: list[str] = []

    def plan(n: int, body: dict) -> str | None:
        key = (str(body.get("model")), str(body.get("prompt")))
        seen[key] = seen.get(key, 0) + 1
        if body.get("model") == "fake-base" and seen[key] == 1:
            first_prompts.append(key[1])
        if body.get("model") == "fake-base" and seen[key] == 2 and key[1] in first_prompts[:2]:
            return "cut"  # the engine moves these two
        if body.get("model") == "fake-ad" and key[1] == first_prompts[0]:
            return "cut"  # the adapter changes this one
        return None

    url, stop = serve(Fake(plan=plan))
    out = tmp_path / "out"
    try:
        code, stdout, err = _main(_run(url, out, "--limit", "4", "--concurrency", "1", "--engine-check"))
        assert code in (0, 1, 2), err[-2000:]
        report = json.loads(stdout)
        assert report["engine_check"]["n"] == 4 and report["engine_check"]["identical"] == 2, report["engine_check"]
        ad = report["adapters"]["ad"]
        assert ad["engine_check"]["changed"] == 1 and ad["engine_check"]["moved_by_engine"] == 1, ad["engine_check"]
        assert any("the engine, not the adapter, moves those" in n for n in ad["verdict"]["notes"]), ad["verdict"]
        saved = json.loads((out / "engine_check.json").read_text())
        assert len(saved["changed_cases"]) == 2
        asked = len(seen)
        code, text, err = _main([a for a in _run(url, out, "--limit", "4", "--engine-check", "--resume")
                                 if a != "--json"])
    finally:
        stop()
    assert code in (0, 1, 2), err[-2000:]
    assert len(seen) == asked and sum(seen.values()) == 12  # nothing asked again: every view and the check reused
    assert "engine check: the base run twice gave the same output on 2/4 cases (0.500)" in text, text
    assert "ad: 1 of the 1 cases this adapter changed are cases the engine moves by itself" in text, text


def test_quieting_lm_eval_imports_nothing_a_served_run_does_not_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A served run silences lm-eval's bars in the modules it loaded; lm-eval's HF model module (and with it
    transformers' model classes, ~1 s of a served run's start) is not imported just to be silenced, and a module
    that is loaded has its bar swapped for the view's progress and given back after."""
    import io
    import sys

    import lm_eval.api.task

    from lm_eval_toolfid.reporting.progress import Progress, quiet_lm_eval

    monkeypatch.delitem(sys.modules, "lm_eval.models.huggingface", raising=False)
    original = lm_eval.api.task.tqdm
    with quiet_lm_eval(Progress(["base"], stream=io.StringIO(), live=False)):
        assert "lm_eval.models.huggingface" not in sys.modules
        assert lm_eval.api.task.tqdm is not original
    assert lm_eval.api.task.tqdm is original


def test_toolfid_lm_eval_with_only_the_packages_tasks_leaves_lm_evals_own_unindexed(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``toolfid lm-eval --tasks`` naming only this package's tasks does not index lm-eval's own task folder
    (~14,000 YAML files, 5-15 s a run), and runs the same task; any other name keeps lm-eval's whole index."""
    import lm_eval.tasks
    from lm_eval.tasks import _index, manager

    from lm_eval_toolfid.cases.bundled import tasks_path
    from lm_eval_toolfid.cli.lm_eval import _toolfid_tasks_only, only_toolfid_tasks, requested_tasks

    roots: list[Path] = []
    inner = _index.TaskIndex.build

    def spy(paths, **kwargs):  # noqa: ANN001, ANN202 - lm-eval's own signature
        roots.extend(Path(p).resolve() for p in paths)
        return inner(paths, **kwargs)

    monkeypatch.setattr(_index.TaskIndex, "build", staticmethod(spy))
    url, stop = serve(Fake())
    try:
        code, _, err = _main(["lm-eval", "--tasks", FIXTURE_TASK, "--model", "toolfid-server", "--model_args",
                              f"model=fake-base,base_url={url}", "--limit", "2", "--log_samples", "--output_path",
                              str(tmp_path / "out")])
    finally:
        stop()
    assert code == 0, err[-2000:]
    assert len(list((tmp_path / "out").rglob(f"samples_{FIXTURE_TASK}_*.jsonl"))) == 1
    assert tasks_path().resolve() in roots and Path(manager.__file__).resolve().parent not in roots, roots
    assert lm_eval.tasks.TaskManager is manager.TaskManager  # given back
    # which runs qualify
    assert requested_tasks(["--tasks", "a,b", "c", "--limit", "2", "-t=d"]) == ["a", "b", "c", "d"]
    assert only_toolfid_tasks(["--tasks", "tool_use_fidelity,tool_use_fidelity_chat", "--model", "hf"])
    assert only_toolfid_tasks(["--tasks=tool_use_fidelity_raw"])
    for argv in (["--tasks", "tool_use_fidelity", "hellaswag"], ["-t", "tool_use_fidelity*"], ["--model", "hf"],
                 ["--tasks", str(tasks_path() / "tool_use_fidelity")]):
        assert not only_toolfid_tasks(argv), argv
    with _toolfid_tasks_only():
        assert set(lm_eval.tasks.TaskManager(include_path=str(tasks_path())).all_tasks) == \
            set(manager.TaskManager(include_path=str(tasks_path()), include_defaults=False).all_tasks)


def test_a_response_naming_another_model_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A server (or a gateway in front of it) that answers for another model than the one asked: the answer is
    scored, and the client says once which model answered for which name; the name asked, a dated snapshot of it or
    a revision of it says nothing."""
    import logging

    from lm_eval_toolfid.serving.client import ServerClient

    url, stop = serve(Fake(plan=lambda n, body: "other_model" if body.get("model") == "fake-ad" else None))
    try:
        with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
            for model in ("fake-ad", "fake-ad", "fake-base"):
                answer = ServerClient(url, model).ask({"prompt": "What's the weather in Oslo?", "max_tokens": 64})
                assert answer.text  # scored as it came
    finally:
        stop()
    said = [r.getMessage() for r in caplog.records if "answered requests for model" in r.getMessage()]
    assert len(said) == 1 and "'fake-ad' as model 'another-model'" in said[0], said
    client = ServerClient(url, "gpt-4o")
    for named in ("gpt-4o", "gpt-4o-2024-08-06", "gpt-4o@main"):
        client._check_named({"model": named})
    assert len([r for r in caplog.records if "answered requests for model" in r.getMessage()]) == 1
