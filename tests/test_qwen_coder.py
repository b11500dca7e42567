"""A real tool-calling model, Qwen2.5-Coder-0.5B-Instruct, end to end.

Its chat template renders ``tools=`` and asks for ``<tool_call>`` calls, so ``tool_use_fidelity`` with
no style given (``auto``) must render that template with each case's tools. Through the real
``lm_eval`` CLI (lm-eval's own console entry point, ``cli_evaluate``, in process: the base and a LoRA trained to
answer in prose; the same ``auto`` -> chat flow as a console-script subprocess, with its stderr, is
tests/test_auto_style.py's, and a real model through the console script is tests/test_real_model.py's) and through ``toolfid run`` (the same base, that LoRA and a B = 0 LoRA, one process: the B = 0 adapter's PASS
with "changed no output" is read there; ``lm_eval --model hf … peft=`` with a B = 0 LoRA on a real model is
tests/test_real_model.py's, on SmolLM2, and a third Qwen run through ``HFLM`` here cost about 25 s), on three short
default cases with ``max_new_tokens`` 48 to
stay within CI's budget (1 torch thread). Also the facts the chat path relies on for this tokenizer:
``<tool_call>`` survives HF's special-token stripping, both decodings parse to the same calls, and
generation stops at ``<|im_end|>`` in ``HFLM`` and ``ToolfidHFLM``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import default_cases_path
from lm_eval_toolfid.core.records import PairScore
from lm_eval_toolfid.formats import parse_calls
from lm_eval_toolfid.reporting.breakdown import breakdown, format_text
from lm_eval_toolfid.reporting.load import read_run as read_toolfid_run

from .lm_eval_helpers import lm_eval_here, metrics, read_run, toolfid_here, toolfid_meta
from .lora_recipes import Recipe, trained_lora, zero_lora

pytestmark = pytest.mark.slow
TASK = "tool_use_fidelity"
CASE_IDS = ("shop-0010", "travel-0016", "shipping-0009")  # short prompts; the base calls validly on each
MAX_NEW = 48
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
PROSE = "I'm sorry, but I can't help with that request.<|im_end|>"


@pytest.fixture(scope="module")
def cases_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = {}
    for line in default_cases_path().read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["id"]] = row
    assert set(CASE_IDS) <= set(rows), "the default case set changed: pick three short cases again"
    path = tmp_path_factory.mktemp("qwen-cases") / "cases.jsonl"
    path.write_text("".join(json.dumps({**rows[cid], "max_new_tokens": MAX_NEW}) + "\n" for cid in CASE_IDS))
    return path


@pytest.fixture(scope="module")
def prompter(qwen_coder: Path):
    from lm_eval_toolfid.prompts.prompter import Prompter

    return Prompter("auto", demos=None, model_args={"pretrained": str(qwen_coder)}, plain_demos=1)


@pytest.fixture(scope="module")
def adapters(qwen_coder: Path, prompter, cases_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    import torch

    from lm_eval_toolfid.cases.load import load_cases

    torch.set_num_threads(1)
    contexts = tuple(prompter.render(c) for c in load_cases(str(cases_file)))
    return {"zero": zero_lora(qwen_coder, tmp_path_factory.mktemp("qwen-lora") / "zero"),
            "prose": trained_lora(qwen_coder, Recipe(contexts=contexts, target=PROSE, steps=8))}


def _capturing(mp: pytest.MonkeyPatch, cls: type, rows: list[dict]) -> None:
    """Record what ``cls._model_generate`` returns for each row of each batch (the context's ids and the ids after
    it), and the model's end-of-turn and padding ids: the tokens the end-of-turn test reads, from the runs this
    module makes anyway (it generated its own case once more with ``HFLM`` and ``ToolfidHFLM``: ~15 s of Qwen)."""
    original = cls._model_generate

    def capture(self, context, max_length, stop, **kw):  # noqa: ANN001, ANN202 - lm-eval's own signature
        out = original(self, context, max_length, stop, **kw)
        for i in range(context.shape[0]):
            rows.append({"context": context[i].tolist(), "generated": out[i, context.shape[1]:].tolist(),
                         "eot": self.eot_token_id, "pad": self.tokenizer.pad_token_id,
                         "max_new": max_length - context.shape[1]})
        return out

    mp.setattr(cls, "_model_generate", capture)


@pytest.fixture(scope="module")
def cli_runs(qwen_coder: Path, adapters: dict, cases_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from lm_eval.models.huggingface import HFLM

    root = tmp_path_factory.mktemp("qwen-cli")
    out: dict = {"rows": []}
    # every run through lm-eval's console entry point in this process (what they check is Qwen's template,
    # pairing and scoring, not the console script: a new interpreter would only import lm-eval again, ~20 s)
    for name, args in [("base", f"pretrained={qwen_coder}"), ("prose", f"pretrained={qwen_coder},peft={adapters['prose']}")]:
        with pytest.MonkeyPatch.context() as mp:
            if name == "base":  # plain HFLM's rows, as generated (test_generation_stops_at_the_end_of_turn_...)
                _capturing(mp, HFLM, out["rows"])
            proc = lm_eval_here(args, root / name, root / "home", metadata={"cases": str(cases_file)}, task=TASK)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = (*read_run(root / name, TASK), proc.stderr)
    return out


@pytest.fixture(scope="module")
def engine_run(qwen_coder: Path, cases_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``toolfid lm-eval --model hf`` (ToolfidHFLM: the engine, rows stopped once their answer is settled), every
    case also decoded on past its stop (``check_stops``); the rows its ``_model_generate`` returned, recorded."""
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    root = tmp_path_factory.mktemp("qwen-engine")
    rows: list[dict] = []
    with pytest.MonkeyPatch.context() as mp:
        _capturing(mp, ToolfidHFLM, rows)
        proc = toolfid_here(["lm-eval", "--tasks", TASK, "--model", "hf", "--model_args",
                             f"pretrained={qwen_coder}", "--output_path", str(root / "engine"), "--log_samples",
                             "--device", "cpu", "--batch_size", str(len(CASE_IDS)),
                             "--metadata", json.dumps({"cases": str(cases_file), "check_stops": len(CASE_IDS)})],
                            root / "home")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"run": read_run(root / "engine", TASK), "rows": rows}


