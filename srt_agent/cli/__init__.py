"""The ``srt-agent`` command line: one module per command group, all on one typer app."""

from srt_agent.cli import bench_commands, env_commands, model_commands, server_commands
from srt_agent.cli.app import app, main

__all__ = ["app", "bench_commands", "env_commands", "main", "model_commands", "server_commands"]
