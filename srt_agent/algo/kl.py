"""KL divergence to a frozen reference policy: per-token estimators, as a reward penalty or a loss.

The KL of interest is ``KL(pi || pi_ref)`` estimated on tokens sampled from ``pi``, per token from
the log-ratio ``r = log pi_ref(x) - log pi(x)`` (Schulman, 2020, "Approximating KL Divergence",
http://joschu.net/blog/kl-approx.html):

* ``k1 = -r``: unbiased, high variance, can be negative per token. The classic per-token reward
  penalty (InstructGPT; REINFORCE++ uses it in the reward).
* ``k2 = r^2 / 2``: biased, low variance, >= 0; as a loss its gradient is that of the true
  reverse KL in expectation.
* ``k3 = exp(r) - 1 - r``: unbiased, low variance, >= 0. GRPO's KL loss term (DeepSeekMath, eq. 4).

Value versus gradient: as a *reward* penalty only the value matters (``k1`` and ``k3`` are
unbiased). As a *loss*, differentiated through ``log pi`` on samples from ``pi``, ``k2``'s expected
gradient is that of ``KL(pi || pi_ref)`` while ``k3``'s is that of the forward ``KL(pi_ref || pi)``:
both pull towards the reference, but only ``k2`` follows the reverse KL exactly.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from srt_agent.algo.losses import Aggregation
from srt_agent.algo.masked import check_same_shape

KLEstimator = Literal["k1", "k2", "k3"]
"""Per-token KL estimators (the config's ``algo.kl.estimator``)."""

KLMode = Literal["reward", "loss"]
"""Where the KL acts (the config's ``algo.kl.mode``): subtracted from the rewards before the
advantages (:func:`kl_penalized_rewards`), or added to the loss (:func:`kl_loss`)."""


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator = "k3") -> Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)``.

    Args:
        logprobs: ``(B, T)`` the policy's logprobs of the sampled tokens.
        ref_logprobs: ``(B, T)`` the reference policy's logprobs of the same tokens.
        estimator: ``k1``, ``k2`` or ``k3`` (module docstring).

    Returns:
        ``(B, T)``; mask it yourself (or use :func:`kl_loss` / :func:`kl_penalized_rewards`).

    Raises:
        ValueError: Shapes differ or the estimator is unknown.
    """
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    r = ref_logprobs - logprobs
    if estimator == "k1":
        return -r
    if estimator == "k2":
        return 0.5 * r**2
    if estimator == "k3":
        return torch.expm1(r) - r  # expm1: exact near r = 0, where most tokens are
    raise ValueError(f"unknown KL estimator {estimator!r}; choose from {', '.join(get_args(KLEstimator))}")


def kl_penalized_rewards(
    token_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    coef: float,
    estimator: KLEstimator = "k1",
) -> Tensor:
    """Rewards minus ``coef * KL`` on every generated token (the "reward" KL mode).

    Compute it before the advantages, with the rollout's logprobs (no gradient flows). With
    outcome estimators (GRPO, RLOO) the penalty enters each sequence's score as its sum; with GAE
    and REINFORCE++ each token carries its own penalty.

    Args:
        token_rewards: ``(B, T)``.
        logprobs: ``(B, T)`` the rollout's logprobs.
        ref_logprobs: ``(B, T)`` the reference policy's logprobs.
        mask: ``(B, T)`` generated-token mask (no penalty elsewhere).
        coef: KL coefficient (>= 0).
        estimator: Per-token estimator; ``k1`` is the classic choice here.

    Returns:
        ``(B, T)`` penalised rewards, without gradient.
    """
    check_same_shape(token_rewards=token_rewards, mask=mask)
    with torch.no_grad():
        kl = kl_estimate(logprobs, ref_logprobs, estimator)
        return token_rewards - coef * torch.where(mask.bool(), kl, 0.0)


def kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    estimator: KLEstimator = "k3",
    agg: Aggregation | None = None,
) -> Tensor:
    """The aggregated KL to the reference as a loss term (the "loss" KL mode; scale by the coef).

    Args:
        logprobs: ``(B, T)`` the current policy's logprobs (with gradient).
        ref_logprobs: ``(B, T)`` the reference policy's logprobs.
        mask: ``(B, T)`` generated-token mask.
        estimator: Per-token estimator; ``k3`` as in GRPO.
        agg: Aggregation, the same as the policy loss's; default token-mean.

    Returns:
        A scalar (>= 0 for ``k2`` and ``k3``).
    """
    return (agg or Aggregation())(kl_estimate(logprobs, ref_logprobs, estimator), mask)
