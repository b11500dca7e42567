"""Prompt styles plain / chat / raw; the chat style renders the model's own template with per-case tools."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.prompts.chat import TOOLS_IN_SYSTEM, TOOLS_IN_TEMPLATE, TOOLS_IN_USER, ChatPrompter
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.prompts.settings import INSTRUCTION, TEMPLATE_VERSION, TEMPLATES, PromptSettings
from lm_eval_toolfid.prompts.prompter import Prompter, render_prompt
from lm_eval_toolfid.prompts.plain import pick_demos, render_plain
from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings

from .chat_templates import HERMES, IGNORES_TOOLS, NO_SYSTEM
from .conftest import make_case
from .lm_eval_helpers import lm_eval_cli, lm_eval_here, read_run, toolfid_meta

FIX = fixture_paths()


def chat_base(tmp_path: Path, template: str | None) -> Path:
    """A copy of the fixture base model whose tokenizer_config.json carries ``template``."""
    base = tmp_path / "base"
    shutil.copytree(FIX["base"], base)
    cfg_path = base / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    if template is not None:
        cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return base


@pytest.fixture()
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FIX["base"], local_files_only=True)


def test_plain_style_is_unchanged_and_keeps_its_fingerprint():
    case = make_case()
    settings = PromptSettings(demos=2)
    assert render_prompt(case, settings) == render_plain(case, settings)
    assert render_prompt(case, settings).endswith(f"### Request\n{case.prompt}\n### Call\n")
    # references and calibrations stored before prompt styles existed still match plain runs
    old = json.dumps({"demos": 2, "instruction": INSTRUCTION, "template": TEMPLATE_VERSION}, sort_keys=True)
    assert settings.fingerprint() == hashlib.sha256(old.encode()).hexdigest()[:16]
    assert PromptSettings(demos=2, style="raw").fingerprint() != settings.fingerprint()


def test_raw_style_is_the_bare_request():
    case = make_case()
    assert render_prompt(case, PromptSettings(style="raw")) == case.prompt
    assert Prompter("raw", demos=2).render(case) == case.prompt


@pytest.mark.parametrize("template,where", [(HERMES, TOOLS_IN_TEMPLATE), (IGNORES_TOOLS, TOOLS_IN_SYSTEM),
                                            (NO_SYSTEM, TOOLS_IN_USER)])
def test_chat_style_puts_the_tools_where_the_template_shows_them(tokenizer, template, where, caplog):
    tokenizer.chat_template = template
    with caplog.at_level("WARNING", logger="lm_eval.toolfid"):
        chat = ChatPrompter(tokenizer, "tiny")
    assert chat.tools_in == where
    assert ("ignores tools=" in caplog.text) == (where != TOOLS_IN_TEMPLATE)
    case = make_case()
    text = chat.render(case, [], system_prompt="Be brief.")
    assert "get_weather" in text and "get_time" in text and case.prompt in text and "Be brief." in text
    if where == TOOLS_IN_TEMPLATE:
        assert "<tools>" in text and '"type": "function"' in text
    else:
        assert "<tools>" not in text and "You can call these tools" in text
    if where == TOOLS_IN_USER:
        assert "system" not in text
    assert text.count(case.prompt) == 1


def test_chat_demos_use_the_templates_native_call_format(tokenizer):
    case = make_case()
    from lm_eval_toolfid.prompts.plain import pick_demos

    demos = pick_demos(case, 1)
    tokenizer.chat_template = HERMES
    hermes = ChatPrompter(tokenizer).render(case, demos)
    assert "<tool_call>\n{" in hermes and hermes.index(demos[0][1]) < hermes.index(case.prompt)
    tokenizer.chat_template = IGNORES_TOOLS
    plain = ChatPrompter(tokenizer).render(case, demos)
    assert "<tool_call>" not in plain and json.dumps(demos[0][2], ensure_ascii=False) in plain


def test_template_hash_is_part_of_the_fingerprint(tmp_path):
    a = Prompter("chat", demos=0, model_args={"pretrained": str(chat_base(tmp_path / "a", HERMES))})
    b = Prompter("chat", demos=0, model_args={"pretrained": str(chat_base(tmp_path / "b", IGNORES_TOOLS))})
    assert a.settings.chat_template_sha == hashlib.sha256(HERMES.encode()).hexdigest()
    assert a.settings.fingerprint() != b.settings.fingerprint()
    assert a.provenance()["chat_tools_in"] == "template" and b.provenance()["chat_tools_in"] == "system"
    assert PromptSettings(demos=0).fingerprint() not in (a.settings.fingerprint(), b.settings.fingerprint())


def test_a_chat_template_file_replaces_the_models(tmp_path):
    base = chat_base(tmp_path, IGNORES_TOOLS)
    jinja = tmp_path / "hermes.jinja"
    jinja.write_text(HERMES)
    own = Prompter("chat", demos=0, model_args={"pretrained": str(base)})
    replaced = Prompter("chat", demos=0, model_args={"pretrained": str(base)}, chat_template=str(jinja))
    assert own.provenance()["chat_tools_in"] == "system" and replaced.provenance()["chat_tools_in"] == "template"
    assert replaced.settings.chat_template_sha == hashlib.sha256(HERMES.encode()).hexdigest()
    assert "<tools>" in replaced.render(make_case())
    with pytest.raises(ToolfidError, match="cannot read the Jinja file"):
        Prompter("chat", model_args={"pretrained": str(base)}, chat_template=str(tmp_path / "nope.jinja"))


def test_chat_style_errors_are_one_line(tmp_path):
    with pytest.raises(ToolfidError, match="has no chat template"):
        Prompter("chat", model_args={"pretrained": str(chat_base(tmp_path, None))})
    with pytest.raises(ToolfidError, match="cannot load the tokenizer"):
        Prompter("chat", model_args={"pretrained": str(tmp_path / "missing")})
    with pytest.raises(ToolfidError, match="pretrained"):
        Prompter("chat", model_args={})
    with pytest.raises(ToolfidError, match="prompt_style"):
        TaskSettings.from_metadata({"prompt_style": "fancy"})
    assert TaskSettings.from_metadata({"prompt_style": "chat"}).prompt_style == "chat"


@pytest.mark.slow
def test_chat_run_shows_the_tools_and_pairs_base_and_adapter(tmp_path):
    """Acceptance: real lm_eval CLI, tiny model with a Hermes-style tool-aware template, base then adapter."""
    base = chat_base(tmp_path, HERMES)
    cases = tmp_path / "cases.jsonl"
    six = load_cases("fixture")[::8][:6]
    cases.write_text("".join(json.dumps(c.model_dump(mode="json", exclude_none=True)) + "\n" for c in six))
    meta = {"prompt_style": "chat", "cases": str(cases)}
    home = tmp_path / "home"
    proc = lm_eval_cli(f"pretrained={base}", tmp_path / "base-run", home, metadata=meta)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, samples = read_run(tmp_path / "base-run")
    assert len(samples) == 6
    for sample in samples:
        prompt = sample["arguments"]["gen_args_0"]["arg_0"]
        case = next(c for c in six if c.id == sample["doc"]["id"])
        assert "<tools>" in prompt and all(name in prompt for name in case.tool_names)
        assert prompt.endswith("<|im_start|>assistant\n") and prompt.count("<|im_start|>system") == 1
    meta_base = toolfid_meta(results)
    assert meta_base["prompt_style"] == "chat" and meta_base["chat_tools_in"] == "template"
    assert Path(meta_base["reference_written"]).is_file()

    # the adapter run also asks lm-eval to apply the chat template: the task's rendering wins (one
    # warning), the prompt is not wrapped twice, and the run pairs with the base reference
    proc = lm_eval_here(f"pretrained={base},peft={FIX['adapters']['faithful']}", tmp_path / "ft-run", home,
                        metadata=meta, extra=["--apply_chat_template"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("--apply_chat_template is ignored for this task") == 1
    results, samples = read_run(tmp_path / "ft-run")
    assert all(s["arguments"]["gen_args_0"]["arg_0"].count("<|im_start|>system") == 1 for s in samples)
    meta_ft = toolfid_meta(results)
    assert meta_ft["pairing"].startswith("reference store"), meta_ft["pairing"]
    assert meta_ft["prompt"] == meta_base["prompt"] and meta_ft["chat_template_sha"] == meta_base["chat_template_sha"]
    assert all(s["fidelity_pass"]["base"] is not None for s in samples)


def test_real_smollm2_template_ignores_tools_so_they_go_in_the_system_message(smollm2):
    prompter = Prompter("chat", demos=0, model_args={"pretrained": str(smollm2)})
    assert prompter.provenance()["chat_tools_in"] == "system"
    case = make_case()
    text = prompter.render(case)
    system = text.split("<|im_start|>user")[0]
    assert "get_weather" in system and "get_time" in system and "You can call these tools" in system
    assert text.endswith(f"{case.prompt}<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("demos", [0, 2])
def test_plain_style_says_a_case_offers_no_tools(template, demos):
    from lm_eval_toolfid.prompts.plain import ExampleIndex
    from lm_eval_toolfid.prompts.settings import NO_TOOLS, PRIMER

    case = make_case(id="none", prompt="What's 2+2?", tools=[], gold_tool_name=None)
    prompter = Prompter("plain", demos=demos, template=template, cases=[make_case(), case])
    text = prompter.render(case)
    block = text.split("### Tools\n")[-1]
    assert block.startswith(f"{NO_TOOLS}\n### Request\nWhat's 2+2?\n### Call\n")
    assert text.count("### Tools\n") == demos + 1 and text.count(NO_TOOLS) == 1
    assert text.endswith("### Call\n")  # plain-v3 primes a call only where a tool is offered
    assert prompter.answer('{"x": 1}', case) == '{"x": 1}'
    if template == "plain-v3":
        tooled = make_case()
        assert prompter.render(tooled).endswith(PRIMER) and prompter.answer('x"}', tooled) == PRIMER + 'x"}'
    assert ExampleIndex([case, make_case()]).for_case(case) == {}
    assert render_prompt(case, PromptSettings(style="raw")) == "What's 2+2?"


@pytest.mark.parametrize("template,where", [(HERMES, TOOLS_IN_TEMPLATE), (IGNORES_TOOLS, TOOLS_IN_SYSTEM),
                                            (NO_SYSTEM, TOOLS_IN_USER)])
def test_chat_style_renders_a_case_with_no_tools_without_a_tools_block(tokenizer, template, where):
    tokenizer.chat_template = template
    chat = ChatPrompter(tokenizer, "tiny")
    case = make_case(prompt="What's 2+2?", tools=[], gold_tool_name=None)
    messages, tools = chat.messages(case, [], None)
    assert tools == [] and messages == [{"role": "user", "content": "What's 2+2?"}]
    text = chat.render(case, [])
    assert text == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<tools>" not in text and "You can call these tools" not in text and "system" not in text
    with_system = chat.render(case, [], system_prompt="Be brief.")
    assert "Be brief." in with_system and "You can call these tools" not in with_system
    assert ("system" in with_system) == (where != TOOLS_IN_USER)
    demos = pick_demos(case, 1)  # a demonstration brings its own tool, shown as for every case
    assert demos[0][0][0].name in chat.render(case, demos)


def test_a_tokenizer_is_loaded_once_per_process_and_each_caller_gets_its_own(tmp_path) -> None:
    """Every view of a run renders with its base's tokenizer: loaded once (a Qwen tokenizer takes about 1 s), each
    call a copy (a ``chat_template`` file replaces the template on one view's copy only), loaded again when a file of
    the folder changes."""
    import os
    import shutil

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.prompts import chat

    folder = tmp_path / "base"
    shutil.copytree(fixture_paths()["base"], folder)
    chat._TOKENIZERS.clear()  # the process's other tests' tokenizers: the cache is bounded (cleared past 8)
    first = chat.load_tokenizer({"pretrained": str(folder)})
    first.chat_template = "replaced for one view"
    second = chat.load_tokenizer({"pretrained": str(folder)})
    assert second is not first and second.chat_template != "replaced for one view"
    assert len([k for k in chat._TOKENIZERS if k[0] == str(folder)]) == 1
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text())  # rewritten: a newer time
    os.utime(config, ns=(1, 1))
    chat.load_tokenizer({"pretrained": str(folder)})
    assert len([k for k in chat._TOKENIZERS if k[0] == str(folder)]) == 2


def test_the_views_of_a_run_share_one_prompter_whose_prompts_are_rendered_once(tmp_path) -> None:
    """Every view of a run (a hundred adapters) renders the same cases the same way: one prompter per process for
    the same arguments (the adapter is not one of them: both views render with the base's tokenizer), its prompts
    rendered once; a chat template file changed on disk, another style or another case list is another prompter."""
    import os

    from lm_eval_toolfid.prompts.prompter import render_prompt, shared_prompter

    folder = tmp_path / "base"
    shutil.copytree(fixture_paths()["base"], folder)
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>")
    cases = load_cases("fixture")

    def prompter(peft: str, style: str = "chat", of: list | None = None) -> object:
        return shared_prompter(style, 0, None, {"pretrained": str(folder), "peft": peft}, str(template), "plain-v3",
                               of if of is not None else cases, 2)

    first = prompter("/adapters/a")
    assert prompter("/adapters/b") is first  # another adapter of the same base: the same prompts
    assert [first.render(c) for c in cases] == [render_prompt(c, first.settings, first.chat) for c in cases]
    assert first.render(cases[0]) is first.render(cases[0])  # rendered once
    plain = prompter("/adapters/a", "plain")
    assert plain is not first and plain.render(cases[0]) != first.render(cases[0])
    assert prompter("/adapters/a", of=cases[:3]) is not first  # another case list
    template.write_text(template.read_text().replace("<assistant>", "<bot>"))
    os.utime(template, ns=(1, 1))
    changed = prompter("/adapters/a")
    assert changed is not first and changed.render(cases[0]).endswith("<bot>")
    assert first.render(cases[0]).endswith("<assistant>")
