"""srt-agent: multi-turn RL for tool-using LLM agents with speculative rollouts from a tree cache.

The env and tool API is importable from the top level (``from srt_agent import MultiTurnEnv, tool``);
built-in envs register with gymnasium on ``import srt_agent.envs`` (or on the first :func:`make`).

Top-level names are resolved on first use, so importing one subpackage (``srt_agent.tree_cache``,
``srt_agent.native``) does not pull in gymnasium or the env stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "EnvConfig": "srt_agent.env.multi_turn",
    "EnvConfigError": "srt_agent.env.multi_turn",
    "EpisodeResult": "srt_agent.env.episode_loop",
    "Message": "srt_agent.chat.messages",
    "MultiTurnEnv": "srt_agent.env.multi_turn",
    "ParsedTurn": "srt_agent.tooling.parser",
    "Policy": "srt_agent.env.episode_loop",
    "SrtAgentError": "srt_agent.errors",
    "Tool": "srt_agent.tooling.definition",
    "ToolCall": "srt_agent.tooling.parser",
    "ToolCallGrammar": "srt_agent.tooling.grammar",
    "ToolResult": "srt_agent.tooling.toolset",
    "ToolSet": "srt_agent.tooling.toolset",
    "Transition": "srt_agent.env.multi_turn",
    "UnknownEnvError": "srt_agent.env.registration",
    "async_step": "srt_agent.env.multi_turn",
    "make": "srt_agent.env.registration",
    "oracle_policy": "srt_agent.env.multi_turn",
    "parse_tool_calls": "srt_agent.tooling.parser",
    "register_env": "srt_agent.env.registration",
    "registered_envs": "srt_agent.env.registration",
    "run_episode": "srt_agent.env.episode_loop",
    "tool": "srt_agent.tooling.definition",
}
"""Each top-level name and the module that defines it."""

__all__ = [
    "EnvConfig",
    "EnvConfigError",
    "EpisodeResult",
    "Message",
    "MultiTurnEnv",
    "ParsedTurn",
    "Policy",
    "SrtAgentError",
    "Tool",
    "ToolCall",
    "ToolCallGrammar",
    "ToolResult",
    "ToolSet",
    "Transition",
    "UnknownEnvError",
    "async_step",
    "make",
    "oracle_policy",
    "parse_tool_calls",
    "register_env",
    "registered_envs",
    "run_episode",
    "tool",
]


def __getattr__(name: str) -> Any:
    """Import a top-level name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'srt_agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from srt_agent.chat.messages import Message
    from srt_agent.env.episode_loop import EpisodeResult, Policy, run_episode
    from srt_agent.env.multi_turn import (
        EnvConfig,
        EnvConfigError,
        MultiTurnEnv,
        Transition,
        async_step,
        oracle_policy,
    )
    from srt_agent.env.registration import UnknownEnvError, make, register_env, registered_envs
    from srt_agent.errors import SrtAgentError
    from srt_agent.tooling.definition import Tool, tool
    from srt_agent.tooling.grammar import ToolCallGrammar
    from srt_agent.tooling.parser import ParsedTurn, ToolCall, parse_tool_calls
    from srt_agent.tooling.toolset import ToolResult, ToolSet
