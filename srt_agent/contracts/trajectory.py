"""The result of one rollout episode: its exact token sequence and what happened, as frozen data.

A :class:`Trajectory` crosses into the learner (token ids, loss mask, sampling logprobs, per-turn
rewards), the trace exporter (per-turn state keys and generated tokens) and the evaluation report
(success, turns, tool use, timings), so it is plain immutable data with no live objects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from srt_agent.chat.messages import Message
from srt_agent.contracts.generation import FinishReason

if TYPE_CHECKING:
    from srt_agent.tooling.grammar import ToolCallGrammar

Status = Literal["ok", "truncated", "failed"]
"""How an episode ended: ``ok`` (the env terminated it), ``truncated`` (the env's turn limit, the
rollout's ``max_turns`` cap or the engine's context limit cut it off) or ``failed`` (the env, the
chat template or the engine raised or aborted; see ``Trajectory.reason``)."""


@dataclass(frozen=True)
class TurnRecord:
    """One generated (policy) turn of an episode.

    Attributes:
        index: 0-based turn number within the episode.
        start: Index of the turn's first generated token in ``Trajectory.token_ids``; also the
            prompt length (``prefix_len``) the turn was generated from.
        end: One past the turn's last generated token.
        state_key: :func:`srt_agent.engine.state_key` of ``token_ids[:start]``, the exact prefix.
        finish_reason: Why the engine stopped generating (``stop``, ``length`` or ``abort``).
        reward: The reward of the env step this turn's action caused (0.0 if no step ran).
        forward_passes: Model forward passes the engine reported for this turn.
        sampling_seed: The per-request seed sent to the engine (``None``: the engine's own RNG).
        generation_s: Wall seconds between submitting the request and receiving its output.
        env_s: Wall seconds of the env step this turn's action caused (its tools included; 0.0 if
            no step ran).
    """

    index: int
    start: int
    end: int
    state_key: str
    finish_reason: FinishReason
    reward: float
    forward_passes: int
    sampling_seed: int | None
    generation_s: float
    env_s: float = 0.0

    @property
    def prefix_len(self) -> int:
        """Prompt tokens the turn was generated from (same as ``start``)."""
        return self.start


@dataclass(frozen=True)
class Trajectory:
    """One finished episode.

    Token fields cover the whole episode as one sequence: prompt, generated turns, observations.
    Generated tokens are kept verbatim (never re-tokenized), so ``logprobs`` belong to them exactly.

    Attributes:
        episode_id: Unique id of the episode within its rollout batch.
        env_id: The gymnasium id the env was made from.
        task_id: ``reset``'s ``info["task_id"]`` (empty if reset failed).
        seed: The env seed passed to ``reset``.
        trial: Which repeat of the same task this is (0-based; eval runs ``k`` trials per task).
        token_ids: Every token of the episode, prompt first.
        loss_mask: 1 for tokens the policy sampled, 0 for everything else.
        logprobs: Sampling logprob of each token; 0.0 where ``loss_mask`` is 0.
        turns: One record per generated turn, in order.
        total_reward: Sum of every step's reward.
        success: ``env.unwrapped.is_success(total_reward, final_info)``; always False when failed.
        terminated: The env reached a terminal state.
        truncated: The episode was cut off (by the env's or the rollout's turn limit, or the context).
        status: See :data:`Status`.
        reason: Why the status is not ``ok``, as ``"<category>: <detail>"`` (empty when ok).
            Categories: ``env truncated``, ``max_turns``, ``context limit``,
            ``env raised <Error>``, ``chat template``, ``engine raised <Error>``, ``engine aborted``.
        tool_calls: Tool calls over all steps (sum of step ``info["tool_calls"]``).
        tool_errors: Failed tool calls over all steps (sum of ``len(info["tool_errors"])``).
        messages: Every message of the episode, including the env's last reply (which has no
            tokens, since no generation follows it).
        final_info: The last step's info (or reset's, if no step ran), made JSON-safe.
        generation_s: Wall seconds spent awaiting the engine. It includes the time the request
            waited in the engine's queue and shared batches with other sequences: the Engine
            protocol does not report that split.
        env_s: Wall seconds in the env: ``make``, ``reset``, every ``step`` (tool calls included)
            and ``close``.
        setup_s: Wall seconds of ``make`` and ``reset`` (each step's are in its turn's ``env_s``).
        queue_s: Wall seconds the episode waited for a rollout slot (``max_concurrent``) before
            it started.
        wall_s: Wall seconds from start to end, excluding ``queue_s``. What is left after
            ``generation_s`` and ``env_s`` is chat-template rendering and event-loop waits.
        tool_grammar: The grammar its tool calls were decoded under (``rollout.constrain_tool_calls``),
            so that the learner scores the same masked distribution; ``None``: unconstrained.
    """

    episode_id: str
    env_id: str
    task_id: str
    seed: int | None
    trial: int
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    turns: tuple[TurnRecord, ...]
    total_reward: float
    success: bool
    terminated: bool
    truncated: bool
    status: Status
    reason: str
    tool_calls: int
    tool_errors: int
    messages: tuple[Message, ...]
    final_info: Mapping[str, Any] = field(default_factory=dict, hash=False)
    generation_s: float = 0.0
    env_s: float = 0.0
    setup_s: float = 0.0
    queue_s: float = 0.0
    wall_s: float = 0.0
    tool_grammar: ToolCallGrammar | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"episode {self.episode_id!r}: {n} token ids, {len(self.loss_mask)} mask entries and "
                f"{len(self.logprobs)} logprobs; all three must have the same length"
            )
        for t in self.turns:
            if not 0 < t.start < t.end <= n:
                raise ValueError(
                    f"episode {self.episode_id!r}: turn {t.index} span {t.start}..{t.end} is bad"
                )
        if (self.status == "ok") == bool(self.reason):
            raise ValueError(
                f"episode {self.episode_id!r}: status {self.status!r} with reason {self.reason!r}"
            )

    @property
    def num_turns(self) -> int:
        """Generated (assistant) turns."""
        return len(self.turns)

    @property
    def turn_spans(self) -> tuple[tuple[int, int], ...]:
        """``[start, end)`` token indices of each generated turn."""
        return tuple((t.start, t.end) for t in self.turns)

    @property
    def turn_rewards(self) -> tuple[float, ...]:
        """Reward credited to each generated turn (the reward of the step it caused)."""
        return tuple(t.reward for t in self.turns)

    @property
    def generated_tokens(self) -> int:
        """Tokens the policy sampled (the number of 1s in ``loss_mask``)."""
        return sum(t.end - t.start for t in self.turns)

    @property
    def forward_passes(self) -> int:
        """Engine forward passes over all turns.

        ``generated_tokens / forward_passes`` is the tokens-per-forward figure of speculation.
        """
        return sum(t.forward_passes for t in self.turns)

    @property
    def prompt_len(self) -> int:
        """Tokens before the first generated turn (the whole sequence if none was generated)."""
        return self.turns[0].start if self.turns else len(self.token_ids)


def json_safe(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps`` accepts and that reads back the same.

    Dicts (keys made strings), lists and tuples (as lists), str/int/bool/None are kept;
    pydantic models are dumped in JSON mode; numpy scalars become Python numbers; non-finite
    floats become strings (JSON has no NaN); anything else becomes its ``str()``.
    """
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v) for v in value]
    if isinstance(value, BaseModel):
        return json_safe(value.model_dump(mode="json"))
    item = getattr(value, "item", None)  # numpy scalars and 0-d arrays
    if callable(item):
        try:
            return json_safe(item())
        except (TypeError, ValueError):
            pass
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - an env's odd info value must not cost the episode
        return f"<{type(value).__name__} that could not be printed>"
