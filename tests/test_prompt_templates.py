"""Plain template versions: plain-v1 (JSON Schema lines, what the fixture model was trained on)
stays byte-for-byte as specified; plain-v2 shows compact signatures with nothing to copy."""

from __future__ import annotations

import json

from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.prompts.settings import INSTRUCTION, PromptSettings
from lm_eval_toolfid.prompts.prompter import render_prompt

from .conftest import make_case


def test_plain_v1_zero_demos_is_the_fixture_format() -> None:
    for case in load_cases("fixture"):
        if case.history:  # conversations: tests/test_multiturn_prompts.py
            continue
        tools = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                     ensure_ascii=False) for t in case.tools)
        want = f"{INSTRUCTION}\n\n### Tools\n{tools}\n### Request\n{case.prompt}\n### Call\n"
        assert render_prompt(case, PromptSettings(demos=0)) == want


def test_plain_v2_signatures() -> None:
    case = make_case()
    text = render_prompt(case, PromptSettings(demos=2, template="plain-v2"))
    assert '"type"' not in text and '"properties"' not in text
    line = next(l for l in text.splitlines() if l.startswith("get_weather("))
    assert line.startswith('get_weather(city: string, unit?: "celsius" | "fahrenheit", days?: integer >= 1, '
                           "where?: {lat: number, lon: number}, tags?: [string])")
    assert line.endswith("# Current weather")
    assert "get_time(tz: string)" in text
    # demos keep their JSON calls, right under their own signatures
    blocks = text.split("### Tools\n")[1:]
    assert len(blocks) == 3 and all("### Call\n{" in b for b in blocks[:2])
    assert PromptSettings(template="plain-v2").fingerprint() != PromptSettings().fingerprint()


def test_plain_v2_renders_every_default_case() -> None:
    for case in load_cases("default"):
        text = render_prompt(case, PromptSettings(template="plain-v2"))
        for tool in case.tools:
            assert f"\n{tool.name}(" in text


def test_plain_v3_examples_come_from_other_cases_and_every_tool_gets_one() -> None:
    from lm_eval_toolfid.prompts.settings import PRIMER
    from lm_eval_toolfid.prompts.prompter import Prompter

    cases = load_cases("default")
    prompter = Prompter("plain", demos=1, template="plain-v3", cases=cases)
    assert prompter.primer == PRIMER
    own_calls = 0
    for case in cases:
        text = prompter.render(case)
        assert text.endswith("### Call\n" + PRIMER)
        block = text.rsplit("### Tools\n", 1)[1].split("### Request\n")[0]
        examples = [json.loads(line.removeprefix("Example: ")) for line in block.splitlines()
                    if line.startswith("Example: ")]
        # one example per offered tool (each tool is gold in other cases of the default set)...
        assert [e["name"] for e in examples] == [t.name for t in case.tools]
        # ...never the case's own answer, and each a gold call of some other case
        own = {"name": case.gold_tool_name, "arguments": case.gold_arguments}
        own_calls += own in examples
        for e in examples:
            assert any(e == {"name": c.gold_tool_name, "arguments": c.gold_arguments}
                       for c in cases if c.id != case.id)
        assert '"type"' not in block
    assert own_calls == 0
    assert prompter.answer('get_weather", "arguments": {}}', cases[0]) == '{"name": "get_weather", "arguments": {}}'
    assert prompter.settings.fingerprint() not in (PromptSettings().fingerprint(),
                                                   PromptSettings(template="plain-v2", demos=1).fingerprint())


def test_plain_v3_without_siblings_has_no_examples_and_the_primer_is_restored_from_samples() -> None:
    from lm_eval_toolfid.pairing.samples import sample_prompt
    from lm_eval_toolfid.prompts.settings import PRIMER
    from lm_eval_toolfid.prompts.prompter import Prompter
    from lm_eval_toolfid.prompts.plain import restore_primer

    case = make_case()
    text = Prompter("plain", demos=0, template="plain-v3", cases=[case]).render(case)
    assert "Example:" not in text and text.endswith(PRIMER)
    sample = {"arguments": {"gen_args_0": {"arg_0": text, "arg_1": {}}}}
    assert restore_primer(sample_prompt(sample), 'x"}') == PRIMER + 'x"}'
    assert restore_primer("### Call\n", 'x"}') == 'x"}'  # plain-v1 prompts are not primed


def test_unknown_template_is_one_line() -> None:
    import pytest

    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.prompts.prompter import Prompter
    from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings

    with pytest.raises(ToolfidError, match="prompt_template"):
        Prompter("plain", template="plain-v9")
    with pytest.raises(ToolfidError, match="prompt_template"):
        TaskSettings.from_metadata({"prompt_template": "plain-v9"})
