"""Printing chat messages and episode summaries to a terminal with rich."""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from srt_agent.chat.messages import Message
from srt_agent.tooling.toolset import is_error_message

PIPED_WIDTH = 160
"""Columns used when output is not a terminal (a pipe, a log file): rich's default of 80 wraps tables."""


def make_console(*, stderr: bool = False, quiet: bool = False) -> Console:
    """A rich console: the terminal's width on a terminal, :data:`PIPED_WIDTH` columns otherwise.

    ``$COLUMNS``, when set, wins either way (rich reads it).
    """
    probe = Console(stderr=stderr)
    piped = not probe.is_terminal and "COLUMNS" not in os.environ
    return Console(stderr=stderr, quiet=quiet, width=PIPED_WIDTH if piped else None)


class Heartbeat:
    """Progress lines for a console that cannot show live bars (a pipe, a log file, CI).

    Rich draws its bars only on a terminal; elsewhere a long job would print nothing until it ends.
    :meth:`update` prints ``"<label> <done>/<total> <text> (<elapsed> s)"`` at most every
    ``every_s`` seconds, and at the end; on a terminal it prints nothing (the bar shows it).

    Args:
        console: Where to print.
        label: What is counted, e.g. ``"SFT step"``.
        total: Count at the end.
        every_s: Least seconds between lines.
    """

    def __init__(self, console: Console, label: str, total: int, every_s: float = 30.0) -> None:
        self.console, self.label, self.total, self.every_s = console, label, total, every_s
        self.live = console.is_terminal or console.quiet
        self._start = self._last = time.perf_counter()

    def update(self, done: int, text: str = "") -> None:
        """Print a line if ``every_s`` passed since the last one, or ``done`` reached ``total``."""
        if self.live:
            return
        now = time.perf_counter()
        if done >= self.total or now - self._last >= self.every_s:
            self._last = now
            self.console.print(
                f"{self.label} {done}/{self.total} {text} ({now - self._start:.0f} s)".replace("  ", " ")
            )


_STYLES = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "magenta"}


def print_message(console: Console, message: Message) -> None:
    """Print one message as a titled panel (tool errors in red)."""
    title = message.role if message.name is None else f"{message.role}: {message.name}"
    style = _STYLES.get(message.role, "white")
    if is_error_message(message):
        style = "red"
    # Text(...) rather than a markup string: model output may contain "[...]" that rich would
    # otherwise interpret as markup.
    console.print(Panel(Text(message.content), title=title, title_align="left", border_style=style))
