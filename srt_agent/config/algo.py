"""The ``algo`` section: advantage estimator, PPO/DAPO loss options, KL, entropy, critic.

The name types here mirror those of :mod:`srt_agent.algo` (a test keeps them equal) so that
loading a config does not import torch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from srt_agent.config.base import Section

Estimator = Literal["gae", "grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
GROUP_ESTIMATORS = frozenset({"grpo", "drgrpo", "rloo", "reinforce_pp_baseline"})
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3"]
KLMode = Literal["reward", "loss"]
RewardPlacement = Literal["turn", "final"]


class KLSection(Section):
    """KL to the frozen starting policy (``algo.kl``); off when ``coef`` is 0."""

    coef: float = Field(
        default=0.0, ge=0.0, le=10.0, description="KL coefficient (0 disables the reference)."
    )
    estimator: KLEstimator = Field(
        default="k3", description="Per-token estimator: k1 (classic reward penalty), k2, k3 (GRPO's loss)."
    )
    mode: KLMode = Field(
        default="loss", description="`reward`: subtracted from token rewards; `loss`: added to the loss."
    )


class OverlongSection(Section):
    """DAPO's soft overlong penalty on turns that approach ``rollout.max_new_tokens`` (``algo.overlong``)."""

    enabled: bool = Field(
        default=False, description="Penalise turns in the last `buffer_tokens` of the limit."
    )
    buffer_tokens: int = Field(default=64, ge=1, description="L_cache: the soft zone before the limit.")
    factor: float = Field(default=1.0, ge=0.0, le=10.0, description="The full penalty (at the limit).")


class DynamicSamplingSection(Section):
    """DAPO's dynamic sampling (``algo.dynamic_sampling``): drop groups whose rewards are all equal."""

    enabled: bool = Field(default=False, description="Drop zero-variance groups and roll out more prompts.")
    max_rounds: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Most rollout rounds per step to refill the batch (then train on less).",
    )


class AlgoSection(Section):
    """The RL algorithm (``algo``).

    ``loss_agg`` defaults to the estimator's paper: ``seq-mean-token-sum-norm`` for ``drgrpo``
    (Dr.GRPO), ``token-mean`` (DAPO) otherwise.
    """

    estimator: Estimator = Field(default="grpo", description="Advantage estimator.")
    reward_placement: RewardPlacement = Field(
        default="turn",
        description="`turn`: each turn's reward on its last token; `final`: the episode total on the last.",
    )
    gamma: float = Field(
        default=1.0, ge=0.0, le=1.0, description="Discount per generated token (gae, reinforce_pp)."
    )
    lam: float = Field(default=0.95, ge=0.0, le=1.0, description="GAE lambda.")
    clip_low: float = Field(default=0.2, ge=0.0, lt=1.0, description="PPO clip below: ratio >= 1 - clip_low.")
    clip_high: float = Field(
        default=0.2, ge=0.0, le=10.0, description="PPO clip above: ratio <= 1 + clip_high (DAPO: 0.28)."
    )
    dual_clip: float | None = Field(
        default=None, gt=1.0, description="Dual-clip constant c > 1 for negative advantages (null: off)."
    )
    loss_agg: LossAgg = Field(default="token-mean", description="How per-token losses become one scalar.")
    norm_tokens: int | None = Field(
        default=None, ge=1, description="Constant of seq-mean-token-sum-norm (null: rollout.max_new_tokens)."
    )
    negative_weight: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Scale of negative advantages: 1 = the estimator as published; 0 learns from "
        "better-than-baseline samples only (positive sample reinforcement: sharpens the policy).",
    )
    epochs: int = Field(default=1, ge=1, le=100, description="Passes over each step's rollouts.")
    mini_batches: int = Field(default=1, ge=1, description="Optimizer updates per pass (the batch is split).")
    kl: KLSection = Field(default_factory=KLSection, description="KL to the reference policy.")
    entropy_coef: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Entropy bonus weight (0: log only)."
    )
    format_penalty: float = Field(
        default=0.0,
        ge=0.0,
        le=10.0,
        description="Subtracted from the reward of each garbled assistant turn (neither a well-formed "
        "tool call nor plain text); 0: off. Gives all-failed groups a signal to keep turns readable.",
    )
    dynamic_sampling: DynamicSamplingSection = Field(default_factory=DynamicSamplingSection)
    overlong: OverlongSection = Field(default_factory=OverlongSection)
    vf_coef: float = Field(default=0.5, ge=0.0, le=100.0, description="Value-loss weight (gae only).")
    value_clip: float | None = Field(
        default=0.2, ge=0.0, description="Value clip range around the rollout-time values (null: unclipped)."
    )

    @model_validator(mode="before")
    @classmethod
    def _paper_loss_agg(cls, data: Any) -> Any:
        if isinstance(data, dict) and "loss_agg" not in data:
            agg = "seq-mean-token-sum-norm" if data.get("estimator") == "drgrpo" else "token-mean"
            return {**data, "loss_agg": agg}
        return data

    @property
    def uses_groups(self) -> bool:
        """Whether the estimator's baseline comes from the other samples of a prompt."""
        return self.estimator in GROUP_ESTIMATORS

    @property
    def uses_critic(self) -> bool:
        """Whether the estimator needs a value model (``gae``)."""
        return self.estimator == "gae"
