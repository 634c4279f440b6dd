"""``RunConfig``: every section of a training run, and the checks that span sections."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml
from pydantic import Field, model_validator

from srt_agent.config.algo import AlgoSection
from srt_agent.config.base import Section
from srt_agent.config.sections import EVAL_SEED_END, EnvSection, ModelSection, RolloutSection, SpecSection
from srt_agent.config.training import OptimSection, TrainerSection
from srt_agent.distributed.ray_config import RayConfig
from srt_agent.serving.engine_config import EngineConfig

if TYPE_CHECKING:
    from srt_agent.rollout.config import RolloutConfig


class RunConfig(Section):
    """A whole ``srt-agent train`` run. Load it with :func:`srt_agent.config.load_config`."""

    model: ModelSection = Field(default_factory=ModelSection, description="The starting checkpoint.")
    env: EnvSection = Field(default_factory=EnvSection, description="The environment and its task seeds.")
    rollout: RolloutSection = Field(default_factory=RolloutSection, description="Sampling per step.")
    spec: SpecSection = Field(default_factory=SpecSection, description="Speculative rollouts (SRT).")
    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="The rollout engine: in-process (torch) or a server."
    )
    ray: RayConfig = Field(
        default_factory=RayConfig, description="Replicas and env workers of trainer.backend = ray."
    )
    algo: AlgoSection = Field(default_factory=AlgoSection, description="Estimator and losses.")
    optim: OptimSection = Field(default_factory=OptimSection, description="Optimizer.")
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="The loop.")

    @property
    def eval_temperature(self) -> float:
        """Held-out evaluations sample at ``trainer.eval_temperature``, else at ``rollout.temperature``."""
        t = self.trainer.eval_temperature
        return self.rollout.temperature if t is None else t

    @model_validator(mode="after")
    def _sections_agree(self) -> RunConfig:
        problems = []
        algo, rollout, env = self.algo, self.rollout, self.env
        if algo.uses_groups and rollout.n < 2:
            problems.append(
                f"rollout.n = {rollout.n}: algo.estimator {algo.estimator!r} compares the samples of "
                "a prompt, so it needs rollout.n >= 2"
            )
        if algo.dynamic_sampling.enabled and rollout.n < 2:
            problems.append(f"rollout.n = {rollout.n}: algo.dynamic_sampling needs rollout.n >= 2")
        if algo.overlong.enabled and algo.overlong.buffer_tokens > rollout.max_new_tokens:
            problems.append(
                f"algo.overlong.buffer_tokens = {algo.overlong.buffer_tokens}: must be <= "
                f"rollout.max_new_tokens ({rollout.max_new_tokens})"
            )
        if env.eval_seeds.stop > EVAL_SEED_END:
            problems.append(
                f"env.eval_seeds.stop = {env.eval_seeds.stop}: must be <= {EVAL_SEED_END} "
                "(higher seeds are the model builder's demonstrations)"
            )
        if env.train_seeds.overlaps(env.eval_seeds):
            problems.append(
                f"env.train_seeds = [{env.train_seeds.start}, {env.train_seeds.stop}): overlaps "
                f"env.eval_seeds [{env.eval_seeds.start}, {env.eval_seeds.stop}); held-out tasks must not be "
                "trained on"
            )
        if self.trainer.eval_episodes > len(env.eval_seeds):
            problems.append(
                f"trainer.eval_episodes = {self.trainer.eval_episodes}: must be <= the {len(env.eval_seeds)} "
                "tasks of env.eval_seeds"
            )
        if self.trainer.backend == "ray" and self.engine.kind != "torch":
            problems.append("trainer.backend = 'ray' runs torch engine replicas; set engine.kind = 'torch'")
        if self.engine.kind == "sglang" and self.trainer.baseline_every:
            problems.append(
                f"trainer.baseline_every = {self.trainer.baseline_every}: the baseline rolls out with "
                "speculation off in this process, which engine.kind = 'sglang' has no model for; set it to 0"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def loss_norm_tokens(self) -> int:
        """The constant of ``seq-mean-token-sum-norm``: ``algo.norm_tokens`` or ``rollout.max_new_tokens``."""
        return self.algo.norm_tokens or self.rollout.max_new_tokens

    def rollout_config(self, seed: int | None = None) -> RolloutConfig:
        """The rollout scheduler's options (``seed`` defaults to ``trainer.seed``)."""
        return self.rollout.to_rollout_config(
            max_turns=self.env.max_turns,
            seed=self.trainer.seed if seed is None else seed,
            isolation=self.env.isolation,
        )

    def flat(self) -> dict[str, Any]:
        """Every setting as ``{"dotted.key": value}`` (JSON-safe values; lists stay lists), for logging."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict) and value:
                for key, item in value.items():
                    walk(f"{prefix}.{key}" if prefix else str(key), item)
            else:
                out[prefix] = value

        walk("", self.model_dump(mode="json"))
        return out

    def to_yaml(self) -> str:
        """The full config as YAML that :func:`srt_agent.config.load_config` reads back equal."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
