"""Jinja chat templates written for the tests (Hermes-style with tools, one that ignores tools, one
that refuses a system role; for conversations: a Hermes-style one that renders assistant tool calls
and tool results, and one that insists on alternating user/assistant roles)."""

_HERMES_SYSTEM = (  # the system turn of both Hermes-style templates: the tools, or the given system prompt
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call one or more functions. Function signatures are inside <tools></tools>:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "For each call return a JSON object inside <tool_call></tool_call> tags.<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
)

HERMES = _HERMES_SYSTEM + (
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

HERMES_TOOLS = _HERMES_SYSTEM + (  # Hermes/Qwen-style with a conversation: assistant tool_calls as <tool_call>, results as <tool_response>
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'assistant' and not m.tool_calls) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant{% if m.content %}\n{{ m.content }}{% endif %}"
    "{%- for c in m.tool_calls %}{% set f = c.function if c.function is defined else c %}"
    "\n<tool_call>\n{\"name\": \"{{ f.name }}\", \"arguments\": {{ f.arguments | tojson }}}\n</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{%- elif m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ALTERNATING = (  # like Gemma's: user/assistant must alternate, no system or tool role, ignores tools
    "{% for m in messages %}"
    "{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
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
