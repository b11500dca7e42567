"""Task settings from lm-eval metadata, and the prompt shown to the model."""

import json

import pytest

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.prompts.plain import DEMO_POOL
from lm_eval_toolfid.prompts.settings import PromptSettings
from lm_eval_toolfid.prompts.prompter import render_prompt
from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings

from .conftest import make_case


def test_metadata_from_cli_strings_and_json():
    s = TaskSettings.from_metadata({"pretrained": "m", "peft": "/a", "demos": "0", "allowed_tools": "a,b",
                                    "hallucination_cap": "0.2", "write_reference": "false", "batch_size": 8})
    assert s.demos == 0 and s.allowed_tools == ["a", "b"] and s.verdict.hallucination_cap == 0.2
    assert s.is_adapter_run and s.adapter_path == "/a" and s.write_reference is False
    assert TaskSettings.from_metadata({"allowed_tools": '["x"]'}).allowed_tools == ["x"]
    assert not TaskSettings.from_metadata({"pretrained": "m"}).is_adapter_run


@pytest.mark.parametrize("meta", [{"demos": "many"}, {"demos": 99}, {"hallucination_cap": 2},
                                  {"validity_delta_floor": "low"}])
def test_bad_settings_are_one_line_errors(meta):
    with pytest.raises(ToolfidError, match="bad task setting|could not convert"):
        TaskSettings.from_metadata(meta)


def test_prompt_shows_every_offered_tool_and_the_request():
    case = make_case()
    prompt = render_prompt(case, PromptSettings(demos=2))
    for tool in case.tools:
        assert json.dumps(tool.for_prompt()) in prompt
    assert prompt.endswith(f"### Request\n{case.prompt}\n### Call\n")
    assert prompt.count("### Call\n") == 3  # two demonstrations, then the open block


def test_demos_never_use_the_cases_tools_and_are_stable():
    demo_tool = DEMO_POOL[0][0][0]
    case = make_case(tools=[demo_tool.model_dump()], gold_tool_name=demo_tool.name)
    prompt = render_prompt(case, PromptSettings(demos=4))
    assert prompt.count(f'"name": "{demo_tool.name}"') == 1  # only the case's own tool list
    assert render_prompt(case, PromptSettings(demos=4)) == prompt
    assert PromptSettings(demos=1).fingerprint() != PromptSettings(demos=2).fingerprint()


def test_zero_demos():
    prompt = render_prompt(make_case(), PromptSettings(demos=0))
    assert prompt.count("### Tools") == 1
