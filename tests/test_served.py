"""Served models against a real server: ``transformers serve`` on loopback, SmolLM2-135M-Instruct as the base and a
LoRA merged into a copy of it (``transformers serve`` loads whole models), 2 default cases (:data:`CASES`, at most 48
new tokens).

- ``toolfid run --server`` pairs the served base and adapter views; the base view's per-case scored answers equal
  plain ``lm_eval --model hf`` on the same weights (the merged adapter's too: checked when this was built, left out
  of the suite for time); the verdict equals the in-process ``toolfid run`` with the PEFT adapter.
- the chat and raw styles (``tool_use_fidelity_chat``, ``_raw``) score alike served and in plain ``lm_eval --model hf``;
- lm-eval's own ``local-completions`` (``tokenized_requests=False``) scores the base alike and writes the same base
  reference (so either flow pairs with the other); without ``tokenized_requests=False`` it is refused in one line.
- The server killed mid-run: the view stops (exit 6), its answers are kept, ``--resume`` against the restarted
  server completes it with the same answers.
- The chat path (``--api chat``) sends the tools and scores what comes back (text for SmolLM2).

Cost: every request is a real generation in the server (a long primed prompt, up to 48 new tokens: seconds of CPU
on a loaded core), so each test asks the fewest cases that still make its assertion bite (said in the test); the
merged adapter is made once per machine beside the cached LoRA.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .lm_eval_helpers import BIN, lm_eval_here, toolfid_here
from .lora_recipes import Recipe, trained_lora
from .served_helpers import Server, merged_copy

# plain `lm_eval --model hf` and `toolfid lm-eval` run through their entry points in this process (lm-eval's task
# folder indexed once per process); the fixture's `toolfid run --server` runs as the console script, as a user runs it
pytestmark = pytest.mark.slow
TASK = "tool_use_fidelity"
CASES = ("bank-0006", "shipping-0008")
"""Two default cases, alone in the module's case file (plain-v3 takes its example calls from the file, so the prompts
are those of this file). SmolLM2's base, primed, answers ``bank-0006`` with a valid call that ends early at ``\\n###``
and runs on to the token budget on ``shipping-0008`` (a digit string: ``finish_reason`` ``length``); chat and raw
ramble to the budget on ``shipping-0008``. So every comparison of served and in-process answers keeps an answer
stopped by the stop string and one cut by the budget, the verdict has a base that makes valid calls (half of the
cases: ``min_base_validity`` 20%), and a short case comes first for the one-case tests (chat path,
local-completions). The 4 cases before (the first 4 default cases) had no valid base call at all, so both verdicts
were UNDECIDED and their equality could not fail."""
N = len(CASES)
MAX_NEW = 48
"""bank-0006's call with its ``\\n\\n###`` is 35 tokens, its chat answer 18, the prose adapter's 9; shipping-0008's
answers run on past 96 tokens in plain-v3 (a digit string), chat and raw: a smaller budget cuts the same answers,
48 tokens sooner (it was 96)."""
PROSE = "I would rather tell you about bread."
"""The prose adapter's answer, trained on both cases' plain-v3 prompts followed by ``\\n###`` (the task's stop
string) and on the first case's chat prompt followed by the end of turn: its answers end after 9 tokens in every
flow instead of running on to the budget (the adapter before was trained on prose alone and rambled to the budget)."""


def _env(home: Path) -> dict[str, str]:
    return dict(os.environ, TOOLFID_HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                OMP_NUM_THREADS="1")


def _toolfid(args: list[str], home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "toolfid"), *args], capture_output=True, text=True, env=_env(home), timeout=1800)


def _inproc(args: list[str], home: Path) -> tuple[int, str, str]:
    """``toolfid ARGS`` in this process (tests/lm_eval_helpers.toolfid_here, with this module's environment):
    exit code, stdout, stderr."""
    run = toolfid_here(args, home, env=_env(home))
    return run.returncode, run.stdout, run.stderr


def _view(folder: Path) -> tuple[dict, dict[str, dict]]:
    results = json.loads((folder / "results.json").read_text())
    rows = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines() if x.strip()]
    return results, {r["doc"]["id"]: r for r in rows}


def _lm_eval_samples(out: Path, task: str = TASK) -> dict[str, dict]:
    # samples_TASK_<date>.jsonl: not samples_TASK_chat_<date>.jsonl, where one run wrote several tasks
    path = sorted(p for p in out.rglob(f"samples_{task}_*.jsonl") if p.name[len(f"samples_{task}_"):][:1].isdigit())[-1]
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {r["doc"]["id"]: r for r in rows}


def _scored(sample: dict) -> tuple:
    record = sample.get("fidelity_pass") or sample.get("cases_scored")
    ft = record["ft"]
    return ft["kind"], ft.get("name"), json.dumps(ft.get("arguments"), sort_keys=True), ft.get("text")


def _meta(results: dict) -> dict:
    return results["configs"][TASK]["metadata"]["toolfid"]


@pytest.fixture(scope="module")
def served(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    import torch

    from lm_eval_toolfid.cases.bundled import default_cases_path
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import Prompter

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("served")
    rows = {row["id"]: row for row in (json.loads(x) for x in default_cases_path().read_text(encoding="utf-8")
                                       .splitlines() if x.strip())}
    cases_file = root / "cases.jsonl"
    cases_file.write_text("".join(json.dumps({**rows[cid], "max_new_tokens": MAX_NEW}) + "\n" for cid in CASES))
    cases = load_cases(str(cases_file))
    plain, chat = (Prompter(style, demos=None, model_args={"pretrained": str(smollm2)}, plain_demos=1,
                            template="plain-v3", cases=cases) for style in ("auto", "chat"))
    # prose on every case, each answer ended where its flow stops: a real change for the verdict to see (a valid
    # base call on bank-0006 becomes no call), and answers of 9 tokens in the server instead of the budget's 48
    recipe = Recipe(contexts=(*(plain.render(c) for c in cases), chat.render(cases[0])),
                    target="", targets=(*(PROSE + "\n###" for _ in cases), PROSE + "<|im_end|>"))
    adapter = trained_lora(smollm2, recipe)
    merged = merged_copy(smollm2, adapter)  # once per machine, beside the cached adapter
    # models stay loaded for the module (the default unloads one idle for 300 s: a slow in-process test between two
    # served ones would make the server load it again)
    server = Server(root / "serve.log", extra=["--model-timeout", "36000"]).start()
    home = root / "home"
    out = {"root": root, "server": server, "adapter": adapter, "merged": merged, "home": home, "cases": cases_file}
    try:
        t0 = time.monotonic()
        proc = _toolfid(["run", "--server", server.url, "--base", str(smollm2), "--adapter", f"prose={merged}",
                         "--cases", str(cases_file), "--output", str(root / "run"), "--json"], home)
        out["run_seconds"] = time.monotonic() - t0
        assert proc.returncode in (0, 1, 2), proc.stderr[-3000:]
        out["run"] = json.loads(proc.stdout)
        # plain `lm_eval --model hf` on the same weights, run once for every comparison below (it was two runs): the
        # whole subset in tool_use_fidelity, the first 2 cases of each other prompt style (--samples, as --limit 2)
        samples = {task: [0, 1] for task in STYLE_TASKS}
        hf = lm_eval_here(f"pretrained={smollm2}", root / "hf", root / "home-hf", task=",".join([TASK, *STYLE_TASKS]),
                          metadata={"cases": str(cases_file)},
                          extra=["--batch_size", "1", "--samples", json.dumps(samples)])
        assert hf.returncode == 0, hf.stderr[-3000:]
        yield out
    finally:
        server.stop()


def test_served_views_pair_and_the_base_equals_lm_eval_hf(served: dict, smollm2: Path) -> None:
    root = served["root"]
    base_results, base = _view(root / "run" / "base")
    ad_results, ad = _view(root / "run" / "prose")
    assert len(base) == len(ad) == N
    assert _meta(ad_results)["pairing"].startswith("reference store: ")
    assert _meta(ad_results)["run_key"]["base"]["backend"] == "openai-completions"
    assert _meta(ad_results)["served"]["shapes"] == {"text": N}
    # the cases still bite (CASES): one base answer ended by the stop string, the other cut by the budget
    counts = _meta(base_results)["served"]
    assert counts["stop_string_echoed"] == 1 and counts["cut_by_max_tokens"] == 1, counts
    hf = _lm_eval_samples(root / "hf")  # the fixture's plain `lm_eval --model hf` run
    assert set(hf) == set(base)
    differ = [cid for cid in hf if _scored(hf[cid]) != _scored(base[cid])]
    assert not differ, [(cid, _scored(hf[cid]), _scored(base[cid])) for cid in differ[:2]]
    # the adapter changed something, and the verdict saw it
    assert _meta(ad_results)["summary"]["metrics"]["identical_output_rate"] < 1.0


STYLE_TASKS = ["tool_use_fidelity_chat", "tool_use_fidelity_raw"]
"""With ``tool_use_fidelity`` (SmolLM2: ``auto`` → primed plain-v3, the base run above): every prompt style the task
folder has a task for — the chat template rendered locally and sent as text, and the bare request."""


def test_every_prompt_style_scores_alike_served_and_in_process(served: dict, smollm2: Path) -> None:
    root, url = served["root"], served["server"].url
    meta = json.dumps({"cases": str(served["cases"])})
    tasks = ",".join(STYLE_TASKS)
    # 2 cases a style (as before): a style rendered differently in one flow shows on any case; the second keeps a
    # case whose prompt differs from the first's in tools and request, so a per-case rendering slip shows too
    code, _, err = _inproc(["lm-eval", "--tasks", tasks, "--model", "toolfid-server", "--model_args",
                            f"model={smollm2},base_url={url}", "--metadata", meta, "--limit", "2", "--output_path",
                            str(root / "styles-served"), "--log_samples"], root / "home-styles-served")
    assert code == 0, err[-3000:]
    for task in STYLE_TASKS:
        a, b = _lm_eval_samples(root / "styles-served", task), _lm_eval_samples(root / "hf", task)
        assert len(a) == 2 and {c: _scored(s) for c, s in a.items()} == {c: _scored(s) for c, s in b.items()}, task


def test_the_verdict_equals_the_in_process_flow(served: dict, smollm2: Path) -> None:
    root = served["root"]
    code, stdout, err = _inproc(["run", "--base", str(smollm2), "--adapter", f"prose={served['adapter']}",
                                 "--cases", str(served["cases"]), "--output", str(root / "inproc"), "--json",
                                 "--device", "cpu"], root / "home-inproc")
    assert code in (0, 1, 2), err[-3000:]
    inproc = json.loads(stdout)["adapters"]["prose"]["verdict"]
    verdict = served["run"]["adapters"]["prose"]["verdict"]
    assert verdict["label"] == inproc["label"]
    # a verdict that decides: the base makes a valid call on bank-0006 and the adapter answers prose there (validity
    # -0.5: FAIL). Served answers that were the base's (the adapter's name lost on the way) would PASS, a served view
    # short of a valid base call would be UNDECIDED: either differs from the in-process verdict, and so would any gate
    assert verdict["label"] == "FAIL", verdict["reason"]
    assert verdict["gates"] == inproc["gates"]


def test_lm_eval_local_completions_scores_alike_and_writes_the_same_reference(served: dict, smollm2: Path) -> None:
    root, url = served["root"], served["server"].url
    base_results, base = _view(root / "run" / "base")
    # 1 case (was 2): what is compared is lm-eval's own client against toolfid-server on the prompt the task renders
    # (the per-case rendering is the styles test's, on 2 cases) and the reference key the run writes
    code, _, err = _inproc(["lm-eval", "--tasks", TASK, "--model", "local-completions", "--model_args",
                            f"model={smollm2},base_url={url}/v1/completions,tokenized_requests=False", "--metadata",
                            json.dumps({"cases": str(served["cases"])}), "--limit", "1", "--output_path",
                            str(root / "lc"), "--log_samples"], served["home"])
    assert code == 0, err[-3000:]
    lc = _lm_eval_samples(root / "lc")
    assert len(lc) == 1 and {cid: _scored(s) for cid, s in lc.items()} == {cid: _scored(base[cid]) for cid in lc}
    # the same base key as toolfid-server's (a subset reference beside the whole one)
    lc_meta = json.loads(sorted((root / "lc").rglob("results_*.json"))[-1].read_text())["configs"][TASK]["metadata"]
    assert lc_meta["toolfid"]["run_key"]["base"] == _meta(base_results)["run_key"]["base"]
    assert Path(lc_meta["toolfid"]["reference_written"]).name.split(".")[0] == \
        Path(_meta(base_results)["reference_written"]).name.split(".")[0]
    # token ids instead of the prompt text: refused in one line
    code, _, err = _inproc(["lm-eval", "--tasks", TASK, "--model", "local-completions", "--model_args",
                            f"model={smollm2},base_url={url}/v1/completions", "--limit", "1"], served["home"])
    assert code != 0 and "tokenized_requests=False" in err and "Traceback" not in err


def test_a_server_killed_mid_run_stops_the_view_and_resume_completes_it(served: dict, smollm2: Path) -> None:
    """2 cases (the module's two, both the prose adapter was trained on), one request in flight: the real server is
    killed as soon as the first answer (bank-0006's short call) is journaled, while shipping-0008's answer (48 tokens,
    seconds of generation) is being written, so the base view stops with exactly one answer kept and one asked again
    by the resume, and the adapter view runs only after the restart; both are compared case by case with the
    uninterrupted run. (3 cases added two generations and nothing the assertions read.) The stopped run is
    ``toolfid run`` in this process (its exit code and stderr as the console gives them); a watcher thread kills
    the server's whole process group the moment the journal has a line."""
    root, server = served["root"], served["server"]
    out = root / "killed"
    args = ["run", "--server", server.url, "--base", str(smollm2), "--adapter", f"prose={served['merged']}",
            "--cases", str(served["cases"]), "--limit", "2", "--output", str(out), "--json", "--concurrency", "1",
            "--max-retries", "2"]
    journal = out / ".served" / "base.jsonl"
    done, killed = threading.Event(), threading.Event()

    def kill_at_the_first_answer() -> None:
        while not done.is_set():
            if journal.is_file() and journal.read_text().count("\n") >= 1:  # one whole line: one answer kept
                server.stop()
                killed.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_at_the_first_answer, daemon=True)
    watcher.start()
    try:
        code, _, stderr = _inproc(args, root / "home-killed")
    finally:
        done.set()
        watcher.join(timeout=60)
    assert killed.is_set(), f"the run ended (exit {code}) before the server was killed: {stderr[-2000:]}"
    assert code == 6, stderr[-3000:]
    assert "--resume" in stderr and "Traceback" not in stderr
    kept = len(journal.read_text().splitlines())
    assert 1 <= kept < 2
    server.start()
    code, _, err = _inproc([*args, "--resume"], root / "home-killed")  # the resume: in this process
    assert code in (0, 1, 2), err[-3000:]
    for label in ("base", "prose"):
        _, resumed = _view(out / label)
        _, whole = _view(root / "run" / label)
        assert len(resumed) == 2 and {c: _scored(s) for c, s in resumed.items()} == {c: _scored(whole[c]) for c in resumed}


def test_the_chat_path_sends_tools_and_scores_what_comes_back(served: dict, smollm2: Path) -> None:
    # 1 case (was 2): every assertion is about the path (the backend, the style, the pairing, a scored outcome per
    # answer), none compares cases, and each case costs a base and an adapter generation in the server
    root, url = served["root"], served["server"].url
    code, _, err = _inproc(["run", "--server", url, "--api", "chat", "--base", str(smollm2), "--adapter",
                            f"prose={served['merged']}", "--cases", str(served["cases"]), "--limit", "1", "--output",
                            str(root / "chat"), "--json"], root / "home-chat")
    assert code in (0, 1, 2), err[-3000:]
    results, samples = _view(root / "chat" / "prose")
    meta = _meta(results)
    assert meta["run_key"]["base"]["backend"] == "openai-chat-tools" and meta["prompt_style"] == "chat"
    assert sum(meta["served"]["shapes"].values()) == 1  # SmolLM2's template ignores tools=: text comes back
    assert meta["pairing"].startswith("reference store: ")
    assert all(s["fidelity_pass"]["ft"]["kind"] for s in samples.values())
