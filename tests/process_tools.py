"""Tools for the process-isolation tests: they live in a module because a worker imports them by name."""

from __future__ import annotations

import os

from srt_agent.tooling.definition import tool


@tool(timeout=1.0, isolation="process")
def stuck_in_c(digits: int) -> int:
    """Compute 10**digits: one C call a thread cannot be stopped in.

    Args:
        digits: Exponent.
    """
    return (10**digits) % 7


@tool(timeout=5.0, isolation="process")
def chatty(a: int) -> int:
    """Print to stdout (which must not corrupt the reply), then add one.

    Args:
        a: Number.
    """
    print("noise on stdout " * 100)
    return a + 1


@tool(timeout=5.0, isolation="process")
def die(code: int) -> int:
    """Exit the process at once.

    Args:
        code: Exit code.
    """
    os._exit(code)


@tool(timeout=5.0, isolation="process")
def pid() -> int:
    """The worker's process id."""
    return os.getpid()
