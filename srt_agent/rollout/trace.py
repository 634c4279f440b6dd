"""Rollout traces: one JSON line per generated turn, the data the tree cache learns from.

Schema ``srt-trace/1`` (documented in ``docs/trace_schema.md``). Each line is one generated turn::

    {"schema": "srt-trace/1", "episode_id": "srt/Calculator-v0/1000000/0", "env_id": "srt/Calculator-v0",
     "task_id": "calculator-bill-3-...", "seed": 1000000, "trial": 0, "turn": 0,
     "state_key": "9f2c...", "prefix_len": 412, "new_prompt_ids": [...], "token_ids": [...],
     "logprobs": [...], "finish_reason": "stop", "reward": 0.0, "forward_passes": 23,
     "sampling_seed": 12345, "last": false, "episode_status": "ok", "episode_success": true}

``new_prompt_ids`` are the tokens added to the sequence since the previous turn's generated tokens
(the whole prompt on turn 0), so an episode's lines reconstruct its exact token sequence
(:func:`episode_prefix`) and every ``state_key`` can be checked. Version rule: a minor addition
(a new key) keeps ``srt-trace/1`` and readers ignore keys they do not know; removing, renaming or
changing the meaning of a key makes it ``srt-trace/2``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from srt_agent.contracts.generation import FinishReason
from srt_agent.contracts.trajectory import Status, Trajectory
from srt_agent.errors import SrtAgentError

TRACE_SCHEMA = "srt-trace/1"


class TraceFormatError(SrtAgentError, ValueError):
    """A trace line is not valid ``srt-trace/1``."""


@dataclass(frozen=True)
class TraceTurn:
    """One line of a trace: one generated turn and the state it was generated from.

    Attributes:
        episode_id: The episode's unique id in its run.
        env_id: The env's gymnasium id.
        task_id: The env's task id (from ``reset``).
        seed: The env seed of the episode.
        trial: Repeat number of the task.
        turn: 0-based turn index in the episode.
        state_key: Hash of the exact token prefix the turn was generated from
            (:func:`srt_agent.engine.state_key`: blake2b-128 over 4-byte little-endian ids, hex).
        prefix_len: Tokens in that prefix.
        new_prompt_ids: Prefix tokens added since the previous turn's generated tokens.
        token_ids: The generated tokens, verbatim (a final stop token included).
        logprobs: Sampling logprob of each generated token.
        finish_reason: ``stop`` or ``length`` (an aborted request is not recorded as a turn).
        reward: The reward credited to this turn (that of the env step it caused).
        forward_passes: Forward passes the engine reported for the turn.
        sampling_seed: The request's sampling seed (``None``: the engine's own RNG).
        last: This is the episode's last generated turn.
        episode_status: The episode's status (``ok``, ``truncated``, ``failed``).
        episode_success: Whether the episode counted as solved.
        episode_reason: Why the episode failed or was truncated (``""`` when it ended normally,
            and in traces written before this key existed).
        env_s: Seconds of the env step this turn caused (tools included; 0.0 in older traces).
        episode_setup_s: Seconds the episode's env took to make and reset (0.0 in older traces).
    """

    episode_id: str
    env_id: str
    task_id: str
    seed: int | None
    trial: int
    turn: int
    state_key: str
    prefix_len: int
    new_prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    reward: float
    forward_passes: int
    sampling_seed: int | None
    last: bool
    episode_status: Status
    episode_success: bool
    episode_reason: str = ""
    env_s: float = 0.0
    episode_setup_s: float = 0.0

    def to_json(self) -> str:
        """The line's JSON text (no newline), ``schema`` first."""
        record: dict[str, Any] = {"schema": TRACE_SCHEMA, **asdict(self)}
        for key in ("new_prompt_ids", "token_ids", "logprobs"):
            record[key] = list(record[key])
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> TraceTurn:
        """Parse one line.

        Raises:
            TraceFormatError: Not JSON, another schema, a missing key, or a bad value.
        """
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"not JSON: {exc}") from None
        if not isinstance(record, dict) or record.get("schema") != TRACE_SCHEMA:
            found = record.get("schema") if isinstance(record, dict) else type(record).__name__
            raise TraceFormatError(f"schema is {found!r}, expected {TRACE_SCHEMA!r}")
        names = [f.name for f in fields(cls) if f.name in record or f.name not in _OPTIONAL_KEYS]
        missing = [n for n in names if n not in record]
        if missing:
            raise TraceFormatError(f"missing keys {missing}")
        values = {n: record[n] for n in names}  # unknown (newer) keys are ignored on purpose
        for key in ("new_prompt_ids", "token_ids", "logprobs"):
            if not isinstance(values[key], list):
                raise TraceFormatError(f"{key} must be a list, got {type(values[key]).__name__}")
            values[key] = tuple(values[key])
        if len(values["token_ids"]) != len(values["logprobs"]):
            raise TraceFormatError("token_ids and logprobs differ in length")
        return cls(**values)


