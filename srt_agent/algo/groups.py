"""Per-group statistics of per-sequence scores (the samples of one prompt form a group).

Group ids are any integers, one per sequence (``(B,)`` int64); they need not be contiguous or
sorted. Everything is vectorised with ``scatter_add`` over the dense index of each group, so the
cost does not grow with the number of groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class GroupStats:
    """Statistics of each sequence's group, gathered back to the sequence.

    Attributes:
        count: ``(B,)`` float, sequences in the group.
        mean: ``(B,)`` mean score of the group.
        std: ``(B,)`` unbiased (Bessel-corrected) standard deviation of the group; 0 for a group
            of one, where it is undefined.
    """

    count: Tensor
    mean: Tensor
    std: Tensor


def _check(scores: Tensor, group_ids: Tensor) -> None:
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must both be (B,); got {tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.dtype.is_floating_point:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


def group_stats(scores: Tensor, group_ids: Tensor) -> GroupStats:
    """Count, mean and unbiased std of each sequence's group.

    The standard deviation is Bessel-corrected (divide by ``n - 1``), as ``torch.std`` computes it
    in the GRPO implementations of DeepSeekMath's recipe (TRL, verl, OpenRLHF).

    Args:
        scores: ``(B,)`` one score per sequence.
        group_ids: ``(B,)`` integer group of each sequence.

    Returns:
        The group's statistics for every sequence.

    Raises:
        ValueError: Shapes or dtypes are wrong.
    """
    _check(scores, group_ids)
    _, dense = torch.unique(group_ids, return_inverse=True)  # (B,) in [0, G)
    num_groups = int(dense.max().item()) + 1 if dense.numel() else 0
    zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    count = zeros.scatter_add(0, dense, torch.ones_like(scores))  # (G,)
    mean = zeros.scatter_add(0, dense, scores) / count
    sq_dev = (scores - mean[dense]) ** 2  # (B,)
    ss = zeros.scatter_add(0, dense, sq_dev)
    std = torch.where(count > 1, (ss / (count - 1).clamp(min=1.0)).sqrt(), torch.zeros_like(ss))
    return GroupStats(count=count[dense], mean=mean[dense], std=std[dense])
