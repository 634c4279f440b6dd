"""srt-agent: multi-turn RL for tool-using LLM agents with speculative rollouts from a tree cache.

The env/tool foundation is importable from the top level; built-in envs register with gymnasium
on ``import srt_agent.envs`` (or on the first :func:`make`).

Module paths from before the ``env``, ``tool`` and ``chat`` packages (``srt_agent.messages``,
``srt_agent.policy``, ``srt_agent.registration``, ``srt_agent.testing``, ``srt_agent.toolset``,
``srt_agent.tool_parser``, ``srt_agent.spaces``) still import: each names its new module.
"""

import sys

from srt_agent.chat import messages as _messages
from srt_agent.chat.messages import Message
from srt_agent.env import episode_loop as _episode_loop
from srt_agent.env import registration as _registration
from srt_agent.env import spaces as _spaces
from srt_agent.env import testing as _testing
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
from srt_agent.tool import parser as _parser
from srt_agent.tool import toolset as _toolset
from srt_agent.tool.definition import Tool, tool
from srt_agent.tool.parser import ParsedTurn, ToolCall, parse_tool_calls
from srt_agent.tool.toolset import ToolResult, ToolSet

__version__ = "0.1.0"

# Old module paths, kept for code written against them: ``import srt_agent.policy`` finds the
# module in sys.modules once this package is imported, and the attribute serves ``srt_agent.policy.X``.
_MOVED = {
    "messages": _messages,
    "policy": _episode_loop,
    "registration": _registration,
    "spaces": _spaces,
    "testing": _testing,
    "tool_parser": _parser,
    "toolset": _toolset,
}
for _old, _module in _MOVED.items():
    sys.modules[f"{__name__}.{_old}"] = _module
    globals()[_old] = _module


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
