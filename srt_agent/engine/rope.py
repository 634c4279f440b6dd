"""Rotary position embeddings: frequencies per RoPE type and a rotation table indexed by position.

The table (unit complex numbers, one per position and frequency) is computed once for every
position the engine can reach, so a forward pass only gathers rows of it by explicit position ids
(tree tokens get ``prefix length + depth``, not their index in the tree).
"""

from __future__ import annotations

import math

import torch

from srt_agent.engine.hf_checkpoint import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Per-pair rotation frequencies, as transformers computes them for the same RoPE type.

    Args:
        rope: RoPE settings of the checkpoint.
        head_dim: Width of one attention head (even).

    Returns:
        ``(head_dim // 2,)`` float32 tensor.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        # Linear interpolation: position p is treated as p / factor.
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_frequencies(inv_freq, rope)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1 context extension: long wavelengths are slowed by `factor`, short ones kept, and the
    # band between is interpolated smoothly.
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_table(inv_freq: torch.Tensor, num_positions: int) -> torch.Tensor:
    """Unit complex rotations ``exp(i * position * freq)`` of every position and frequency pair.

    Args:
        inv_freq: ``(D / 2,)`` frequencies.
        num_positions: Positions ``0 .. num_positions - 1`` are covered.

    Returns:
        ``(num_positions, D / 2)`` complex64.
    """
    positions = torch.arange(num_positions, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq.to(torch.float32))  # (P, D/2)
    return torch.polar(torch.ones_like(angles), angles)


def interleave_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """View of q/k projection rows in the engine's interleaved RoPE layout, shaped like HF's.

    HF rotates dimension ``i`` of a head with ``i + D/2`` (``rotate_half``); the engine stores the
    pair at ``2i, 2i+1`` so that RoPE is one complex multiply. Attention scores are dot products
    over a head, so permuting q and k the same way leaves them unchanged. Writing HF's rows into the
    returned view stores them permuted.

    Args:
        weight: ``(heads * D, ...)`` storage rows (a weight or a bias) in the engine's layout.
        num_heads: Heads in these rows.

    Returns:
        A view of ``weight`` indexed like HF's ``(heads, 2, D/2, ...)``.
    """
    d = weight.shape[0] // num_heads
    rest = weight.shape[1:]
    return weight.view(num_heads, d // 2, 2, *rest).transpose(1, 2)


def apply_rope(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x`` by complex rotations (one multiply).

    Args:
        x: ``(N, heads, D)`` in the interleaved layout (see :func:`interleave_rows`).
        rotations: ``(N, 1, D/2)`` complex, broadcast over heads.

    Returns:
        ``(N, heads, D)`` rotated copy, in ``x``'s dtype.
    """
    n, heads, d = x.shape
    pairs = torch.view_as_complex(x.float().reshape(n, heads, d // 2, 2))
    return torch.view_as_real(pairs * rotations).view(n, heads, d).to(x.dtype)
