"""Policies and the episode loop that plays one against a multi-turn env.

A policy maps the conversation so far to the assistant's next text. Scripted policies (oracles,
test scripts, a person at a terminal) and, later, model-backed ones all share this protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym

from srt_agent.chat.messages import Message, assistant


@runtime_checkable
class Policy(Protocol):
    """Anything that writes the assistant's next turn."""

    def act(self, history: Sequence[Message]) -> str:
        """Return the assistant's text for the next turn.

        Args:
            history: Every message of the episode so far, opening messages first.
        """
        ...


@dataclass(frozen=True)
class EpisodeResult:
    """The outcome of one played episode.

    Attributes:
        transcript: All messages in order, including the assistant's turns.
        total_reward: Sum of step rewards.
        turns: Number of assistant turns.
        terminated: The task reached a terminal state.
        truncated: The episode was cut off (turn limit).
        task_id: The task id from ``reset``'s info.
        final_info: The info dict of the last step.
    """

    transcript: tuple[Message, ...]
    total_reward: float
    turns: int
    terminated: bool
    truncated: bool
    task_id: str
    final_info: dict[str, Any] = field(default_factory=dict)


def run_episode(
    env: gym.Env[tuple[Message, ...], str],
    policy: Policy | Callable[[gym.Env[tuple[Message, ...], str]], Policy],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    on_message: Callable[[Message], None] | None = None,
) -> EpisodeResult:
    """Reset ``env`` and play ``policy`` until the episode ends.

    Args:
        env: A multi-turn env (wrapped or not).
        policy: The policy, or a factory called after ``reset`` with the env (oracles need the
            task, so they are built after reset: pass ``lambda e: e.unwrapped.oracle()``).
        seed: Seed for ``reset``.
        options: Options for ``reset``.
        on_message: Called with every message as it happens (for live printing).

    Returns:
        The episode's transcript, total reward and end state.
    """
    obs, info = env.reset(seed=seed, options=options)
    if not isinstance(policy, Policy):
        policy = policy(env)
    history: list[Message] = []

    def record(msgs: Sequence[Message]) -> None:
        for m in msgs:
            history.append(m)
            if on_message is not None:
                on_message(m)

    record(obs)
    total, turns = 0.0, 0
    terminated = truncated = False
    step_info: dict[str, Any] = {}
    while not (terminated or truncated):
        action = policy.act(tuple(history))
        record([assistant(action)])
        obs, reward, terminated, truncated, step_info = env.step(action)
        total += float(reward)
        turns += 1
        record(obs)
    return EpisodeResult(
        transcript=tuple(history),
        total_reward=total,
        turns=turns,
        terminated=terminated,
        truncated=truncated,
        task_id=str(info.get("task_id", "")),
        final_info=step_info,
    )
