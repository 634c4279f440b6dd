"""Trajectories to padded ``(B, T)`` tensors: the learner's input batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # the rollout package pulls in the chat format (transformers); only types needed
    from srt_agent.contracts.trajectory import Trajectory


@dataclass(frozen=True)
class TokenBatch:
    """``B`` whole episodes, right-padded to ``T`` tokens, token-aligned.

    Attributes:
        token_ids: ``(B, T)`` int64, padded with ``pad_id``.
        attention_mask: ``(B, T)`` float32, 1 on real tokens, 0 on padding.
        loss_mask: ``(B, T)`` float32, 1 on tokens the policy generated.
        logprobs: ``(B, T)`` float32, the rollout's sampling logprobs (0 off the loss mask).
        group_ids: ``(B,)`` int64, which episodes share a prompt (see :func:`prompt_groups`).
    """

    token_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    logprobs: Tensor
    group_ids: Tensor

    @property
    def num_tokens(self) -> int:
        """Generated tokens in the batch (the ``token-mean`` denominator)."""
        return int(self.loss_mask.sum())


def prompt_groups(trajectories: Sequence[Trajectory]) -> Tensor:
    """Group ids: episodes of the same env, task and env seed share one (numbered by first appearance).

    Args:
        trajectories: The batch.

    Returns:
        ``(B,)`` int64.
    """
    ids: dict[tuple[str, str, int | None], int] = {}
    out = [ids.setdefault((t.env_id, t.task_id, t.seed), len(ids)) for t in trajectories]
    return torch.tensor(out, dtype=torch.int64)


def collate(
    trajectories: Sequence[Trajectory],
    *,
    pad_id: int = 0,
    length: int | None = None,
    group_ids: Tensor | None = None,
) -> TokenBatch:
    """Pad trajectories into a :class:`TokenBatch`.

    Args:
        trajectories: ``B`` episodes (at least one).
        pad_id: Token id of the padding (masked out everywhere, its value does not matter).
        length: ``T``; default the longest episode.
        group_ids: ``(B,)`` group ids; default :func:`prompt_groups`.

    Returns:
        The batch.

    Raises:
        ValueError: No trajectories, an episode longer than ``length``, or ``group_ids`` of the
            wrong shape.
    """
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    width = max(len(t.token_ids) for t in trajectories) if length is None else length
    b = len(trajectories)
    token_ids = torch.full((b, width), pad_id, dtype=torch.int64)
    attention = torch.zeros(b, width)
    loss_mask = torch.zeros(b, width)
    logprobs = torch.zeros(b, width)
    for i, traj in enumerate(trajectories):
        n = len(traj.token_ids)
        if n > width:
            raise ValueError(f"episode {traj.episode_id!r} has {n} tokens, more than length={width}")
        token_ids[i, :n] = torch.tensor(traj.token_ids, dtype=torch.int64)
        attention[i, :n] = 1.0
        loss_mask[i, :n] = torch.tensor(traj.loss_mask, dtype=torch.float32)
        logprobs[i, :n] = torch.tensor(traj.logprobs, dtype=torch.float32)
    groups = prompt_groups(trajectories) if group_ids is None else group_ids
    if groups.shape != (b,):
        raise ValueError(f"group_ids must have shape ({b},), got {tuple(groups.shape)}")
    return TokenBatch(token_ids, attention, loss_mask, torch.where(loss_mask.bool(), logprobs, 0.0), groups)
