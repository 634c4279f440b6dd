"""The ``optim`` and ``trainer`` sections: optimizer, schedule, batching, and the run's loop."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from srt_agent.config.base import Section

Schedule = Literal["constant", "linear", "cosine"]
LogBackend = Literal["jsonl", "tensorboard"]
Device = Literal["auto", "cpu", "cuda"]


class OptimSection(Section):
    """AdamW and its schedule (``optim``)."""

    lr: float = Field(default=1e-5, gt=0.0, le=1.0, description="Peak learning rate of the policy.")
    critic_lr: float | None = Field(
        default=None, gt=0.0, le=1.0, description="Learning rate of the critic (gae; null: same as lr)."
    )
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas, each in [0, 1).")
    eps: float = Field(
        default=1e-8,
        gt=0.0,
        le=1.0,
        description=(
            "AdamW epsilon. Raise it (e.g. 1e-5) when gradients are tiny and noisy, as in RL on a small "
            "model: below it, a coordinate's update shrinks in proportion to its gradient instead of "
            "taking a full lr-sized step."
        ),
    )
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW decoupled weight decay.")
    warmup_steps: int = Field(default=0, ge=0, description="Optimizer updates of linear warmup from 0.")
    schedule: Schedule = Field(default="constant", description="Learning-rate decay after warmup.")
    min_lr_ratio: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Where linear/cosine decay ends, as a fraction of lr."
    )
    grad_clip: float | None = Field(
        default=1.0, gt=0.0, description="Clip the global gradient norm to this (null: no clipping)."
    )
    micro_batch_tokens: int = Field(
        default=8192,
        ge=1,
        description="Tokens (padding included) per forward/backward; gradients accumulate across them.",
    )
    bf16: bool = Field(default=True, description="bfloat16 autocast on CUDA (CPU always runs float32).")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"each beta must be in [0, 1), got {list(value)}")
        return value


class TrainerSection(Section):
    """The training loop (``trainer``)."""

    steps: int = Field(default=100, ge=1, description="Training steps (one rollout batch each).")
    eval_every: int = Field(
        default=10, ge=0, description="Evaluate every this many steps (0: only at the end)."
    )
    time_limit_s: float | None = Field(
        default=None,
        gt=0,
        description="Stop starting new steps once the run has trained this long (seconds, from the first "
        "step), then evaluate and checkpoint as after the last step (null: no limit).",
    )
    eval_episodes: int = Field(default=64, ge=1, description="Tasks per evaluation, from env.eval_seeds.")
    eval_temperature: float | None = Field(
        default=None,
        ge=0,
        description="Sampling temperature of held-out evaluations (0: greedy, as benchmarks like "
        "tau-bench score agents; null: rollout.temperature).",
    )
    checkpoint_every: int = Field(
        default=50,
        ge=0,
        description="Checkpoint every this many steps and after the last (0: only after the last). "
        "`--resume` after a crash redoes at most the steps since the last checkpoint.",
    )
    out_dir: Path = Field(
        default=Path("runs/train"), description="Where logs, checkpoints and the config go."
    )
    backend: Literal["local", "ray"] = Field(
        default="local",
        description="local: one process; ray: engine replicas and env workers as Ray actors (see `ray`), "
        "the learner in the driver.",
    )
    baseline_every: int = Field(
        default=0,
        ge=0,
        description="Every this many steps also roll out the step's prompts with speculation off (same "
        "seeds, not trained on) and log srt_speedup = off time / on time (0: never).",
    )
    seed: int = Field(default=0, ge=0, description="Seed of task order, sampling and initialisation.")
    threads: int | None = Field(
        default=None, ge=1, description="torch CPU threads for the whole run (null: torch's default)."
    )
    log: tuple[LogBackend, ...] = Field(default=("jsonl",), description="Metric sinks: jsonl, tensorboard.")
    device: Device = Field(default="auto", description="auto: CUDA if available, else CPU.")

    @field_validator("log")
    @classmethod
    def _no_duplicates(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(value))
