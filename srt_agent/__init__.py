"""srt-agent: multi-turn RL for tool-using LLM agents with speculative rollouts from a tree cache.

The env/tool foundation is importable from the top level; built-in envs register with gymnasium
on ``import srt_agent.envs`` (or on the first :func:`make`).
"""

from srt_agent.env import EnvConfig, EnvConfigError, MultiTurnEnv, Transition, async_step, oracle_policy
from srt_agent.errors import SrtAgentError
from srt_agent.messages import Message
from srt_agent.policy import EpisodeResult, Policy, run_episode
from srt_agent.registration import UnknownEnvError, make, register_env, registered_envs
from srt_agent.tool import Tool, tool
from srt_agent.tool_parser import ParsedTurn, ToolCall, parse_tool_calls
from srt_agent.toolset import ToolResult, ToolSet

__version__ = "0.1.0"

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