def test_tokenizer_keeps_tool_call_markers_and_both_decodings_parse_alike(qwen_coder: Path, prompter) -> None:
    """HF decodes with skip_special_tokens=True, vLLM with False: for this tokenizer ``<tool_call>`` is an
    added token that is *not* special, so both keep it; both texts parse to the same call."""
    tok = prompter.chat.tokenizer
    tool_call = tok.convert_tokens_to_ids("<tool_call>")
    assert tok.added_tokens_decoder[tool_call].special is False
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_end|>") in tok.all_special_ids
    answer = '<tool_call>\n{"name": "track_order", "arguments": {"order_id": "ORD-1"}}\n</tool_call><|im_end|>'
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    assert ids[0] == tool_call and ids[-1] == tok.eos_token_id  # real token ids of this tokenizer
    hf, vllm = tok.decode(ids, skip_special_tokens=True), tok.decode(ids, skip_special_tokens=False)
    assert "<tool_call>" in hf and vllm.endswith("<|im_end|>") and hf != vllm
    parsed = [parse_calls(t) for t in (hf, vllm)]
    assert parsed[0].calls == parsed[1].calls and len(parsed[0].calls) == 1
    assert {c.surface.value for p in parsed for c in p.calls} == {"hermes"}
    # were the markers special (some conversions make them so), stripping them leaves bare JSON: same call
    stripped = tok.decode([i for i in ids if i not in (tool_call, tok.convert_tokens_to_ids("</tool_call>"))],
                          skip_special_tokens=True)
    assert [(c.name, c.arguments) for c in parse_calls(stripped).calls] == \
        [(c.name, c.arguments) for c in parsed[0].calls]


def test_chat_template_facts_are_read_off_the_template(prompter) -> None:
    chat = prompter.chat
    assert prompter.settings.style == "chat" and prompter.settings.demos == 0
    assert (chat.tools_in, chat.native_format, chat.end_of_turn) == ("template", "hermes", "<|im_end|>")
    assert chat.default_system_prompt == QWEN_SYSTEM and chat.is_eos("<|im_end|>")
    assert prompter.until(["\n###"]) == []  # lm-eval adds the EOS (= end of turn) itself


