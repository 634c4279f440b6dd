"""The ``srt-agent`` command line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import gymnasium as gym
import typer
from rich.console import Console
from rich.table import Table

from srt_agent import __version__
from srt_agent.env import EnvConfigError, MultiTurnEnv, oracle_policy
from srt_agent.play import play as play_episode
from srt_agent.policy import run_episode
from srt_agent.registration import UnknownEnvError, make, registered_envs

app = typer.Typer(
    name="srt-agent",
    help="Multi-turn RL for tool-using LLM agents with speculative rollouts from a tree cache (SRT).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        console.print(f"srt-agent {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """srt-agent command line."""


def _make(env_id: str, **options: Any) -> gym.Env[tuple[Any, ...], str]:
    """Make an env, turning bad ids and options into a clean exit with the message (exit code 2)."""
    try:
        return make(env_id, **options)
    except (UnknownEnvError, EnvConfigError) as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _write_json(path: Path | None, record: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        console.print(f"[dim]wrote {path}[/dim]")


@app.command("envs")
def envs_cmd() -> None:
    """List the registered multi-turn envs with their tools and options."""
    table = Table(title="Registered multi-turn environments")
    table.add_column("id", no_wrap=True)
    table.add_column("tools", no_wrap=True)
    table.add_column("max turns", justify="right")
    table.add_column("description")
    for env_id in registered_envs():
        env = gym.make(env_id).unwrapped
        assert isinstance(env, MultiTurnEnv)
        doc = (type(env).__doc__ or "").strip()
        table.add_row(
            env_id, "\n".join(env.tools.names) or "-", str(env.config.max_turns), doc.split("\n")[0]
        )
        env.close()
    console.print(table)


@app.command("play")
def play_cmd(
    env_id: Annotated[str, typer.Argument(help="Registered env id, e.g. srt/Retail-v0.")],
    seed: Annotated[int | None, typer.Option(help="Seed for reset (same seed, same task).")] = None,
    oracle: Annotated[bool, typer.Option("--oracle", help="Let the scripted oracle play.")] = False,
    max_turns: Annotated[int | None, typer.Option(help="Override the env's turn limit.")] = None,
) -> None:
    """Play one episode: you type the assistant's turns (tool calls run for real), or --oracle plays."""
    options: dict[str, Any] = {} if max_turns is None else {"max_turns": max_turns}
    env = _make(env_id, **options)
    try:
        play_episode(env, seed=seed, oracle=oracle, console=console)
    except NotImplementedError as exc:
        err_console.print(f"[red]error:[/red] {exc}; play it yourself without --oracle")
        raise typer.Exit(2) from None
    finally:
        env.close()


@app.command("demo")
def demo_cmd(
    seed: Annotated[int, typer.Option(help="Seed for every episode.")] = 0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the summary as JSON here.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="Only print the summary table.")] = False,
) -> None:
    """List the envs, then let each env's oracle play one episode and summarise the results."""
    envs_cmd()
    table = Table(title=f"Oracle episodes (seed {seed})")
    for col in ("env", "task", "turns", "tool calls", "reward", "end", "seconds"):
        table.add_column(col)
    record: dict[str, Any] = {"seed": seed}
    ok = True
    for env_id in registered_envs():
        env = gym.make(env_id)
        if not quiet:
            console.rule(env_id)
        t0 = time.perf_counter()
        try:
            if quiet:
                result = run_episode(env, oracle_policy, seed=seed)
            else:
                played = play_episode(env, seed=seed, oracle=True, console=console)
                assert played is not None
                result = played
        except NotImplementedError:
            table.add_row(env_id, "-", "-", "-", "-", "no oracle", "-")
            continue
        finally:
            env.close()
        seconds = time.perf_counter() - t0
        calls = sum(1 for m in result.transcript if m.role == "tool")
        end = "terminated" if result.terminated else "truncated"
        reward = f"{result.total_reward:g}"
        table.add_row(env_id, result.task_id, str(result.turns), str(calls), reward, end, f"{seconds:.2f}")
        key = env_id.replace("/", "_").replace("-", "_")
        record[f"{key}_reward"] = result.total_reward
        record[f"{key}_turns"] = result.turns
        ok = ok and result.total_reward > 0
    console.print(table)
    _write_json(json_path, record)
    if not ok:
        raise typer.Exit(1)


def main() -> None:
    """Console-script entry point."""
    app()
