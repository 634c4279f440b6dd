"""What to roll out (:class:`EpisodeRequest`) and how (:class:`RolloutConfig`, :class:`RunAheadConfig`).

Light on purpose (pydantic only): the run config composes these models, and parsing a config must
not import torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from srt_agent.contracts.generation import SamplingParams


class RolloutConfig(BaseModel):
    """Options of the rollout scheduler (the ``rollout`` section of a run config).

    Sampling options apply to every request; the stop tokens come from the chat format.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrent: int = Field(
        default=64,
        ge=1,
        description="Episodes in flight at once (each holds an env and at most one request).",
    )
    max_turns: int | None = Field(
        default=None, ge=1, description="Rollout-level cap on assistant turns, on top of the env's own limit."
    )
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    top_k: int = Field(default=0, ge=0, description="Keep only the k most likely tokens (0 disables).")
    max_new_tokens: int = Field(default=256, ge=1, description="Most tokens per assistant turn.")
    min_room_tokens: int = Field(
        default=16,
        ge=1,
        description="A turn starts only if this many tokens (or max_new_tokens, if smaller) still fit "
        "in the engine's context; otherwise the episode is truncated.",
    )
    seed: int | None = Field(
        default=0,
        description="Base of the per-request sampling seeds (None: the engine's own RNG, not reproducible).",
    )
    env_step_timeout_s: float | None = Field(
        default=60.0,
        gt=0,
        description="Seconds an env's step (its tool calls included, each under its own timeout) or close "
        "may take before its episode fails with the reason; the batch goes on (None: no limit).",
    )
    env_setup_timeout_s: float | None = Field(
        default=300.0,
        gt=0,
        description="Seconds an env's make or reset may take (they may download or build; None: no limit).",
    )
    env_isolation: Literal["thread", "process"] | None = Field(
        default=None,
        description="Where env code runs: thread (in this process, a thread per call), process (a pool of "
        "worker processes: a crash, exit or hang costs its episode only), or None (each env's registered "
        "choice; thread unless it registered process).",
    )
    constrain_tool_calls: bool = Field(
        default=False,
        description="Decode every <tool_call> block under the grammar of the env's tools (a known tool, its "
        "parameters, values of their types), as structured-output decoding does; logprobs are those of the "
        "constrained distribution, and training scores that distribution too. In-process engine only.",
    )
    copy_tool_arguments: bool = Field(
        default=False,
        description="With constrain_tool_calls: a string argument without an enum must be a word or a "
        "quoted string of the conversation before the turn (outside the policy's own turns): ids, names "
        "and e-mails are copied, never invented. The turn's grammar, and so its logprobs, depend on its "
        "prompt; training scores the same masked distribution.",
    )
    max_observation_chars: int = Field(
        default=32_000,
        ge=256,
        description="Longest message an env may return to the model; longer ones are cut with a note.",
    )

    @model_validator(mode="after")
    def _copy_needs_constraint(self) -> RolloutConfig:
        if self.copy_tool_arguments and not self.constrain_tool_calls:
            raise ValueError(
                "copy_tool_arguments=true constrains the values of tool calls, which only constrained "
                "calls have: set constrain_tool_calls=true as well (or copy_tool_arguments=false)"
            )
        return self

    @property
    def turn_room(self) -> int:
        """Tokens that must still fit in the context for a turn to start."""
        return min(self.min_room_tokens, self.max_new_tokens)

    def turn_sampling(
        self, *, prompt_len: int, max_context: int, stop_token_ids: tuple[int, ...], seed: int | None
    ) -> SamplingParams | None:
        """The sampling parameters of a turn after ``prompt_len`` tokens, or ``None`` if none fits.

        ``max_new_tokens`` is clamped to the context left; ``None`` means less than
        :attr:`turn_room` is left.
        """
        from srt_agent.contracts.generation import SamplingParams  # torch: imported when rolling out

        room = max_context - prompt_len
        if room < self.turn_room:
            return None
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=min(self.max_new_tokens, room),
            stop_token_ids=stop_token_ids,
            seed=seed,
        )


class RunAheadConfig(BaseModel):
    """Options of run-ahead generation (``spec.run_ahead`` in a run config).

    In a run config, ``true`` / ``false`` / ``auto`` is short for ``{enabled: ...}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool | Literal["auto"] = Field(
        default="auto",
        description="Generate ahead into the tree cache while episodes wait: true, false, or auto (on "
        "where the engine runs on a GPU or is a server, off on a CPU engine: there a batched forward's "
        "cost grows with its rows, so the rows run-ahead fills are not free).",
    )
    max_in_flight: int = Field(
        default=8, ge=1, description="Most run-ahead requests on the engine at once (each holds a row)."
    )
    capacity: int | None = Field(
        default=None,
        ge=1,
        description="Engine rows shared by live and run-ahead requests; run-ahead only uses rows live "
        "requests leave free. Default: the rollout's max_concurrent.",
    )
    announce_samples: int = Field(
        default=1, ge=1, le=64, description="Run-ahead continuations per announced first-turn state."
    )
    predict_tools: bool = Field(
        default=True, description="Run ahead of post-tool states whose tool results the memo knows."
    )
    max_queue: int = Field(default=4096, ge=1, description="Most queued jobs; the oldest are dropped.")

    def runs_on(self, engine: object) -> bool:
        """Whether run-ahead is on with ``engine``: ``enabled``, with ``auto`` resolved by its device.

        ``auto`` is off only for an engine whose ``device`` is a CPU. Measured on 2 cores (see
        ``docs/results.md``): SRT with run-ahead 0.89-0.93x of plain decoding, without it
        0.97-1.01x. An engine without a ``device`` (a server's client) is taken as a GPU.
        """
        return self.runs_on_device(getattr(engine, "device", None))

    def runs_on_device(self, device: object) -> bool:
        """:meth:`runs_on` for an engine on ``device`` (a torch device or its name; ``None``: a server)."""
        if self.enabled != "auto":
            return bool(self.enabled)
        return device is None or str(device).split(":")[0] != "cpu"


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to roll out.

    Attributes:
        env_id: A registered env id (made with :func:`srt_agent.env.registration.make`).
        seed: The env seed for ``reset`` (same seed, same task).
        trial: Repeat number of the same task (varies the sampling seeds, not the task).
        episode_id: Unique id in the batch; default ``"<env_id>/<seed>/<trial>"``.
        env_options: Options for ``make`` (validated by the env's config model).
        reset_options: ``options`` for ``reset``.
    """

    env_id: str
    seed: int | None = None
    trial: int = 0
    episode_id: str = ""
    env_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    reset_options: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if not self.episode_id:
            object.__setattr__(self, "episode_id", f"{self.env_id}/{self.seed}/{self.trial}")


def sampling_seed(base: int, episode_id: str, turn: int) -> int:
    """The sampling seed of one request, derived from the run's base seed, the episode and the turn.

    A hash rather than ``base + counter``: it does not depend on the order episodes run in (that
    varies with concurrency), nearby bases do not share seeds, and it stays in ``[0, 2**63)`` so
    every engine's generator accepts it.
    """
    digest = hashlib.blake2b(f"{base}\x00{episode_id}\x00{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
