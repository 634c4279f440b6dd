"""Where a policy first leaves its env's oracle: each traced episode replayed, the oracle asked at every turn.

Held-out success says whether an episode was solved; on a long dialogue it does not say where it
went wrong, and one early mistake (a name copied wrong in the first look-up) derails everything
after it. This replays a trace's episodes in the env (same seed, the policy's own turns) and asks
the env's oracle what it would do at each state the policy reached; the first turn where the two
differ is the episode's *departure*. It needs an env whose oracle recomputes its step from the
visible conversation (Retail's and Calculator's do), and an env that answers the same turns the
same way for the same seed. The replay checks the latter: each replayed prompt must have the state
key the trace recorded, or the episode is counted as not replayable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from srt_agent.chat.messages import Message
from srt_agent.chat.template import ChatFormat
from srt_agent.contracts.generation import state_key
from srt_agent.env.multi_turn import oracle_policy
from srt_agent.env.registration import make
from srt_agent.rollout.config import RolloutConfig
from srt_agent.rollout.episode import check_observation
from srt_agent.rollout.trace import TraceTurn
from srt_agent.tooling.parser import parse_tool_calls

__all__ = ["Departure", "action_kind", "first_departures"]


@dataclass(frozen=True)
class Departure:
    """One traced episode, replayed.

    Attributes:
        episode_id: The trace's episode id.
        seed: Its env seed.
        success: Whether the episode was solved (as traced).
        turn: The first assistant turn (0-based) where the policy's turn differs from the oracle's;
            ``None`` when every traced turn matched, or when the episode could not be replayed.
        expected: The oracle's turn there (empty without a departure).
        actual: The policy's turn there (empty without a departure).
        replayed: False when the env answered the replay differently from the trace (another env
            option, or an env that is not deterministic given its seed and the turns).
        steps: Every replayed turn, the first departure's successors included (the replay goes on
            with the policy's turns, the oracle asked at each): the kind of the oracle's turn
            (:func:`action_kind`) and whether the policy's differed.
    """

    episode_id: str
    seed: int | None
    success: bool
    turn: int | None
    expected: str = ""
    actual: str = ""
    replayed: bool = True
    steps: tuple[tuple[str, bool], ...] = ()


def action_kind(action: str) -> str:
    """A turn's kind: the first tool it calls, ``malformed`` for a broken call, or ``text``."""
    parsed = parse_tool_calls(action)
    if parsed.calls:
        return parsed.calls[0].name
    return "malformed" if parsed.errors else "text"


def _episodes(turns: Iterable[TraceTurn]) -> list[list[TraceTurn]]:
    by_id: dict[str, list[TraceTurn]] = {}
    for t in turns:
        by_id.setdefault(t.episode_id, []).append(t)
    return [sorted(ts, key=lambda t: t.turn) for ts in by_id.values()]


def first_departures(
    turns: Iterable[TraceTurn],
    fmt: ChatFormat,
    env_options: Mapping[str, Any] | None = None,
    *,
    max_observation_chars: int | None = RolloutConfig().max_observation_chars,
) -> list[Departure]:
    """Each traced episode's first departure from the env's oracle (see the module docstring).

    Args:
        turns: A trace's turns (``srt-agent eval --trace``), any number of episodes and envs.
        fmt: The chat format of the model that wrote the trace (its tokenizer decodes the turns).
        env_options: The options the episodes' envs were made with (``eval -o``).
        max_observation_chars: The rollout's cap on env messages, as in the traced run.

    Returns:
        One :class:`Departure` per episode, in the trace's order.

    Raises:
        NotImplementedError: An env has no oracle.
    """
    out = []
    envs: dict[str, Any] = {}
    try:
        for episode in _episodes(turns):
            first = episode[0]
            env = envs.get(first.env_id)
            if env is None:
                env = envs[first.env_id] = make(first.env_id, **dict(env_options or {}))
            out.append(_replay(env, episode, fmt, max_observation_chars))
    finally:
        for env in envs.values():
            env.close()
    return out


def _replay(env: Any, episode: Sequence[TraceTurn], fmt: ChatFormat, max_chars: int | None) -> Departure:
    first = episode[0]
    opening, info = env.reset(seed=first.seed)
    oracle = oracle_policy(env)
    history: list[Message] = list(check_observation(opening, "reset", max_chars))
    transcript = fmt.start(history, list(info.get("tools") or ()))
    found = Departure(first.episode_id, first.seed, first.episode_success, None)
    steps: list[tuple[str, bool]] = []
    for t in episode:
        if state_key(transcript.token_ids) != t.state_key:
            return replace(found, turn=None, expected="", actual="", replayed=False)
        actual = fmt.assistant_text(t.token_ids)
        expected = oracle.act(tuple(history))
        steps.append((action_kind(expected), actual != expected))
        if actual != expected and found.turn is None:
            found = replace(found, turn=t.turn, expected=expected, actual=actual)
        obs, _, terminated, truncated, _ = env.step(actual)
        history.append(Message(role="assistant", content=actual))
        transcript = fmt.add_generation(transcript, t.token_ids, t.logprobs)
        if terminated or truncated:
            break
        messages = check_observation(obs, "step", max_chars)
        history.extend(messages)
        transcript = fmt.add_observation(transcript, messages)
    return replace(found, steps=tuple(steps))
