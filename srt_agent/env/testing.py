"""Test helpers for users' own envs and tools: a generic env, a scripted policy, an env checker.

Example:
    >>> from srt_agent.env.testing import GenericTestEnv, ScriptedPolicy
    >>> from srt_agent import run_episode
    >>> env = GenericTestEnv(answer="42")
    >>> run_episode(env, ScriptedPolicy(["the answer is 42"]), seed=0).total_reward
    1.0
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.utils.env_checker import check_env
from pydantic import Field

from srt_agent.chat.messages import Message, system, user
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Transition
from srt_agent.env.spaces import MessagesSpace
from srt_agent.tooling.definition import Tool, tool
from srt_agent.tooling.toolset import ToolSet


@tool
def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: Anything.
    """
    return text


class GenericTestConfig(EnvConfig):
    """Options of :class:`GenericTestEnv`."""

    answer: str = Field("42", description="Text whose presence in a reply ends the episode with reward 1.")
    question: str = Field("What is six times seven?", description="The opening user message.")


class GenericTestEnv(MultiTurnEnv):
    """A tiny env for tests: one question, answered in any number of turns.

    A reply containing ``answer`` wins; any other reply gets "Try again.". It offers the
    :func:`echo` tool (or the ``tools`` you pass).

    Args:
        tools: Tools to offer instead of ``echo``.
        reward_fn: Maps a reply to ``(reward, terminated)``; replaces the ``answer`` check.
        **options: :class:`GenericTestConfig` options.
    """

    config_model = GenericTestConfig

    def __init__(
        self,
        tools: Iterable[Tool] | None = None,
        reward_fn: Callable[[str], tuple[float, bool]] | None = None,
        render_mode: str | None = None,
        **options: Any,
    ):
        self._extra_tools = list(tools) if tools is not None else [echo]
        self._reward_fn = reward_fn
        super().__init__(render_mode=render_mode, **options)
        self.config: GenericTestConfig

    def build_tools(self) -> ToolSet:
        """The tools given to the constructor (``echo`` by default)."""
        return ToolSet(self._extra_tools)

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """A fixed question; the task id carries a draw from ``np_random`` to show seeding works."""
        nonce = int(self.np_random.integers(1_000_000))
        return f"generic-{nonce}", [system("You are a test assistant."), user(self.config.question)]

    def on_message(self, text: str) -> Transition:
        """Reward 1 and stop when the reply contains the answer; otherwise ask again."""
        if self._reward_fn is not None:
            reward, done = self._reward_fn(text)
        else:
            done = self.config.answer in text
            reward = 1.0 if done else 0.0
        return Transition(messages=[] if done else [user("Try again.")], reward=reward, terminated=done)


class ScriptedPolicy:
    """Plays a fixed list of assistant turns in order (the last one repeats when the list runs out).

    Args:
        actions: The turns, or callables ``history -> str`` for turns that depend on the conversation.
    """

    def __init__(self, actions: Sequence[str | Callable[[Sequence[Message]], str]]):
        if not actions:
            raise ValueError("ScriptedPolicy needs at least one action")
        self.actions = list(actions)
        self.calls = 0

    def act(self, history: Sequence[Message]) -> str:
        """The next scripted turn."""
        action = self.actions[min(self.calls, len(self.actions) - 1)]
        self.calls += 1
        return action(history) if callable(action) else action


def check_multiturn_env(env: gym.Env[Any, Any], *, seeds: Iterable[int] = (0, 1, 2)) -> None:
    """Run gymnasium's ``check_env`` plus srt-agent's contract checks on an env.

    Checks: gymnasium's API and determinism checks (no warnings allowed); observations are tuples of
    messages; ``reset`` info has a string ``task_id`` and a list of tool schemas; the same seed
    gives the same opening; a random (garbage) action never raises.

    Raises:
        AssertionError: The first violated check, with what was found.
    """
    base = env.unwrapped
    assert isinstance(base, MultiTurnEnv), f"expected a MultiTurnEnv, got {type(base).__name__}"
    assert isinstance(base.observation_space, MessagesSpace), "observation_space must be MessagesSpace"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(base, skip_render_check=base.spec is None)
    for seed in seeds:
        obs1, info1 = env.reset(seed=seed)
        obs2, info2 = env.reset(seed=seed)
        same = obs1 == obs2 and info1["task_id"] == info2["task_id"]
        assert same, f"seed {seed}: reset is not deterministic"
        assert isinstance(info1.get("task_id"), str) and info1["task_id"], f"seed {seed}: info lacks task_id"
        assert isinstance(info1.get("tools"), list), f"seed {seed}: info lacks the tool schema list"
        for schema in info1["tools"]:
            assert schema.get("type") == "function" and "name" in schema["function"], f"bad schema {schema}"
        assert all(isinstance(m, Message) for m in obs1) and obs1, f"seed {seed}: bad opening {obs1!r}"
        env.action_space.seed(seed)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert all(isinstance(m, Message) for m in obs), "step must return a tuple of messages"
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
