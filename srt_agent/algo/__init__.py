"""The learner's math: advantages, losses, KL, rewards on tokens, and batching of trajectories.

Pure functions over token-aligned, right-padded ``(B, T)`` tensors (``B`` whole multi-turn
episodes, ``T`` token positions; position ``t`` describes token ``t``) with a generated-token mask.
A training step, in order::

    batch = collate(trajectories)                                   # TokenBatch
    rewards = token_rewards(trajectories, length=T)                 # (B, T)
    rewards = kl_penalized_rewards(rewards, batch.logprobs, ref_lp, batch.loss_mask, coef)  # kl.mode=reward
    adv = compute_advantages("grpo", rewards, batch.loss_mask, group_ids=batch.group_ids)
    logprobs = token_logprobs(model(batch.token_ids).logits, batch.token_ids, temperature)
    loss, stats = policy_loss(logprobs, batch.logprobs, adv.advantages, batch.loss_mask,
                              clip_low=0.2, clip_high=0.28, agg=Aggregation("token-mean"))
"""

from srt_agent.algo.advantages import (
    GROUP_ESTIMATORS,
    Advantages,
    Estimator,
    compute_advantages,
    discounted_returns,
    drgrpo_advantages,
    gae,
    grpo_advantages,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo_advantages,
    scale_negative,
    sequence_scores,
    to_tokens,
)
from srt_agent.algo.batch import TokenBatch, collate, prompt_groups
from srt_agent.algo.dapo import informative_mask, overlong_penalty, zero_variance_groups
from srt_agent.algo.format_penalty import format_penalties, garbled_turns
from srt_agent.algo.groups import GroupStats, group_stats
from srt_agent.algo.kl import KLEstimator, KLMode, kl_estimate, kl_loss, kl_penalized_rewards
from srt_agent.algo.logits import entropy_of, logprobs_of, token_entropy, token_logprobs
from srt_agent.algo.losses import (
    Aggregation,
    LossAgg,
    PolicyLossStats,
    ValueLossStats,
    policy_loss,
    value_loss,
)
from srt_agent.algo.masked import masked_mean, masked_sum, masked_var, masked_whiten
from srt_agent.algo.rewards import RewardPlacement, place_rewards, token_rewards

__all__ = [
    "GROUP_ESTIMATORS",
    "Advantages",
    "Aggregation",
    "Estimator",
    "GroupStats",
    "KLEstimator",
    "KLMode",
    "LossAgg",
    "PolicyLossStats",
    "RewardPlacement",
    "TokenBatch",
    "ValueLossStats",
    "collate",
    "compute_advantages",
    "discounted_returns",
    "drgrpo_advantages",
    "entropy_of",
    "format_penalties",
    "gae",
    "garbled_turns",
    "group_stats",
    "grpo_advantages",
    "informative_mask",
    "kl_estimate",
    "kl_loss",
    "kl_penalized_rewards",
    "logprobs_of",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "place_rewards",
    "policy_loss",
    "prompt_groups",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo_advantages",
    "scale_negative",
    "sequence_scores",
    "to_tokens",
    "token_entropy",
    "token_logprobs",
    "token_rewards",
    "value_loss",
    "zero_variance_groups",
]
