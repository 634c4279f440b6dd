"""DAPO's reward-side techniques: the soft overlong penalty and dynamic sampling.

Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale". (The loss-side
ones, clip-higher and the token-level loss, are options of :func:`srt_agent.algo.losses.policy_loss`.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_tokens: int, buffer_tokens: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (section 3.4, "Overlong Reward Shaping").

    With ``L_max = max_tokens`` and ``L_cache = buffer_tokens``::

        0                                       if len <= L_max - L_cache
        factor * ((L_max - L_cache) - len) / L_cache    if L_max - L_cache < len <= L_max
        -factor                                 if len > L_max

    Added to the reward, so answers that run into the generation limit are discouraged smoothly
    instead of by the noisy 0 reward of a cut-off answer. In a multi-turn episode the limit is per
    turn (``rollout.max_new_tokens``), so apply it to turn lengths and pass the result as
    ``turn_bonuses`` to :func:`srt_agent.algo.rewards.token_rewards`::

        lengths = torch.tensor([end - start for start, end in traj.turn_spans])
        bonus = overlong_penalty(lengths, max_new_tokens, buffer_tokens).tolist()

    Args:
        lengths: Any shape, generated lengths (integers).
        max_tokens: ``L_max``, the generation limit.
        buffer_tokens: ``L_cache``, the soft zone before it (``1 <= buffer_tokens <= max_tokens``).
        factor: Magnitude of the full penalty.

    Returns:
        Float32 penalties (<= 0), same shape as ``lengths``.

    Raises:
        ValueError: ``buffer_tokens`` out of range.
    """
    if not 1 <= buffer_tokens <= max_tokens:
        raise ValueError(f"need 1 <= buffer_tokens <= max_tokens, got {buffer_tokens} and {max_tokens}")
    expected = max_tokens - buffer_tokens
    lengths = lengths.to(torch.float32)
    soft = (expected - lengths) / buffer_tokens
    penalty = torch.where(lengths > max_tokens, -1.0, soft.clamp(max=0.0))
    return factor * penalty


def zero_variance_groups(scores: Tensor, group_ids: Tensor, tol: float = 0.0) -> Tensor:
    """Groups whose samples all got the same score (DAPO's dynamic sampling, section 3.2).

    With equal rewards a group's advantages are all 0 under GRPO-style estimators, so it adds
    nothing but noise to the token-mean. DAPO drops such groups and samples more prompts until the
    batch is full again (the trainer's refill loop).

    Args:
        scores: ``(B,)`` per-sequence scores.
        group_ids: ``(B,)`` integer group of each sequence.
        tol: Groups whose ``max - min <= tol`` count as zero-variance.

    Returns:
        Sorted 1-D int64 tensor of the group ids to drop (a group of one is always among them).
    """
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must both be (B,), got {tuple(scores.shape)}, {tuple(group_ids.shape)}"
        )
    unique, dense = torch.unique(group_ids, return_inverse=True)
    num, device = unique.numel(), scores.device
    high = torch.full((num,), -torch.inf, device=device).scatter_reduce(0, dense, scores.float(), "amax")
    low = torch.full((num,), torch.inf, device=device).scatter_reduce(0, dense, scores.float(), "amin")
    dropped: Tensor = unique[(high - low) <= tol]
    return dropped


def informative_mask(scores: Tensor, group_ids: Tensor, tol: float = 0.0) -> Tensor:
    """Which sequences to keep under dynamic sampling: those of groups with differing scores.

    Args:
        scores: ``(B,)`` per-sequence scores.
        group_ids: ``(B,)`` integer group of each sequence.
        tol: As in :func:`zero_variance_groups`.

    Returns:
        ``(B,)`` bool.
    """
    dropped = zero_variance_groups(scores, group_ids, tol)
    keep: Tensor = ~torch.isin(group_ids, dropped)
    return keep
