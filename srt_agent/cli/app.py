"""The ``srt-agent`` app and what its commands share: consoles, option parsing, error exits."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import gymnasium as gym
import typer

from srt_agent import __version__
from srt_agent.env.multi_turn import EnvConfigError
from srt_agent.env.registration import (
    UnknownEnvError,
    make,
)
from srt_agent.output.console import make_console
from srt_agent.output.paths import OutputPathError, resolve_model_dir
from srt_agent.output.reporting import check_outputs, print_error

if TYPE_CHECKING:
    from srt_agent.config.sections import SpecSection

app = typer.Typer(
    name="srt-agent",
    help="Multi-turn RL for tool-using LLM agents with speculative rollouts from a tree cache (SRT).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = make_console()
err_console = make_console(stderr=True)

SPEC_FILE_HELP = (
    "Speculation options (tree cache, draft budget, cost model, run-ahead): a run config, whose `spec` "
    "section is used, or a `spec` or `spec.cache` section on its own (YAML or JSON)."
)


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


def make_or_exit(env_id: str, **options: Any) -> gym.Env[tuple[Any, ...], str]:
    """Make an env, turning bad ids and options into a clean exit with the message (exit code 2)."""
    try:
        return make(env_id, **options)
    except (UnknownEnvError, EnvConfigError) as exc:
        raise exit_with(exc) from None


ENV_OPTION_HELP = (
    "An env option as KEY=VALUE (repeatable; VALUE is read as YAML: 3, true, [a, b], {k: v}), "
    "e.g. -o tool=calculator. `srt-agent envs` lists each env's options."
)


def parse_env_options(pairs: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as env options, each value read as YAML.

    Read the way a run config's overrides are (the same guarded reader: ``1e-4`` is a float,
    alias bombs are refused), so ``-o`` and ``env.options`` agree.

    Raises:
        ValueError: A pair without ``=``, or a value that is not YAML.
    """
    from srt_agent.config.loader import ConfigError, apply_overrides

    for pair in pairs or []:
        key, sep, _ = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {pair!r}: write KEY=VALUE, e.g. --option max_turns=4")
    try:
        return apply_overrides({}, pairs or [])
    except ConfigError as exc:
        raise ValueError("--option: " + "; ".join(exc.problems)) from None


def spec_options(config: Path | None, *, server: bool = False) -> SpecSection:
    """The ``spec`` section of ``--config`` (the defaults without one), or exit 2 saying why.

    ``server``: for a server's options (see :func:`srt_agent.config.spec_file.load_spec`).
    """
    from srt_agent.config.loader import ConfigError
    from srt_agent.config.spec_file import load_spec

    try:
        return load_spec(config, server=server)
    except ConfigError as exc:
        raise exit_with(exc) from None


def exit_with(error: Exception | str) -> typer.Exit:
    """Print the error (see :func:`~srt_agent.output.reporting.print_error`); raise what it returns."""
    return typer.Exit(print_error(err_console, error))


def check_output_paths(*outputs: tuple[Path | None, str]) -> None:
    """Check, before a run, that each given output path can be written, or exit saying why (code 2).

    After the run it would be too late: the results would be lost.
    """
    try:
        check_outputs(*outputs)
    except OutputPathError as exc:
        raise exit_with(exc) from None


def pick_model_dir(model: Path | None) -> Path:
    """The model to use (see :func:`srt_agent.output.paths.resolve_model_dir`), or a clean exit saying why."""
    try:
        path, note = resolve_model_dir(model)
    except FileNotFoundError as exc:
        raise exit_with(exc) from None
    if note:
        err_console.print(f"[dim]{note}[/dim]")
    return path


def main() -> None:
    """Console-script entry point."""
    app()
