"""Advantage estimators: GAE, GRPO, Dr.GRPO, RLOO, REINFORCE++ and REINFORCE++-baseline.

Conventions (shared by the whole learner):

* Tensors are padded to ``(B, T)``: ``B`` sequences (whole multi-turn episodes) by ``T`` token
  positions. ``mask`` is 1 on the tokens the policy sampled (a trajectory's ``loss_mask``) and 0 on
  the prompt, observation/tool tokens and padding.
* ``token_rewards`` ``(B, T)`` holds each reward on a generated token (see
  :func:`srt_agent.algo.rewards.token_rewards`): a turn's reward on that turn's last token. A
  reward on a masked position is an error: no action took it.
* A sequence's *score* (what outcome estimators compare) is the sum of its token rewards.
* Outputs are 0 wherever ``mask`` is 0.

Multi-turn sequences and masked positions. An episode's generated tokens are the agent's actions;
the observation tokens between turns are the environment's, not decisions. The token-level
recursions (GAE, discounted return-to-go) therefore run over the generated tokens only, in order:
the successor of a generated token is the next *generated* token of the same sequence, however
many observation tokens lie between. Observation tokens are skipped: they add no discount step,
no TD error, and their ``values`` are never read. The last generated token's successor is the end
of the episode (value 0; truncated episodes are not bootstrapped). Rewards therefore must sit on
generated tokens (checked), and with ``gamma < 1`` the discount counts generated tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from srt_agent.algo.groups import group_stats
from srt_agent.algo.masked import check_same_shape, masked_sum, masked_whiten

Estimator = Literal["gae", "grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
"""Names of the estimators :func:`compute_advantages` dispatches on (the config's ``algo.estimator``)."""

GROUP_ESTIMATORS: frozenset[Estimator] = frozenset({"grpo", "drgrpo", "rloo", "reinforce_pp_baseline"})
"""Estimators whose baseline comes from the other samples of the same prompt (need ``n >= 2``)."""


@dataclass(frozen=True)
class Advantages:
    """What an estimator returns.

    Attributes:
        advantages: ``(B, T)`` the advantage of every generated token (0 elsewhere); what the
            policy loss multiplies with the importance ratio.
        returns: ``(B, T)`` the unnormalised return of every generated token: the critic's target
            for GAE (``advantages + values`` before whitening), the discounted return-to-go for
            REINFORCE++, the sequence score for outcome estimators. For logging and the value loss.
    """

    advantages: Tensor
    returns: Tensor


def sequence_scores(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """Each sequence's score: the sum of its rewards on generated tokens.

    Args:
        token_rewards: ``(B, T)``.
        mask: ``(B, T)`` generated-token mask.

    Returns:
        ``(B,)``.
    """
    check_same_shape(token_rewards=token_rewards, mask=mask)
    return masked_sum(token_rewards, mask, dim=-1)


def to_tokens(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """Broadcast one value per sequence to every generated token of it.

    Args:
        per_sequence: ``(B,)``.
        mask: ``(B, T)``.

    Returns:
        ``(B, T)``, 0 where ``mask`` is 0.
    """
    return per_sequence.unsqueeze(-1) * mask.to(per_sequence.dtype)


def grpo_advantages(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO's group-normalised advantage ``(r - mean_group) / (std_group + eps)``.

    From DeepSeekMath (Shao et al., 2024, "outcome supervision" in section 4.1.2): every sample of
    a prompt gets its reward normalised by the mean and (unbiased) standard deviation of the
    rewards of that prompt's group. A group of one, or of equal rewards, gets 0.

    Args:
        scores: ``(B,)`` per-sequence rewards.
        group_ids: ``(B,)`` integer prompt group of each sequence.
        eps: Added to the standard deviation.

    Returns:
        ``(B,)`` advantages.
    """
    stats = group_stats(scores, group_ids)
    return (scores - stats.mean) / (stats.std + eps)


def drgrpo_advantages(scores: Tensor, group_ids: Tensor) -> Tensor:
    """Dr.GRPO's advantage ``r - mean_group`` (GRPO without the std division).

    Liu et al., 2025, "Understanding R1-Zero-Like Training: A Critical Perspective": dividing by
    the group's std over-weights prompts that are nearly always or nearly never solved (a
    question-difficulty bias). The paper's other fix, no per-sequence length normalisation, is on
    the loss side: aggregate with ``"seq-mean-token-sum-norm"``
    (:class:`srt_agent.algo.losses.Aggregation`).

    Args:
        scores: ``(B,)`` per-sequence rewards.
        group_ids: ``(B,)`` integer prompt group of each sequence.

    Returns:
        ``(B,)`` advantages.
    """
    return scores - group_stats(scores, group_ids).mean


def rloo_advantages(scores: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO's leave-one-out advantage ``r_i - mean_{j != i} r_j`` over the sample's group.

    Kool et al., 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al.,
    2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
    Feedback in LLMs". The baseline of each sample excludes the sample itself, so it is unbiased;
    computed as ``n / (n - 1) * (r_i - mean)``. Advantages sum to 0 within a group; a group of one
    has no other sample and gets 0.

    Args:
        scores: ``(B,)`` per-sequence rewards.
        group_ids: ``(B,)`` integer prompt group of each sequence.

    Returns:
        ``(B,)`` advantages.
    """
    stats = group_stats(scores, group_ids)
    scale = torch.where(stats.count > 1, stats.count / (stats.count - 1).clamp(min=1.0), 0.0)
    return scale * (scores - stats.mean)


def _check_rewards_on_mask(token_rewards: Tensor, mask: Tensor) -> None:
    stray = torch.where(mask.bool(), torch.zeros_like(token_rewards), token_rewards)
    if bool((stray != 0).any()):
        b, t = (int(i) for i in torch.nonzero(stray)[0])
        raise ValueError(
            f"token_rewards[{b}, {t}] = {float(token_rewards[b, t])} lies on a token the policy did not "
            "generate (mask 0); place rewards with srt_agent.algo.rewards.token_rewards"
        )


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Discounted return-to-go ``G_t = r_t + gamma * G_next`` over generated tokens only.

    ``next`` is the next generated token of the sequence (observation tokens are skipped; see the
    module docstring). With ``gamma = 1`` it is the sum of the rewards from ``t`` on.

    Args:
        token_rewards: ``(B, T)``, nonzero only where ``mask`` is 1.
        mask: ``(B, T)`` generated-token mask.
        gamma: Discount per generated token, in ``[0, 1]``.

    Returns:
        ``(B, T)`` returns, 0 where ``mask`` is 0.

    Raises:
        ValueError: Shapes differ, or a reward lies on a masked position.
    """
    check_same_shape(token_rewards=token_rewards, mask=mask)
    _check_rewards_on_mask(token_rewards, mask)
    on = mask.bool()
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])  # (B,) return from the next generated token on
    for t in reversed(range(token_rewards.shape[1])):
        g = token_rewards[:, t] + gamma * running
        running = torch.where(on[:, t], g, running)  # observation tokens leave it unchanged
        returns[:, t] = torch.where(on[:, t], g, 0.0)
    return returns


def gae(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = False,
) -> Advantages:
    """Generalized Advantage Estimation over generated tokens (Schulman et al., 2016).

    ``delta_t = r_t + gamma * V(next) - V(t)`` and ``A_t = delta_t + gamma * lam * A(next)``,
    where ``next`` is the next generated token of the sequence (observation tokens are skipped:
    see the module docstring) and ``V(next) = A(next) = 0`` after the last one. ``returns = A + V``
    is the critic's target (PPO, Schulman et al., 2017; the InstructGPT recipe).

    Args:
        token_rewards: ``(B, T)``, nonzero only where ``mask`` is 1.
        values: ``(B, T)`` the critic's ``V(t)``: the value of the state from which token ``t``
            was sampled (read at position ``t - 1``, the same shift as the logprobs). Values on
            masked positions are never read.
        mask: ``(B, T)`` generated-token mask.
        gamma: Discount per generated token.
        lam: GAE's bias/variance trade-off (0: one-step TD, 1: Monte Carlo).
        whiten: Whiten the advantages over the batch's generated tokens (as verl and OpenRLHF do
            for PPO); ``returns`` stay unwhitened.

    Returns:
        Advantages and returns, ``(B, T)`` each, 0 where ``mask`` is 0.

    Raises:
        ValueError: Shapes differ, or a reward lies on a masked position.
    """
    check_same_shape(token_rewards=token_rewards, values=values, mask=mask)
    _check_rewards_on_mask(token_rewards, mask)
    on = mask.bool()
    advantages = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])  # (B,) V of the next generated token
    next_adv = torch.zeros_like(next_value)  # (B,) A of the next generated token
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(on[:, t], adv, 0.0)
        next_value = torch.where(on[:, t], values[:, t], next_value)
        next_adv = torch.where(on[:, t], adv, next_adv)
    returns = torch.where(on, advantages + values, 0.0)
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return Advantages(advantages=advantages, returns=returns)


def reinforce_pp(token_rewards: Tensor, mask: Tensor, *, gamma: float = 1.0, eps: float = 1e-8) -> Advantages:
    """REINFORCE++: discounted return-to-go per token, whitened over the whole batch.

    Hu et al., 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models": no critic and no per-prompt baseline; the advantage of token ``t`` is
    ``G_t = sum_{k >= t} gamma^(k - t) r_k`` (the per-token KL penalty is usually part of ``r``,
    see :func:`srt_agent.algo.kl.kl_penalized_rewards`), normalised by the mean and std of ``G``
    over every generated token of the batch.

    Args:
        token_rewards: ``(B, T)``, nonzero only where ``mask`` is 1.
        mask: ``(B, T)`` generated-token mask.
        gamma: Discount per generated token.
        eps: Added to the batch std.

    Returns:
        Whitened advantages and the raw return-to-go, ``(B, T)`` each.
    """
    returns = discounted_returns(token_rewards, mask, gamma)
    return Advantages(advantages=masked_whiten(returns, mask, eps), returns=returns)


def reinforce_pp_baseline(
    token_rewards: Tensor, mask: Tensor, group_ids: Tensor, *, gamma: float = 1.0, eps: float = 1e-8
) -> Advantages:
    """REINFORCE++-baseline: subtract the group's mean score, then return-to-go and global whitening.

    Hu et al., 2025 (REINFORCE++, the "-baseline" variant; OpenRLHF ``reinforce_baseline``): the
    mean score of the prompt's group is subtracted from the reward on each sequence's last
    generated token, which with ``gamma = 1`` shifts every token's return by the same baseline;
    then :func:`reinforce_pp`. Whitening uses the global batch std, not the group's, which is what
    makes it more robust than GRPO to groups of near-equal rewards.

    Args:
        token_rewards: ``(B, T)``, nonzero only where ``mask`` is 1.
        mask: ``(B, T)`` generated-token mask.
        group_ids: ``(B,)`` integer prompt group of each sequence.
        gamma: Discount per generated token.
        eps: Added to the batch std.

    Returns:
        Whitened advantages and the baseline-subtracted return-to-go, ``(B, T)`` each.
    """
    baseline = group_stats(sequence_scores(token_rewards, mask), group_ids).mean  # (B,)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, -1).max(dim=-1).values  # (B,) -1: nothing generated
    has_tokens = last >= 0
    rows = torch.nonzero(has_tokens).squeeze(-1)
    shifted = token_rewards.clone()
    shifted[rows, last[rows]] -= baseline[rows]
    return reinforce_pp(shifted, mask, gamma=gamma, eps=eps)


def compute_advantages(
    estimator: Estimator,
    token_rewards: Tensor,
    mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    eps: float = 1e-6,
) -> Advantages:
    """Advantages by name, from token-level rewards (the trainer's single entry point).

    Outcome estimators (``grpo``, ``drgrpo``, ``rloo``) compare sequence scores
    (:func:`sequence_scores`) within groups and give every generated token of a sequence its
    sequence's advantage; ``gae`` (whitened) and the REINFORCE++ pair work per token.

    Args:
        estimator: One of :data:`Estimator`.
        token_rewards: ``(B, T)``, nonzero only where ``mask`` is 1.
        mask: ``(B, T)`` generated-token mask.
        group_ids: ``(B,)`` prompt group of each sequence; required by :data:`GROUP_ESTIMATORS`.
        values: ``(B, T)`` critic values; required by ``gae``.
        gamma: Discount (``gae`` and REINFORCE++).
        lam: GAE lambda.
        eps: Added to standard deviations.

    Returns:
        Advantages and returns, ``(B, T)`` each.

    Raises:
        ValueError: Unknown estimator, or a required input is missing.
    """
    if estimator not in get_args(Estimator):
        raise ValueError(f"unknown estimator {estimator!r}; choose from {', '.join(get_args(Estimator))}")
    if estimator in GROUP_ESTIMATORS and group_ids is None:
        raise ValueError(f"estimator {estimator!r} needs group_ids (which samples share a prompt)")
    if estimator == "gae":
        if values is None:
            raise ValueError("estimator 'gae' needs values from a critic")
        return gae(token_rewards, values, mask, gamma=gamma, lam=lam, whiten=True)
    if estimator == "reinforce_pp":
        return reinforce_pp(token_rewards, mask, gamma=gamma, eps=eps)
    assert group_ids is not None  # checked above for every remaining estimator
    if estimator == "reinforce_pp_baseline":
        return reinforce_pp_baseline(token_rewards, mask, group_ids, gamma=gamma, eps=eps)
    scores = sequence_scores(token_rewards, mask)
    if estimator == "grpo":
        per_seq = grpo_advantages(scores, group_ids, eps)
    elif estimator == "drgrpo":
        per_seq = drgrpo_advantages(scores, group_ids)
    else:
        per_seq = rloo_advantages(scores, group_ids)
    return Advantages(advantages=to_tokens(per_seq, mask), returns=to_tokens(scores, mask))


def scale_negative(advantages: Tensor, weight: float) -> Tensor:
    """Advantages with the negative ones multiplied by ``weight`` (positive ones unchanged).

    The policy gradient splits into positive sample reinforcement (raise the likelihood of
    better-than-baseline samples) and negative sample reinforcement (lower it for worse ones);
    Zhu et al. 2025 (arXiv 2506.01347) measure each alone. ``weight`` 0 keeps only the positive
    part, which concentrates the policy on what already succeeds (pass@1 up, entropy down); 1 is
    the estimator unchanged.

    Args:
        advantages: ``(B, T)`` advantages from :func:`compute_advantages`.
        weight: Factor in ``[0, 1]`` for the negative entries.

    Returns:
        ``(B, T)`` scaled advantages (a new tensor).

    Raises:
        ValueError: ``weight`` outside ``[0, 1]``.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"negative advantage weight must be in [0, 1], got {weight}")
    return torch.where(advantages < 0, advantages * weight, advantages)
