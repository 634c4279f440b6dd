"""Tools an agent calls: their definition, a set that runs them safely, and the call syntax.

* :mod:`~srt_agent.tooling.definition`: :class:`Tool` and the ``@tool`` decorator (schema from the
  signature and docstring, strict argument validation);
* :mod:`~srt_agent.tooling.toolset`: :class:`ToolSet`, which runs calls with timeouts and caps output;
* :mod:`~srt_agent.tooling.parser`: ``<tool_call>`` blocks in the model's text, parsed and formatted;
* :mod:`~srt_agent.tooling.grammar`: :class:`ToolCallGrammar`, the calls a set of tools accepts, for
  constrained decoding.

The built-in tools themselves are in :mod:`srt_agent.tools`.
"""

from srt_agent.tooling.definition import Tool, ToolArgumentsError, tool
from srt_agent.tooling.grammar import ToolCallGrammar
from srt_agent.tooling.parser import ParsedTurn, ToolCall, format_tool_call, parse_tool_calls
from srt_agent.tooling.toolset import ToolResult, ToolSet

__all__ = [
    "ParsedTurn",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallGrammar",
    "ToolResult",
    "ToolSet",
    "format_tool_call",
    "parse_tool_calls",
    "tool",
]