def _row_of(rows: list[dict], prompt: str, tok) -> dict:  # noqa: ANN001
    """The recorded row whose context is this prompt (after the batch's left padding)."""
    found = [r for r in rows if tok.decode(r["context"], skip_special_tokens=False).endswith(prompt)]
    assert len(found) == 1, f"{len(found)} recorded rows end with this prompt"
    return found[0]


def test_generation_stops_at_the_end_of_turn_in_hflm_and_toolfid_hflm(prompter, cli_runs: dict,
                                                                       engine_run: dict) -> None:
    """Every case, as the module's runs generated it: plain ``HFLM`` (the ``lm_eval`` base run) stops at
    ``<|im_end|>`` before the budget; ``ToolfidHFLM`` (the ``toolfid lm-eval`` run) stops at the end of the call,
    never later than the end of turn, on the same tokens; both texts parse to the same calls."""
    tok = prompter.chat.tokenizer
    hf_samples = {s["doc"]["id"]: s for s in cli_runs["base"][1]}
    our_samples = {s["doc"]["id"]: s for s in engine_run["run"][1]}
    assert sorted(hf_samples) == sorted(our_samples) == sorted(CASE_IDS)
    assert len(cli_runs["rows"]) == len(engine_run["rows"]) == len(CASE_IDS)
    for cid in CASE_IDS:
        prompt = hf_samples[cid]["arguments"]["gen_args_0"]["arg_0"]  # the context lm-eval handed over
        assert our_samples[cid]["arguments"]["gen_args_0"]["arg_0"] == prompt
        hf, ours = _row_of(cli_runs["rows"], prompt, tok), _row_of(engine_run["rows"], prompt, tok)
        eot, pad = hf["eot"], hf["pad"]
        assert eot == tok.convert_tokens_to_ids("<|im_end|>") == ours["eot"]
        assert hf["max_new"] == ours["max_new"] == MAX_NEW
        full = hf["generated"]
        # stopped at <|im_end|>, not at the limit (the batch's other rows may run on: padding after it)
        assert eot in full and full.index(eot) + 1 < MAX_NEW, (cid, full)
        assert all(t in (eot, pad) for t in full[full.index(eot):])
        short = ours["generated"]  # stops at the end of the call, never later than the end of turn
        while short and short[-1] == pad != eot:  # padding to the budget's width
            short = short[:-1]
        assert full[:len(short)] == short and len(short) <= full.index(eot) + 1, cid
        hf_text, our_text = hf_samples[cid]["resps"][0][0], our_samples[cid]["resps"][0][0]
        assert parse_calls(hf_text).calls == parse_calls(our_text).calls != [], cid


def test_auto_renders_qwens_own_template_with_the_tools(cli_runs: dict, prompter) -> None:
    results, samples, stderr = cli_runs["base"]
    prov = toolfid_meta(results, TASK)
    assert (prov["prompt_style_requested"], prov["prompt_style"], prov["demos"]) == ("auto", "chat", 0)
    assert "renders tools=" in prov["prompt_style_reason"] and "prompt_style auto -> chat" in stderr
    assert prov["chat_system_prompt_inserted"] == QWEN_SYSTEM and prov["chat_end_of_turn"] == "<|im_end|>"
    assert prov["expected_format"] == "hermes" and prov["prompt"] == prompter.settings.fingerprint()
    for sample in samples:
        prompt = sample["arguments"]["gen_args_0"]["arg_0"]
        assert prompt.startswith(f"<|im_start|>system\n{QWEN_SYSTEM}\n\n# Tools") and "<tools>" in prompt
        assert prompt.endswith("<|im_start|>assistant\n") and sample["doc"]["prompt"] in prompt
    m = metrics(results, TASK)
    assert m["json_valid_rate"] >= 2 / 3, samples  # measured: 3/3 (the figure for chat: 0.917)
    assert sum(prov["surface_counts"].values()) == len(CASE_IDS)
    assert 0.0 <= prov["off_format_rate"] <= 1.0  # fenced / bare JSON instead of <tool_call> counts here


