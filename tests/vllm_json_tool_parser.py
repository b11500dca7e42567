"""A vLLM tool-parser plugin (``--tool-parser-plugin THIS_FILE --tool-call-parser json_calls``) for a model that
answers a tool call as a bare JSON object, ``{"name": ..., "arguments": {...}}``, without its template's tags:
Qwen2.5-Coder-0.5B-Instruct does (docs/served.md: it never writes ``<tool_call>``, so vLLM's ``hermes`` parser
returns its calls as text).

vLLM's own ``llama3_json`` parser (``Llama3JsonToolParser``) parses exactly that: every JSON object with a ``name``
and ``arguments`` (or ``parameters``) anywhere in the answer becomes a structured ``tool_calls`` entry. It refuses
to start on a tokenizer without Llama's ``<|python_tag|>`` token ("--tool-call-parser llama3_json cannot be used
with the tokenizer of ...": it reads that token's id, which only its streaming path uses), and Qwen's has none.
This subclass names Qwen's own tool-call token instead; the parsing is vLLM's, unchanged. Loaded by the vLLM
server from ``.venv-vllm`` (tests/test_vllm_qwen.py); vLLM is not importable from the project's ``.venv``."""

from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser


@ToolParserManager.register_module("json_calls")
class JsonCallsToolParser(Llama3JsonToolParser):
    bot_token = "<tool_call>"
