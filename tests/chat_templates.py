"""Jinja chat templates written for the tests (Hermes-style with tools, one that ignores tools, one
that refuses a system role)."""

HERMES = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call one or more functions. Function signatures are inside <tools></tools>:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "For each call return a JSON object inside <tool_call></tool_call> tags.<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{%- if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

IGNORES_TOOLS = (  # like SmolLM2's: renders messages only, never looks at tools
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

NO_SYSTEM = (  # like Gemma's: refuses a system role, ignores tools
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

DEFAULT_SYSTEM = (  # tool-aware, and writes its own system text when the conversation has none
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a test assistant.{% endif %}"
    "\n\nTools:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "Answer with <tool_call>{...}</tool_call>.<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% else %}<|im_start|>system\nYou are a test assistant.<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{%- if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
