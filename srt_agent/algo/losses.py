"""Policy and value losses: PPO's clipped surrogate (DAPO options, dual-clip), the clipped value loss.

:class:`Aggregation` turns per-token losses into one scalar.

All inputs are token-aligned ``(B, T)`` tensors (see :mod:`srt_agent.algo.advantages`): position
``t`` holds quantities of token ``t``, and ``mask`` is 1 on the tokens the policy generated.
Losses are to be minimised; stats are plain floats for logging.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from srt_agent.algo.masked import check_same_shape, masked_mean, masked_sum

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""How per-token losses become one scalar (the config's ``algo.loss_agg``); see :class:`Aggregation`."""


@dataclass(frozen=True)
class Aggregation:
    """How per-token losses become one scalar.

    Modes (``l`` = per-token loss, ``|o_i|`` = generated tokens of sequence ``i``, ``N`` =
    sequences with at least one generated token):

    * ``"token-mean"``: ``sum_i sum_t l / sum_i |o_i|``. Every token weighs the same, so long
      answers are not down-weighted (DAPO, Yu et al., 2025, "token-level policy gradient loss").
    * ``"seq-mean-token-mean"``: ``1/N sum_i (1/|o_i|) sum_t l``. GRPO as written in DeepSeekMath:
      each sequence weighs the same, so a token of a short sequence weighs more (the length bias
      Dr.GRPO points out).
    * ``"seq-mean-token-sum-norm"``: ``1/N sum_i (sum_t l) / norm_tokens`` with a constant
      ``norm_tokens`` (e.g. the generation budget). Dr.GRPO (Liu et al., 2025): no length
      normalisation at all, the constant only sets the scale.

    Gradient accumulation. A mini-batch split into micro-batches gives exactly the mini-batch's
    loss when each micro-batch divides by the mini-batch's totals: pass ``total_tokens`` (the
    mini-batch's generated tokens, for ``token-mean``) and ``total_seqs`` (its sequences with any
    generated token, for the ``seq-mean`` modes) and sum the micro-batch losses' gradients.

    Attributes:
        mode: One of :data:`LossAgg`.
        norm_tokens: The constant of ``seq-mean-token-sum-norm`` (required there).
        total_tokens: Denominator of ``token-mean``; ``None`` counts this call's tokens.
        total_seqs: Denominator of the ``seq-mean`` modes; ``None`` counts this call's sequences.
    """

    mode: LossAgg = "token-mean"
    norm_tokens: int | None = None
    total_tokens: float | None = None
    total_seqs: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in get_args(LossAgg):
            raise ValueError(
                f"unknown loss aggregation {self.mode!r}; choose from {', '.join(get_args(LossAgg))}"
            )
        if self.mode == "seq-mean-token-sum-norm" and (self.norm_tokens is None or self.norm_tokens < 1):
            raise ValueError(f"'seq-mean-token-sum-norm' needs norm_tokens >= 1, got {self.norm_tokens}")

    def __call__(self, values: Tensor, mask: Tensor) -> Tensor:
        """Aggregate per-token ``values`` ``(B, T)`` over ``mask`` ``(B, T)`` into a scalar.

        Returns 0 (not NaN) when nothing is unmasked.
        """
        check_same_shape(values=values, mask=mask)
        if self.mode == "token-mean":
            denom = (
                self.total_tokens
                if self.total_tokens is not None
                else masked_sum(torch.ones_like(values), mask)
            )
            return masked_sum(values, mask) / max(float(denom), 1.0)
        seqs = (mask.sum(dim=-1) > 0).to(values.dtype)  # (B,) sequences with a generated token
        num = self.total_seqs if self.total_seqs is not None else float(seqs.sum())
        if self.mode == "seq-mean-token-mean":
            per_seq = masked_mean(values, mask, dim=-1)  # (B,)
        else:
            assert self.norm_tokens is not None  # checked in __post_init__
            per_seq = masked_sum(values, mask, dim=-1) / self.norm_tokens
        return (per_seq * seqs).sum() / max(num, 1.0)


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one policy-loss call (means over generated tokens).

    Attributes:
        clip_frac: Fraction of tokens whose clipped term was the active one (no gradient).
        clip_frac_low: Of those, advantage < 0 and ratio below ``1 - clip_low``.
        clip_frac_high: Of those, advantage > 0 and ratio above ``1 + clip_high``.
        dual_clip_frac: Fraction of tokens capped by the dual clip.
        approx_kl: KL(old || new) estimated with k3 (``exp(r) - 1 - r``, ``r = new - old``),
            always >= 0.
        ratio_mean: Mean importance ratio ``new / old``.
        ratio_max: Largest importance ratio.
    """

    clip_frac: float
    clip_frac_low: float
    clip_frac_high: float
    dual_clip_frac: float
    approx_kl: float
    ratio_mean: float
    ratio_max: float

    def as_dict(self, prefix: str = "policy/") -> dict[str, float]:
        """The stats as a flat dict for logging, keys prefixed."""
        return {prefix + k: v for k, v in asdict(self).items()}


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: Aggregation | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """PPO's clipped surrogate loss, with DAPO's clip-higher and optional dual-clip.

    Per token, with ``ratio = exp(logprobs - old_logprobs)`` (PPO, Schulman et al., 2017)::

        loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))

    ``clip_high > clip_low`` is DAPO's "clip-higher" (Yu et al., 2025): low-probability tokens
    with positive advantage may grow further before the clip stops them, which keeps entropy from
    collapsing. ``dual_clip = c > 1`` (Ye et al., 2020, "Mastering Complex Control in MOBA Games
    with Deep Reinforcement Learning") also caps the loss of negative-advantage tokens at
    ``-A * c``, so a token whose ratio exploded cannot dominate the batch.

    ``old_logprobs`` are the rollout's sampling logprobs (``Trajectory.logprobs``); the ratio is
    then also the correction for any mismatch between the engine and the trainer's forward.

    Args:
        logprobs: ``(B, T)`` the current policy's logprobs of the tokens (with gradient).
        old_logprobs: ``(B, T)`` the rollout's logprobs.
        advantages: ``(B, T)``.
        mask: ``(B, T)`` generated-token mask.
        clip_low: Lower clip range (ratio >= 1 - clip_low), in ``[0, 1)``.
        clip_high: Upper clip range (ratio <= 1 + clip_high), >= 0.
        dual_clip: Dual-clip constant ``c > 1``, or ``None`` for none.
        agg: How to aggregate; default token-mean.

    Returns:
        The scalar loss and its :class:`PolicyLossStats`.

    Raises:
        ValueError: Shapes differ, or a clip parameter is out of range.
    """
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low} and {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    agg = agg or Aggregation()
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    is_dual = torch.zeros_like(is_clipped)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        is_dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    with torch.no_grad():
        m = mask.to(logprobs.dtype)
        stats = PolicyLossStats(
            clip_frac=float(masked_mean(is_clipped.to(m.dtype), m)),
            clip_frac_low=float(masked_mean((is_clipped & (advantages < 0)).to(m.dtype), m)),
            clip_frac_high=float(masked_mean((is_clipped & (advantages > 0)).to(m.dtype), m)),
            dual_clip_frac=float(masked_mean(is_dual.to(m.dtype), m)),
            approx_kl=float(masked_mean(torch.expm1(log_ratio) - log_ratio, m)),
            ratio_mean=float(masked_mean(ratio, m)),
            ratio_max=float(torch.where(m.bool(), ratio, 0.0).max()) if m.numel() else 0.0,
        )
    return agg(loss, mask), stats


@dataclass(frozen=True)
class ValueLossStats:
    """Diagnostics of one value-loss call (means over generated tokens).

    Attributes:
        clip_frac: Fraction of tokens where the clipped error was the larger (active) one.
        value_mean: Mean predicted value.
        explained_variance: ``1 - Var(returns - values) / Var(returns)`` (1 is perfect, <= 0 is
            no better than a constant).
    """

    clip_frac: float
    value_mean: float
    explained_variance: float

    def as_dict(self, prefix: str = "value/") -> dict[str, float]:
        """The stats as a flat dict for logging, keys prefixed."""
        return {prefix + k: v for k, v in asdict(self).items()}


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg: Aggregation | None = None,
) -> tuple[Tensor, ValueLossStats]:
    """PPO's clipped value loss ``0.5 * max((V - R)^2, (V_clip - R)^2)``.

    ``V_clip = V_old + clip(V - V_old, -clip, clip)`` keeps the critic near the values the
    advantages were computed with (PPO2 in OpenAI Baselines; kept by verl and OpenRLHF).

    Args:
        values: ``(B, T)`` the critic's current values (with gradient).
        old_values: ``(B, T)`` the values at rollout time (used for GAE).
        returns: ``(B, T)`` targets (:attr:`srt_agent.algo.advantages.Advantages.returns`).
        mask: ``(B, T)`` generated-token mask.
        clip: Clip range in value units; ``None`` for the plain squared error.
        agg: How to aggregate; default token-mean.

    Returns:
        The scalar loss and its :class:`ValueLossStats`.

    Raises:
        ValueError: Shapes differ or ``clip`` is negative.
    """
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    if clip is not None and clip < 0:
        raise ValueError(f"value clip must be >= 0 (or None), got {clip}")
    agg = agg or Aggregation()
    err = (values - returns) ** 2
    if clip is None:
        loss = 0.5 * err
        is_clipped = torch.zeros_like(err, dtype=torch.bool)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        err_clipped = (clipped_values - returns) ** 2
        loss = 0.5 * torch.maximum(err, err_clipped)
        is_clipped = err_clipped > err
    with torch.no_grad():
        m = mask.to(values.dtype)
        residual_var = masked_mean((returns - values) ** 2, m) - masked_mean(returns - values, m) ** 2
        returns_var = masked_mean(returns**2, m) - masked_mean(returns, m) ** 2
        stats = ValueLossStats(
            clip_frac=float(masked_mean(is_clipped.to(m.dtype), m)),
            value_mean=float(masked_mean(values, m)),
            explained_variance=float(1.0 - residual_var / returns_var) if float(returns_var) > 0 else 0.0,
        )
    return agg(loss, mask), stats
