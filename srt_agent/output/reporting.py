"""What every command does at its edges: errors, output paths, ``--json``.

A bad input is one line and exit code 2; output paths are checked before the run (after it the
results would be lost); ``--json`` is written and said.

``srt-agent``'s commands, ``train`` and ``eval`` all go through these, so they fail and write alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from srt_agent.output.paths import check_output_file
from srt_agent.output.records import write_record

__all__ = ["USAGE_ERROR", "check_outputs", "print_error", "write_json"]

USAGE_ERROR = 2
"""The exit code of a bad config, argument or path (the message says what to fix)."""


def print_error(console: Console, error: BaseException | str) -> int:
    """Print ``error: <message>`` and return :data:`USAGE_ERROR`.

    The message is printed as text, not markup: it often quotes user input (paths, ids) that may
    contain ``[...]``.
    """
    console.print(Text.assemble(("error: ", "red"), str(error)))
    return USAGE_ERROR


def check_outputs(*outputs: tuple[str | Path | None, str]) -> None:
    """Check that each ``(path, flag)`` given (``None``: not asked for) can be written as a file.

    Raises:
        OutputPathError: A path cannot be written; the message names the flag and why.
    """
    for path, what in outputs:
        if path is not None:
            check_output_file(path, what)


def write_json(console: Console, path: str | Path | None, record: Mapping[str, Any]) -> None:
    """Write ``record`` to ``path`` (``--json``; nothing when ``None``) and say so."""
    if path is not None:
        write_record(path, dict(record))
        console.print(f"[dim]wrote {path}[/dim]")
