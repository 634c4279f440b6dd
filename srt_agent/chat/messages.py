"""Chat messages: the observations of every multi-turn environment.

A message is frozen wire data (it crosses into the chat format, trajectories and traces), so it is a
pydantic model rather than a dict.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
"""ChatML's message markers (the project's tokenizer and Qwen's): ``<|im_start|>role\n ... <|im_end|>``."""

Role = Literal["system", "user", "assistant", "tool"]
"""Who wrote a message. ``tool`` messages carry the result of one tool call."""


class Message(BaseModel):
    """One chat message.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: The message text. For ``tool`` messages, the tool's output or an error report.
        tool_call_id: For ``tool`` messages, the id of the call this answers.
        name: For ``tool`` messages, the name of the tool that was called.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    content: str
    tool_call_id: str | None = None
    name: str | None = None

    def as_dict(self) -> dict[str, str]:
        """The message as a plain dict in the shape HF chat templates expect (unset fields omitted)."""
        return self.model_dump(exclude_none=True)


def system(content: str) -> Message:
    """A system message."""
    return Message(role="system", content=content)


def user(content: str) -> Message:
    """A user message."""
    return Message(role="user", content=content)


def assistant(content: str) -> Message:
    """An assistant message."""
    return Message(role="assistant", content=content)


def tool_result(content: str, *, call_id: str, name: str) -> Message:
    """A tool-result message answering call ``call_id`` of tool ``name``."""
    return Message(role="tool", content=content, tool_call_id=call_id, name=name)


def format_transcript(messages: list[Message] | tuple[Message, ...]) -> str:
    """Render messages as plain text, one block per message, for logs and terminals."""
    blocks = []
    for m in messages:
        head = m.role if m.name is None else f"{m.role} ({m.name})"
        blocks.append(f"[{head}]\n{m.content}")
    return "\n\n".join(blocks)


def cap_text(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a note saying how much was cut.

    Every message a tool or an env hands the model goes through this (tool outputs and errors at
    ``ToolSet.max_output_chars``, env messages at ``rollout.max_observation_chars``).
    """
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n[... truncated {len(text) - max_chars} characters]"


def cap_message(message: Message, max_chars: int) -> Message:
    """``message`` with its content cut by :func:`cap_text` (the same object when nothing is cut)."""
    if len(message.content) <= max_chars:
        return message
    return message.model_copy(update={"content": cap_text(message.content, max_chars)})
