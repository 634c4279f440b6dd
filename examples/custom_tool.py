"""Custom tools: a sync and an async function, and what the model sees when calls go wrong.

Run: python examples/custom_tool.py
"""

import asyncio

from srt_agent import ToolSet, parse_tool_calls, tool


@tool(timeout=1.0)
def word_count(text: str, unique: bool = False) -> int:
    """Count the words in a text.

    Args:
        text: The text to count.
        unique: Count distinct words only.
    """
    words = text.lower().split()
    return len(set(words)) if unique else len(words)


@tool(timeout=0.5)
async def slow_lookup(key: str) -> str:
    """Look a key up in a slow remote store.

    Args:
        key: The key.
    """
    await asyncio.sleep(2.0)  # longer than the timeout: the model gets a timeout error
    return key


tools = ToolSet([word_count, slow_lookup])
print(tools.schemas()[0])

turn = parse_tool_calls(
    'Counting. <tool_call>{"name": "word_count", "arguments": {"text": "a b a", "unique": true}}</tool_call>'
    '<tool_call>{"name": "word_count", "arguments": {"txt": "oops"}}</tool_call>'
    '<tool_call>{"name": "slow_lookup", "arguments": {"key": "k"}}</tool_call>'
    '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>'
    "<tool_call>{not json}</tool_call>"
)
for result in asyncio.run(tools.aexecute(turn)):
    print(f"{result.call_id} {result.name}: {result.content}")
