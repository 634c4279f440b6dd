"""Options of the Ray backend (``ray`` in a run config): engine replicas and env workers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RayConfig"]


class RayConfig(BaseModel):
    """How rollouts spread over a Ray cluster (used when ``trainer.backend: ray``, ``--backend ray``).

    The learner stays in the driver. Each engine replica is a Ray actor with its own model and
    tree cache; env workers are actors that run the envs (and their tools), so a slow tool never
    holds up the driver.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(
        default=2, ge=1, description="Engine replicas (Ray actors), each with its own tree cache."
    )
    env_workers: int = Field(default=2, ge=0, description="Env worker actors (0: envs run in the driver).")
    routing: Literal["cache_aware", "round_robin"] = Field(
        default="cache_aware",
        description="cache_aware: a task's requests go to one replica, so its tree cache holds the task's "
        "history; round_robin: spread them (for comparison).",
    )
    address: str | None = Field(
        default=None, description="An existing cluster (ray://host:port or auto); null: start a local one."
    )
    num_cpus: int | None = Field(
        default=None,
        ge=1,
        description="CPUs of a local cluster (null: this machine's, and at least two runs' replicas: "
        "training with trainer.baseline_every keeps a second set with speculation off).",
    )
    replica_threads: int = Field(default=1, ge=1, description="Torch threads per replica.")
    replica_cpus: float = Field(
        default=1.0,
        ge=0,
        description="CPUs Ray reserves per replica (a scheduling figure, not a thread count).",
    )
    start_timeout_s: float = Field(default=600.0, gt=0, description="Most seconds for replicas to load.")
    max_retries: int = Field(default=3, ge=0, description="Tries of a request after its replica died.")
