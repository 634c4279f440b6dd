"""The learner's side of constrained tool calls: which sampled tokens came from a masked distribution.

A trajectory rolled out with ``rollout.constrain_tool_calls`` recorded, for every token inside a
``<tool_call>`` block, the logprob of the policy restricted to the grammar's allowed tokens and
renormalised. The PPO ratio, the entropy and the KL must then be of that same distribution, or the
first update's ratio is not 1 and the gradient pushes mass onto tokens the sampler can never draw.
:func:`allowed_tokens` replays each turn's tokens through the grammar exactly as the engine did
(:class:`~srt_agent.engine.constraint.CallTracker`) and returns the mask each constrained token was
drawn under; :func:`constrain_logits` applies them to the learner's logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from srt_agent.contracts.trajectory import Trajectory
from srt_agent.engine.constraint import CallMasks, CallTracker


def allowed_tokens(trajectory: Trajectory, masks: CallMasks) -> dict[int, Tensor]:
    """Per position of a token sampled inside a call block, the ``(V,)`` bool mask it was drawn under.

    Args:
        trajectory: An episode; without ``tool_grammar`` nothing was constrained.
        masks: Masks over the policy's vocabulary (shared, cached tensors).

    Returns:
        ``{position: mask}`` for the constrained positions only (token-aligned, like ``logprobs``).
    """
    grammar = trajectory.tool_grammar
    if grammar is None:
        return {}
    out: dict[int, Tensor] = {}
    ids = trajectory.token_ids
    for start, end in trajectory.turn_spans:
        tracker = CallTracker(grammar, masks.vocabulary)
        tracker.resume(ids[:start])  # as the engine does with a request's prompt
        for position in range(start, end):
            if tracker.state is not None:
                out[position] = masks.mask(tracker.grammar, tracker.state)  # the turn's own grammar
            tracker.feed((ids[position],))
    return out


def constrain_logits(logits: Tensor, index: Tensor | None, allowed: Tensor | None) -> Tensor:
    """``logits`` with the rows ``index`` restricted to their ``allowed`` tokens (-inf elsewhere).

    Args:
        logits: ``(N, V)`` the policy's logits at its sampled tokens.
        index: ``(n,)`` rows of ``logits`` that were sampled under a mask, or ``None``.
        allowed: ``(n, V)`` bool, their masks.

    Returns:
        ``logits`` itself when nothing is constrained, else a masked copy (autograd flows through
        the allowed entries).
    """
    if index is None or allowed is None or index.numel() == 0:
        return logits
    rows = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, index, rows)


def micro_allowed(
    allowed: Sequence[Mapping[int, Tensor]], rows: Sequence[int], loss_mask: Tensor, device: torch.device
) -> tuple[Tensor, Tensor] | None:
    """A micro-batch's constrained rows of its packed logits, and their masks.

    The policy's logits come packed, one row per sampled token in row-major order of
    ``loss_mask`` (see :meth:`PolicyModel.forward`); a constrained token at ``(row, position)`` is
    the packed row counting the sampled tokens before it.

    Args:
        allowed: Per batch row, :func:`allowed_tokens`' result (empty: nothing was constrained).
        rows: The micro-batch's batch rows, in its order.
        loss_mask: ``(b, L)`` the micro-batch's loss mask.
        device: Where the micro-batch lives.

    Returns:
        ``(index, masks)`` on ``device``, or ``None`` when no token of the micro-batch is constrained.
    """
    if not allowed:
        return None
    flat = loss_mask.reshape(-1).long().cpu()
    packed = torch.cumsum(flat, 0) - 1  # packed row of each sampled position
    width = loss_mask.shape[1]
    index: list[int] = []
    masks: list[Tensor] = []
    for i, row in enumerate(rows):
        for position, mask in allowed[row].items():
            if position < width and bool(flat[i * width + position]):
                index.append(int(packed[i * width + position]))
                masks.append(mask)
    if not index:
        return None
    return torch.tensor(index, device=device), torch.stack(masks).to(device)
