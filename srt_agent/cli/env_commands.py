"""``srt-agent envs``, ``play`` and ``demo``: the envs, played by hand or by their oracles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import gymnasium as gym
import typer
from rich.table import Table

from srt_agent.cli.app import (
    ENV_OPTION_HELP,
    app,
    check_output_paths,
    console,
    err_console,
    exit_with,
    make_or_exit,
    parse_env_options,
)
from srt_agent.env.demo import oracle_table
from srt_agent.env.multi_turn import MultiTurnEnv
from srt_agent.env.play import play as play_episode
from srt_agent.env.registration import (
    registered_envs,
)
from srt_agent.output.reporting import write_json


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
    console.print(_ecosystems_table())


def _ecosystems_table() -> Table:
    """The ecosystems whose envs run through a prefix, and whether their package is installed."""
    from srt_agent.integrations.ecosystems import ECOSYSTEMS

    table = Table(title="Environments from other ecosystems (name them PREFIX:NAME)")
    table.add_column("prefix", no_wrap=True)
    table.add_column("package")
    table.add_column("example id", no_wrap=True)
    for eco in ECOSYSTEMS.values():
        version = eco.installed_version()
        state = (
            f"{eco.package} {version}" if version else f"not installed: pip install 'srt-agent[{eco.extra}]'"
        )
        table.add_row(f"{eco.prefix}:", state, eco.example)
    return table


@app.command("play")
def play_cmd(
    env_id: Annotated[str, typer.Argument(help="Registered env id, e.g. srt/Retail-v0.")],
    seed: Annotated[int | None, typer.Option(help="Seed for reset (same seed, same task).")] = None,
    oracle: Annotated[bool, typer.Option("--oracle", help="Let the scripted oracle play.")] = False,
    max_turns: Annotated[int | None, typer.Option(help="Override the env's turn limit.")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help=ENV_OPTION_HELP)] = None,
) -> None:
    """Play one episode: you type the assistant's turns (tool calls run for real), or --oracle plays."""
    try:
        options = parse_env_options(option)
    except ValueError as exc:
        raise exit_with(exc) from None
    if max_turns is not None:
        options["max_turns"] = max_turns
    env = make_or_exit(env_id, **options)
    try:
        play_episode(env, seed=seed, oracle=oracle, console=console)
    except NotImplementedError as exc:
        raise exit_with(f"{exc}; play it yourself without --oracle") from None
    finally:
        env.close()


@app.command("demo")
def demo_cmd(
    seed: Annotated[int, typer.Option(help="Seed of the first episode (then seed+1, ...).")] = 0,
    episodes: Annotated[int, typer.Option(min=1, help="Oracle episodes per env.")] = 1,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the summary as JSON here.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="Do not print transcripts.")] = False,
) -> None:
    """List the envs, then let each env's oracle play episodes and summarise the results."""
    check_output_paths((json_path, "--json"))
    envs_cmd()
    table, record, ok = oracle_table(registered_envs(), seed, episodes, console=console, quiet=quiet)
    console.print(table)
    write_json(console, json_path, record)
    if not ok:
        err_console.print("[red]an oracle failed to solve every task[/red]")
        raise typer.Exit(1)
