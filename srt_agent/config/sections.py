"""Run-config sections for what is trained and how it is rolled out: model, env, rollout, spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from srt_agent.config.base import Section
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.output.paths import default_model_dir
from srt_agent.rollout.config import RolloutConfig, RunAheadConfig  # light: pydantic only
from srt_agent.tree_cache import TreeCacheConfig

EVAL_SEED_END = 10_000_000
"""Evaluation seeds stay below this (``srt_agent.evaluation.runner.EVAL_SEED_END``; from here up
are the model builder's demonstration seeds)."""


class ModelSection(Section):
    """The policy's starting checkpoint (``model``)."""

    dir: Path = Field(
        default_factory=default_model_dir,
        description="HF-format model directory (default $SRT_AGENT_MODEL or runs/embedded-model).",
    )
    build_if_missing: bool = Field(
        default=True, description="Build `build_preset` into `dir` first if it holds no model."
    )
    # The names of srt_agent.recipe.build.PRESETS (a test keeps them equal): importing that module
    # here would pull torch into config parsing.
    build_preset: Literal[
        "embedded", "tool-choice", "retail", "retail-base", "retail-gpu", "reasoning-gym", "gpu", "gpu-0.5b"
    ] = Field(
        default="embedded",
        description="What `build_if_missing` builds: the embedded model, `tool-choice` (its Calculator "
        "warm start mixes tool-free demonstrations, so RL has tool use to learn; the quickstart's), "
        "`reasoning-gym` (the same lesson on reasoning-gym's basic_arithmetic; needs that extra), "
        "`retail` (Retail's conversations after a copying drill, finished on long ones; `retail-base`: "
        "before that stage), or `gpu`, `retail-gpu` and `gpu-0.5b` "
        "(GPU-sized builds, on a CUDA GPU).",
    )
    build_seed: int = Field(
        default=0,
        ge=0,
        description="The build's seed (a build is deterministic per seed and thread count). A preset's "
        "build the package ships is copied instead of built when this is its seed: tool-choice 0, "
        "retail 2.",
    )


class SeedRange(Section):
    """Env seeds ``start, start + 1, ..., stop - 1`` (each seed is one task).

    Subclasses set the defaults, so a partial override (``env.eval_seeds.stop=200``) keeps the
    other bound.
    """

    start: int = Field(ge=0, description="First seed.")
    stop: int = Field(ge=1, description="One past the last seed.")

    @model_validator(mode="after")
    def _not_empty(self) -> SeedRange:
        if self.stop <= self.start:
            raise ValueError(f"start ({self.start}) must be < stop ({self.stop})")
        return self

    def __len__(self) -> int:
        return self.stop - self.start

    def overlaps(self, other: SeedRange) -> bool:
        """Whether the two ranges share a seed."""
        return self.start < other.stop and other.start < self.stop


class TrainSeeds(SeedRange):
    """Training tasks: by default above the eval seeds and below the SFT demonstrations."""

    start: int = Field(default=1_000_000, ge=0, description="First seed.")
    stop: int = Field(default=EVAL_SEED_END, ge=1, description="One past the last seed.")


class EvalSeeds(SeedRange):
    """Held-out evaluation tasks (the small seeds ``srt-agent eval`` uses)."""

    start: int = Field(default=0, ge=0, description="First seed.")
    stop: int = Field(default=1_000, ge=1, description="One past the last seed.")


class EnvSection(Section):
    """The environment trained on (``env``)."""

    id: str = Field(default="srt/Calculator-v0", min_length=1, description="Registered env id.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Options for `make` (validated by the env's own config model)."
    )
    max_turns: int | None = Field(
        default=None, ge=1, description="Cap on assistant turns per episode, on top of the env's own limit."
    )
    isolation: Literal["thread", "process"] | None = Field(
        default=None,
        description="Where env code runs: thread (in the trainer's process), process (worker processes: an "
        "env that crashes, exits or hangs costs its episode only), or unset (the env's registered choice).",
    )
    train_seeds: TrainSeeds = Field(
        default_factory=TrainSeeds,
        description="Tasks drawn for training. Default: above the eval seeds, below the SFT demonstrations.",
    )
    eval_seeds: EvalSeeds = Field(
        default_factory=EvalSeeds,
        description=f"Held-out evaluation tasks (below {EVAL_SEED_END:,}, disjoint from train_seeds).",
    )
    oracle_prefix: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Reverse curriculum: each training task starts after the env's oracle has played a "
        "share of its solution's turns, drawn per task uniformly from "
        "[0, oracle_prefix x (1 - (step-1)/steps)] (the n samples of a task share it; the last steps "
        "start from the opening). Held-out evaluation always starts from the opening. Needs an env "
        "with an oracle (Retail, Calculator). 0: off.",
    )


class RolloutSection(RolloutConfig):
    """How each training step samples episodes (``rollout``): the scheduler's :class:`RolloutConfig`.

    Every sampling and scheduling option is the scheduler's own field (one declaration, one
    default, one bound); a step rolls out ``prompts_per_step`` tasks ``n`` times each, and the
    ``n`` samples of a task form the group that GRPO-style estimators compare. ``max_turns`` and
    ``seed`` come from ``env.max_turns`` and ``trainer.seed``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    prompts_per_step: int = Field(default=8, ge=1, description="Tasks (prompts) per training step.")
    n: int = Field(default=8, ge=1, le=1024, description="Samples per prompt (the group size).")

    @model_validator(mode="after")
    def _for_training(self) -> RolloutSection:
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 for training (got {self.temperature}): the policy gradient "
                "needs the sampling distribution; greedy rollouts are for `srt-agent eval --temperature 0`"
            )
        # Their values here are never used; a written-out config carries the defaults, which pass.
        for key, where, default in (
            ("max_turns", "env.max_turns", None),
            ("seed", "trainer.seed", 0),
            ("env_isolation", "env.isolation", None),
        ):
            if getattr(self, key) != default:
                raise ValueError(f"rollout.{key} is set by {where}; set it there")
        return self

    @property
    def episodes_per_step(self) -> int:
        """``prompts_per_step * n``."""
        return self.prompts_per_step * self.n

    def to_rollout_config(
        self,
        *,
        max_turns: int | None,
        seed: int | None,
        isolation: Literal["thread", "process"] | None = None,
    ) -> RolloutConfig:
        """The rollout scheduler's options for these settings.

        Args:
            max_turns: ``env.max_turns``.
            seed: Base of the sampling seeds (the trainer varies it per step).
            isolation: ``env.isolation``.
        """
        fields = set(RolloutConfig.model_fields) - {"max_turns", "seed", "env_isolation"}
        return RolloutConfig(
            **self.model_dump(include=fields), max_turns=max_turns, seed=seed, env_isolation=isolation
        )


class SpecSection(SpecConfig):
    """Speculative rollouts (``spec``): the engine's :class:`SpecConfig`, the tree cache, run-ahead.

    Inherits every engine option (``enabled``, ``max_draft_tokens`` = the draft budget, ...) with
    its default and validation, so the two cannot drift apart.
    """

    run_ahead: RunAheadConfig = Field(
        default_factory=RunAheadConfig,
        description="Fill idle batch rows (episodes waiting on tools) with work that only feeds the cache "
        "(`true`/`false`/`auto` is short for `{enabled: ...}`; auto: off on a CPU engine).",
    )
    cache: TreeCacheConfig = Field(
        default_factory=TreeCacheConfig, description="The tree cache (`cache.byte_budget` bounds its memory)."
    )

    @field_validator("run_ahead", mode="before")
    @classmethod
    def _run_ahead_shorthand(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) or value == "auto" else value