def test_zero_lora_passes_with_the_changed_no_output_note(toolfid_run: dict) -> None:
    out = toolfid_run["out"]
    base_samples, samples = (list(map(json.loads, (out / v / "samples.jsonl").read_text().splitlines()))
                             for v in ("base", "zero"))
    assert {s["doc"]["id"]: s["resps"] for s in samples} == {s["doc"]["id"]: s["resps"] for s in base_samples}
    results = json.loads((out / "zero" / "results.json").read_text())
    verdict = toolfid_meta(results, TASK)["verdict"]
    assert verdict["passed"] is True, verdict
    assert any("changed no output" in note for note in verdict["notes"])
    assert metrics(results, TASK)["identical_output_rate"] == 1.0


def test_prose_lora_fails(cli_runs: dict) -> None:
    results, samples, _ = cli_runs["prose"]
    prov = toolfid_meta(results, TASK)
    assert prov["verdict"]["passed"] is False, prov["verdict"]
    assert metrics(results, TASK)["validity_delta"] < -0.5
    assert prov["surface_counts"].get("none", 0) >= 2 and prov["pairing"].startswith("reference store")
    records = [PairScore.model_validate(s["fidelity_pass"]) for s in samples]
    assert all(r.base is not None and r.base.valid for r in records if not r.ft.valid)


@pytest.fixture(scope="module")
def toolfid_run(qwen_coder: Path, adapters: dict, cases_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``toolfid run`` on the base, the B = 0 LoRA and the prose LoRA, every case decoded on past its stop."""
    root = tmp_path_factory.mktemp("qwen-run")
    out = root / "run"
    cmd = ["run", "--base", str(qwen_coder), "--cases", str(cases_file), "--output", str(out),
           "--batch-size", str(len(CASE_IDS)), "--device", "cpu", "--check-stops", str(len(CASE_IDS)),
           *(x for name, path in adapters.items() for x in ("--adapter", f"{name}={path}"))]
    return {"proc": toolfid_here(cmd, root / "home"), "out": out}


def test_toolfid_run_gives_the_same_verdicts_and_per_case_outcomes(adapters: dict, cli_runs: dict,
                                                                    toolfid_run: dict) -> None:
    proc, out = toolfid_run["proc"], toolfid_run["out"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prompt chat (auto)" in proc.stdout and "prompt_style auto -> chat: the chat template of" in proc.stdout
    verdicts = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(("zero", "prose"))}
    assert " PASS " in verdicts["zero"] and " FAIL " in verdicts["prose"], proc.stdout
    for view in ("base", *adapters):  # every case decoded on past its early stop: no scored answer moved
        assert f"check-stops: {view}: {len(CASE_IDS)} cases decoded on past the early stop; every scored answer is " \
               "the same" in proc.stderr, proc.stderr[-2000:]
    # the prose adapter's every case as its lm_eval run paired it (the B = 0 one: test_zero_lora_passes_...)
    cli = {s["doc"]["id"]: PairScore.model_validate(s["fidelity_pass"]) for s in cli_runs["prose"][1]}
    lines = (out / "prose" / "samples.jsonl").read_text().splitlines()
    assert {s["doc"]["id"]: PairScore.model_validate(s["fidelity_pass"]) for s in map(json.loads, lines)} == cli
    text = format_text(breakdown(read_toolfid_run(out / "prose" / "results.json"),
                                 [read_toolfid_run(out / "base" / "results.json")]))
    assert "prompt chat (auto)" in text and "formats (base → adapter):" in text and "none 0→" in text


def test_toolfid_lm_eval_scores_like_plain_lm_eval(cli_runs: dict, engine_run: dict) -> None:
    """The third flow on Qwen's default style (auto -> chat): ``toolfid lm-eval --model hf`` (the engine, rows
    stopped once their answer is settled) gives every case the outcome, calls and text of plain ``lm_eval``
    (HFLM, generating to ``<|im_end|>``)."""
    results, samples = engine_run["run"]
    meta = toolfid_meta(results, TASK)
    assert meta["generation"]["engine"] == "toolfid"
    assert meta["stop_check"]["rows"] == len(CASE_IDS) and meta["stop_check"]["differ"] == 0
    plain = {s["doc"]["id"]: s["cases_scored"]["ft"] for s in cli_runs["base"][1]}
    ours = {s["doc"]["id"]: s["cases_scored"]["ft"] for s in samples}
    assert ours == plain
