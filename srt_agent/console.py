"""Printing chat messages and episode summaries to a terminal with rich."""

from __future__ import annotations

import os

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from srt_agent.messages import Message

PIPED_WIDTH = 160
"""Columns used when output is not a terminal (a pipe, a log file): rich's default of 80 wraps tables."""


def make_console(*, stderr: bool = False, quiet: bool = False) -> Console:
    """A rich console: the terminal's width on a terminal, :data:`PIPED_WIDTH` columns otherwise.

    ``$COLUMNS``, when set, wins either way (rich reads it).
    """
    probe = Console(stderr=stderr)
    piped = not probe.is_terminal and "COLUMNS" not in os.environ
    return Console(stderr=stderr, quiet=quiet, width=PIPED_WIDTH if piped else None)


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
