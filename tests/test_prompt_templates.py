"""Plain template versions: plain-v1 (JSON Schema lines, what the fixture model was trained on)
stays byte-for-byte as specified; plain-v2 shows compact signatures with nothing to copy."""

from __future__ import annotations

import json

from lm_eval_toolfid.cases import load_cases
from lm_eval_toolfid.prompting import INSTRUCTION, PromptSettings, render_prompt

from .conftest import make_case


def test_plain_v1_zero_demos_is_the_fixture_format() -> None:
    for case in load_cases("fixture"):
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