_OPTIONAL_KEYS = frozenset({"episode_reason", "env_s", "episode_setup_s"})
"""Keys added after the first release of the format: a line without them reads with the default."""


def trace_turns(trajectory: Trajectory) -> list[TraceTurn]:
    """The trace lines of one trajectory (none if it generated no turn)."""
    t = trajectory
    out: list[TraceTurn] = []
    previous_end = 0
    for rec in t.turns:
        out.append(
            TraceTurn(
                episode_id=t.episode_id,
                env_id=t.env_id,
                task_id=t.task_id,
                seed=t.seed,
                trial=t.trial,
                turn=rec.index,
                state_key=rec.state_key,
                prefix_len=rec.start,
                new_prompt_ids=t.token_ids[previous_end : rec.start],
                token_ids=t.token_ids[rec.start : rec.end],
                logprobs=t.logprobs[rec.start : rec.end],
                finish_reason=rec.finish_reason,
                reward=rec.reward,
                forward_passes=rec.forward_passes,
                sampling_seed=rec.sampling_seed,
                last=rec.index == len(t.turns) - 1,
                episode_status=t.status,
                episode_success=t.success,
                episode_reason=t.reason,
                env_s=round(rec.env_s, 6),
                episode_setup_s=round(t.setup_s, 6),
            )
        )
        previous_end = rec.end
    return out


def write_trace(path: str | Path, trajectories: Iterable[Trajectory], *, append: bool = False) -> int:
    """Write trajectories' turns as JSONL (creating parent folders).

    Args:
        path: The ``.jsonl`` file.
        trajectories: What to write, one line per generated turn, in order.
        append: Add to an existing file instead of replacing it.

    Returns:
        The number of lines written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = 0
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for traj in trajectories:
            for turn in trace_turns(traj):
                f.write(turn.to_json() + "\n")
                lines += 1
    return lines


def iter_trace(path: str | Path) -> Iterator[TraceTurn]:
    """Read a trace lazily, line by line (blank lines skipped).

    Raises:
        TraceFormatError: A bad line; the message names the file and line number.
    """
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield TraceTurn.from_json(line)
            except (TraceFormatError, TypeError) as exc:
                raise TraceFormatError(f"{path}:{lineno}: {exc}") from None


def read_trace(path: str | Path) -> list[TraceTurn]:
    """Read a whole trace file into memory (see :func:`iter_trace`)."""
    return list(iter_trace(path))


def episode_prefix(turns: Sequence[TraceTurn]) -> tuple[int, ...]:
    """An episode's token sequence up to the end of its last traced turn.

    Args:
        turns: The episode's lines in turn order (0, 1, ...).

    Raises:
        ValueError: Turns are missing, out of order, or from several episodes.
    """
    ids: list[int] = []
    for i, t in enumerate(turns):
        if t.turn != i or t.episode_id != turns[0].episode_id:
            raise ValueError(
                f"expected turn {i} of episode {turns[0].episode_id!r}, got {t.episode_id!r} #{t.turn}"
            )
        ids.extend(t.new_prompt_ids)
        if len(ids) != t.prefix_len:
            raise ValueError(f"turn {i}: prefix has {len(ids)} tokens, the line says {t.prefix_len}")
        ids.extend(t.token_ids)
    return tuple(ids)


class _Inserts(Protocol):
    def insert(self, state_key: str, task_id: str, tokens: Sequence[int]) -> None: ...


def ingest_trace(cache: _Inserts, path: str | Path) -> int:
    """Insert every generated turn of a trace into a tree cache (warm it from an earlier run).

    Args:
        cache: A :class:`~srt_agent.tree_cache.TreeCache` (anything with its ``insert``).
        path: An ``srt-trace/1`` file.

    Returns:
        The number of turns inserted.

    Raises:
        TraceFormatError: A bad line (the message names file and line).
    """
    n = 0
    for turn in iter_trace(path):
        cache.insert(turn.state_key, turn.task_id, turn.token_ids)
        n += 1
    return n
