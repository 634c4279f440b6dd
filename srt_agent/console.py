"""Printing chat messages and episode summaries to a terminal with rich."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from srt_agent.messages import Message

_STYLES = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "magenta"}


def print_message(console: Console, message: Message) -> None:
    """Print one message as a titled panel (tool errors in red)."""
    title = message.role if message.name is None else f"{message.role}: {message.name}"
    style = _STYLES.get(message.role, "white")
    if message.role == "tool" and message.content.startswith("Error ("):
        style = "red"
    # Text(...) rather than a markup string: model output may contain "[...]" that rich would
    # otherwise interpret as markup.
    console.print(Panel(Text(message.content), title=title, title_align="left", border_style=style))
