"""Multi-turn environments: the contract, registration, the episode loop and tools to check an env.

* :mod:`~srt_agent.env.multi_turn`: :class:`MultiTurnEnv`, a ``gymnasium.Env`` over chat messages;
* :mod:`~srt_agent.env.registration`: ``make`` / ``register_env`` (Gymnasium's registry);
* :mod:`~srt_agent.env.episode_loop`: the :class:`Policy` protocol and ``run_episode``;
* :mod:`~srt_agent.env.spaces`: the observation and action spaces;
* :mod:`~srt_agent.env.testing`: ``check_multiturn_env`` and a scripted policy for a user's tests;
* :mod:`~srt_agent.env.play` and :mod:`~srt_agent.env.demo`: ``srt-agent play`` and ``demo``.

The built-in envs themselves are in :mod:`srt_agent.envs`.
"""

from srt_agent.env.episode_loop import EpisodeResult, Policy, run_episode
from srt_agent.env.multi_turn import (
    EnvConfig,
    EnvConfigError,
    MultiTurnEnv,
    Transition,
    async_step,
    describe_options,
    oracle_policy,
)
from srt_agent.env.registration import UnknownEnvError, make, register_env, registered_envs

__all__ = [
    "EnvConfig",
    "EnvConfigError",
    "EpisodeResult",
    "MultiTurnEnv",
    "Policy",
    "Transition",
    "UnknownEnvError",
    "async_step",
    "describe_options",
    "make",
    "oracle_policy",
    "register_env",
    "registered_envs",
    "run_episode",
]
