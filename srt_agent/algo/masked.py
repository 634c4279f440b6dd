"""Masked reductions over padded ``(B, T)`` tensors, shared by the estimators and the losses.

Every learner tensor is padded to ``(B, T)``: ``B`` sequences (episodes) by ``T`` token positions,
with a float mask of the same shape (1 where a token takes part, 0 for padding and for tokens the
policy did not sample). Reductions here never let a masked value through, even a NaN or inf, so a
garbage value in a padded position cannot poison a loss.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_same_shape(**tensors: Tensor) -> None:
    """Raise if the named tensors do not all have the same shape.

    Raises:
        ValueError: Two shapes differ; the message names every tensor and its shape.
    """
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shapes must match: {listed}")


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is 1 (over ``dim``, or everything).

    Args:
        values: Any shape.
        mask: Same shape, 0/1 (float or bool).
        dim: Dimension to reduce; ``None`` reduces all.

    Returns:
        The sum, with ``dim`` removed (a scalar when ``dim`` is ``None``).
    """
    picked = torch.where(mask.bool(), values, torch.zeros_like(values))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 where nothing is unmasked (not NaN).

    Args:
        values: Any shape.
        mask: Same shape, 0/1.
        dim: Dimension to reduce; ``None`` reduces all.

    Returns:
        The mean, with ``dim`` removed.
    """
    count = masked_sum(torch.ones_like(values), mask, dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def masked_var(values: Tensor, mask: Tensor) -> Tensor:
    """Population variance (divide by N) of the unmasked entries; 0 when there are none.

    Args:
        values: Any shape.
        mask: Same shape, 0/1.

    Returns:
        A scalar.
    """
    mean = masked_mean(values, mask)
    return masked_mean((values - mean) ** 2, mask)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(values - mean) / (std + eps)`` over the unmasked entries; masked entries come out 0.

    Statistics are taken over every unmasked entry of the whole tensor (the "global batch
    whitening" of REINFORCE++), with the population standard deviation.

    Args:
        values: Any shape.
        mask: Same shape, 0/1.
        eps: Added to the standard deviation, so a constant input gives zeros, not NaN.

    Returns:
        Same shape as ``values``.
    """
    mean = masked_mean(values, mask)
    std = masked_var(values, mask).sqrt()
    whitened = (values - mean) / (std + eps)
    return torch.where(mask.bool(), whitened, torch.zeros_like(values))
