"""Playing an env from the terminal: a person types the assistant's turns, or the oracle plays.

Tool calls typed by the person (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) are
executed for real by the env, exactly as a model's would be.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import gymnasium as gym
from rich.console import Console

from srt_agent.chat.messages import Message
from srt_agent.env.episode_loop import EpisodeResult, Policy, run_episode
from srt_agent.env.multi_turn import oracle_policy
from srt_agent.output.console import print_message

HELP = """Type the assistant's turn and press Enter. End a line with a backslash to continue it on the
next line. Tool calls are written as <tool_call>{"name": "...", "arguments": {...}}</tool_call>.
Commands: /tools (show tool schemas), /help, /quit (or Ctrl-D)."""


class QuitPlay(Exception):
    """The person asked to stop."""


class HumanPolicy:
    """Reads assistant turns from a person at the terminal.

    Args:
        console: Where prompts and help are printed.
        read_line: Input function (``input`` by default; tests pass a scripted one).
        tools: Tool schemas, shown by ``/tools``.
    """

    def __init__(
        self,
        console: Console,
        read_line: Callable[[str], str] = input,
        tools: Sequence[dict[str, object]] = (),
    ):
        self.console = console
        self.read_line = read_line
        self.tools = list(tools)

    def act(self, history: Sequence[Message]) -> str:
        """Prompt until the person types a turn (handles commands and continuation lines)."""
        while True:
            lines: list[str] = []
            prompt = "assistant> "
            while True:
                try:
                    line = self.read_line(prompt)
                except EOFError:
                    raise QuitPlay from None
                if line.endswith("\\"):
                    lines.append(line[:-1])
                    prompt = "        .. "
                    continue
                lines.append(line)
                break
            text = "\n".join(lines)
            command = text.strip()
            if command in ("/quit", "/exit"):
                raise QuitPlay
            if command == "/help":
                self.console.print(HELP)
            elif command == "/tools":
                self.console.print_json(json.dumps(self.tools))
            elif command:
                return text


def play(
    env: gym.Env[tuple[Message, ...], str],
    *,
    seed: int | None,
    oracle: bool,
    console: Console,
    read_line: Callable[[str], str] = input,
) -> EpisodeResult | None:
    """Play one episode with live output; returns ``None`` if the person quit early."""

    def make_policy(e: gym.Env[tuple[Message, ...], str]) -> Policy:
        if oracle:
            return oracle_policy(e)
        tools = getattr(e.unwrapped, "tools", None)
        schemas = tools.schemas() if tools is not None else []
        console.print(f"[dim]{HELP}[/dim]")
        return HumanPolicy(console, read_line, schemas)

    try:
        result = run_episode(env, make_policy, seed=seed, on_message=lambda m: print_message(console, m))
    except QuitPlay:
        console.print("[yellow]Stopped.[/yellow]")
        return None
    end = "terminated" if result.terminated else "truncated"
    console.print(
        f"[bold]Episode {end}[/bold] after {result.turns} turns; "
        f"reward {result.total_reward:g}; task {result.task_id}"
    )
    return result
