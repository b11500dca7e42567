"""prompt_style auto: the model's chat template when it renders tools=, else plain; the resolved style is
what is rendered, fingerprinted, paired and recorded (with the reason, and what the template adds)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.records import Outcome, OutcomeKind, PairScore
from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings
from lm_eval_toolfid.prompts.chat import ChatPrompter, shipped_chat_template
from lm_eval_toolfid.prompts.prompter import Prompter
from lm_eval_toolfid.prompts.settings import PromptSettings
from lm_eval_toolfid.scoring.metrics import off_format_rate, summarize, surface_key

from .chat_templates import DEFAULT_SYSTEM, HERMES, IGNORES_TOOLS
from .conftest import make_case
from .lm_eval_helpers import lm_eval_cli, lm_eval_here, read_run, toolfid_meta
from .test_prompt_styles import chat_base

FIX = fixture_paths()


def test_auto_picks_chat_only_for_a_template_that_renders_tools(tmp_path):
    hermes = Prompter("auto", demos=None, model_args={"pretrained": str(chat_base(tmp_path / "h", HERMES))},
                      plain_demos=1)
    assert hermes.settings.style == "chat" and hermes.settings.demos == 0
    assert "renders tools=" in hermes.choice.reason and "hermes" in hermes.choice.reason
    assert "<tools>" in hermes.render(make_case())

    ignores = Prompter("auto", demos=None, model_args={"pretrained": str(chat_base(tmp_path / "i", IGNORES_TOOLS))},
                       template="plain-v3", plain_demos=1)
    none = Prompter("auto", demos=None, model_args={"pretrained": str(FIX["base"])}, template="plain-v3",
                    plain_demos=1)
    for prompter, why in ((ignores, "ignores tools="), (none, "has no chat template")):
        assert prompter.settings.style == "plain" and prompter.settings.demos == 1, prompter.choice
        assert why in prompter.choice.reason and prompter.chat is None
    for args, why in (({}, "no tokenizer to inspect"), ({"pretrained": str(tmp_path / "missing")}, "could not be")):
        assert why in Prompter("auto", demos=None, model_args=args).choice.reason


def test_explicit_style_or_demos_win_over_auto(tmp_path):
    base = {"pretrained": str(chat_base(tmp_path, HERMES))}
    assert Prompter("plain", demos=None, model_args=base, plain_demos=1).settings.style == "plain"
    assert Prompter("auto", demos=2, model_args=base).settings.demos == 2
    assert Prompter("plain", demos=None, model_args=base, plain_demos=1).choice.reason == "given"
    settings = TaskSettings.from_metadata({"prompt_style": "auto", "plain_demos": 1})
    assert settings.demos is None and settings.plain_demos == 1
    with pytest.raises(Exception, match="prompt_style"):
        TaskSettings.from_metadata({"prompt_style": "automatic"})


def test_resolved_style_is_what_is_fingerprinted(tmp_path):
    """auto -> chat renders and fingerprints exactly like an explicit chat run with the same demos, and
    auto -> plain like the plain default (plain-v3, 1 demo) that stored references were made with."""
    base = {"pretrained": str(chat_base(tmp_path / "h", HERMES))}
    auto_chat = Prompter("auto", demos=None, model_args=base, plain_demos=1)
    chat = Prompter("chat", demos=None, model_args=base, plain_demos=1)
    assert auto_chat.settings == chat.settings == Prompter("chat", demos=0, model_args=base).settings
    assert auto_chat.settings.fingerprint() != Prompter("chat", demos=1, model_args=base).settings.fingerprint()
    case = make_case()
    assert auto_chat.render(case) == chat.render(case)

    plain = Prompter("auto", demos=None, model_args={"pretrained": str(FIX["base"])}, template="plain-v3",
                     plain_demos=1)
    assert plain.settings.fingerprint() == PromptSettings(demos=1, template="plain-v3").fingerprint()
    prov = plain.provenance()
    assert prov["prompt_style_requested"] == "auto" and prov["prompt_style"] == "plain"
    assert prov["expected_format"] == "bare_json" and "chat_template_sha" not in prov


def test_template_defaults_are_read_off_the_template(tokenizer):
    tokenizer.chat_template = DEFAULT_SYSTEM
    chat = ChatPrompter(tokenizer, "tiny")
    assert chat.default_system_prompt == "You are a test assistant."
    assert chat.system_prompt_inserted(None) == "You are a test assistant."
    assert chat.system_prompt_inserted("Be brief.") is None  # the run's own system message replaces it
    tokenizer.chat_template = HERMES
    assert ChatPrompter(tokenizer, "tiny").default_system_prompt is None
    # end of turn: the special token written after an assistant message
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    chat = ChatPrompter(tokenizer, "tiny")
    assert chat.end_of_turn == "<|im_end|>" and chat.native_format == "hermes"
    assert not chat.is_eos("<|im_end|>")


def test_chat_stops_at_the_end_of_turn_not_at_the_plain_separator(tmp_path):
    base = chat_base(tmp_path, HERMES)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    tok.save_pretrained(base)
    prompter = Prompter("auto", demos=None, model_args={"pretrained": str(base)})
    assert prompter.until(["\n###"]) == ["<|im_end|>"]  # not the tokenizer's EOS: added
    assert Prompter("plain", model_args={"pretrained": str(base)}).until(["\n###"]) == ["\n###"]


@pytest.fixture()
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FIX["base"], local_files_only=True)


def test_shipped_chat_template_is_found_in_each_place(tmp_path):
    assert shipped_chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert shipped_chat_template(tmp_path) == (tmp_path / "tokenizer_config.json", "D")
    (tmp_path / "chat_template.jinja").write_text("J")
    assert shipped_chat_template(tmp_path) == (tmp_path / "chat_template.jinja", "J")


def _outcome(kind: OutcomeKind, surface: str | None) -> Outcome:
    return Outcome(kind=kind, surface=surface)


def test_surface_counts_per_view_and_drift_from_the_expected_format():
    v, n, m = OutcomeKind.VALID, OutcomeKind.NO_CALL, OutcomeKind.MALFORMED
    base = [_outcome(v, "hermes"), _outcome(v, "hermes"), _outcome(v, "hermes"), _outcome(n, None)]
    ft = [_outcome(v, "hermes"), _outcome(v, "fenced"), _outcome(m, "hermes"), _outcome(v, "bare_json")]
    pairs = [PairScore(case_id=f"c{i}", ft=f, base=b) for i, (f, b) in enumerate(zip(ft, base))]
    summary = summarize(pairs)
    assert summary.surface_counts == {"bare_json": 1, "fenced": 1, "hermes": 1, "malformed:hermes": 1}
    assert summary.base_surface_counts == {"hermes": 3, "none": 1}
    assert off_format_rate(ft, "hermes") == pytest.approx(2 / 3)
    assert off_format_rate(base, "hermes") == 0.0 and off_format_rate([_outcome(n, None)], "hermes") is None
    assert surface_key("malformed", None) == "malformed" and surface_key(n, None) == "none"


def _subset(path: Path, n: int = 4) -> Path:
    cases = load_cases("fixture")[::12][:n]
    path.write_text("".join(json.dumps(c.model_dump(mode="json", exclude_none=True)) + "\n" for c in cases))
    return path


@pytest.mark.slow
def test_auto_run_renders_the_template_and_pairs_with_an_explicit_chat_run(tmp_path):
    """Real lm_eval CLI, tool_use_fidelity with no style given, on a copy of the fixture model with a
    tool-aware template: the base run resolves to chat (and says why); an adapter run that asks for
    chat explicitly renders the same prompts and pairs; one that asks for plain does not."""
    base = chat_base(tmp_path, DEFAULT_SYSTEM)
    home = tmp_path / "home"
    meta = {"cases": str(_subset(tmp_path / "cases.jsonl"))}
    extra = ["--gen_kwargs", "max_gen_toks=16"]
    proc = lm_eval_cli(f"pretrained={base}", tmp_path / "base-run", home, metadata=meta, task="tool_use_fidelity",
                       extra=extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prompt_style auto -> chat: the chat template of" in proc.stderr
    results, samples = read_run(tmp_path / "base-run", "tool_use_fidelity")
    prov = toolfid_meta(results, "tool_use_fidelity")
    assert (prov["prompt_style_requested"], prov["prompt_style"], prov["demos"]) == ("auto", "chat", 0)
    assert "renders tools=" in prov["prompt_style_reason"] and prov["expected_format"] == "hermes"
    assert prov["chat_system_prompt_inserted"] == "You are a test assistant."
    assert "\n###" not in results["configs"]["tool_use_fidelity"]["generation_kwargs"]["until"]
    assert all("<|im_start|>system\nYou are a test assistant.\nTools:" in s["arguments"]["gen_args_0"]["arg_0"]
               for s in samples)
    assert sum(prov["surface_counts"].values()) == len(samples) == 4

    adapter = tmp_path / "adapter"  # an adapter that ships its own (different) chat template
    shutil.copytree(FIX["adapters"]["faithful"], adapter)
    (adapter / "chat_template.jinja").write_text(IGNORES_TOOLS)
    runs = {}
    for style in ("chat", "plain"):
        proc = lm_eval_here(f"pretrained={base},peft={adapter}", tmp_path / style, home, task="tool_use_fidelity",
                            metadata={**meta, "prompt_style": style}, extra=extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[style] = toolfid_meta(read_run(tmp_path / style, "tool_use_fidelity")[0], "tool_use_fidelity")
    assert runs["chat"]["pairing"].startswith("reference store") and runs["chat"]["prompt"] == prov["prompt"]
    assert runs["chat"]["prompt_style_reason"] == "given"
    assert "not used: both views are rendered with the chat template of" in runs["chat"]["adapter_chat_template"]
    assert runs["plain"]["pairing"].startswith("none") and runs["plain"]["prompt"] != prov["prompt"]
    assert sum(runs["chat"]["base_surface_counts"].values()) == 4


@pytest.mark.slow
def test_auto_on_a_model_without_a_template_keeps_the_plain_default(tmp_path):
    """The fixture model has no chat template: auto renders plain-v3 with one demonstration, the prompt
    fingerprint references stored before auto existed were made with. (An adapter run whose adapter
    folder ships a tokenizer: the run says it is not used.)"""
    meta = {"cases": str(_subset(tmp_path / "cases.jsonl", 2))}
    adapter = tmp_path / "adapter"
    shutil.copytree(FIX["adapters"]["faithful"], adapter)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(FIX["base"]) / name, adapter / name)
    proc = lm_eval_here(f"pretrained={FIX['base']},peft={adapter}", tmp_path / "run", tmp_path / "home",
                        metadata=meta, task="tool_use_fidelity", extra=["--gen_kwargs", "max_gen_toks=16"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, _ = read_run(tmp_path / "run", "tool_use_fidelity")
    prov = toolfid_meta(results, "tool_use_fidelity")
    assert (prov["prompt_style"], prov["prompt_template"], prov["demos"]) == ("plain", "plain-v3", 1)
    assert "has no chat template" in prov["prompt_style_reason"]
    assert prov["prompt"] == PromptSettings(demos=1, template="plain-v3").fingerprint()
    assert results["configs"]["tool_use_fidelity"]["generation_kwargs"]["until"] == ["\n###"]
    assert prov["adapter_chat_template"].startswith(f"{adapter} ships a tokenizer (no chat template), not used")


def test_failure_shapes_are_counted_from_the_records():
    from lm_eval_toolfid.reporting.shapes import count_shapes, shapes_of
    from lm_eval_toolfid.scoring.outcome import score_generation

    case = make_case(gold_arguments={"city": "Paris", "unit": "celsius"})
    texts = {
        "native": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "fenced": '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}\n```',
        "schema": '{"name": "get_weather", "arguments": {"city": {"type": "string", "description": "the city"}}}',
        "prose": "It is sunny in Paris.",
        "broken": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        "other": '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>',
    }
    shapes = {k: shapes_of(score_generation(t, case), case, "hermes") for k, t in texts.items()}
    assert shapes["native"] == ["valid"]
    assert shapes["fenced"] == ["valid", "other format: fenced", "invented optional values"]
    assert shapes["schema"] == ["schema error: type", "other format: bare_json", "schema copied into arguments"]
    assert shapes["prose"] == ["no call"] and shapes["broken"][0].startswith("malformed")
    assert shapes["other"] == ["valid", "wrong tool"]
    counts = count_shapes([(score_generation(t, case), case) for t in texts.values()], "hermes")
    assert counts["valid"] == 3 and counts["other format: fenced"] == 1 and sum(counts.values()) == 11


def test_breakdown_shows_the_resolved_style_and_formats_per_view():
    from lm_eval_toolfid.reporting.breakdown import Breakdown, format_text, prompt_label

    assert prompt_label({"prompt_style": "chat", "prompt_style_requested": "auto"}) == "chat (auto)"
    assert prompt_label({"prompt_style": "plain", "prompt_template": "plain-v3", "prompt_style_requested": "plain"}) \
        == "plain plain-v3"
    assert prompt_label({}) == ""
    b = Breakdown(label="prose", n=3, paired=True, tools=[], kinds=[], drift=[],
                  formats=[("fenced", 3, 0), ("none", 0, 3)], prompt="chat (auto)", expected_format="hermes")
    text = format_text(b)
    assert text.splitlines()[0] == "== prose: 3 cases, prompt chat (auto)"
    assert "formats (base → adapter): fenced 3→0, none 0→3 (the prompt asks for hermes)" in text
