"""What a static step computes: the bodies that :mod:`~srt_agent.engine.step_graphs` captures.

Each builder returns a function that runs one step of a fixed shape, reading its inputs through
views of two flat device buffers (integers, floats) at fixed offsets, so a CUDA graph captured
from it reads whatever the host copied there last. Layouts (``n = rows * width``):

* tree step (decode, verify): integers ``ids, masks, depths`` (``n`` each: per row, its tree's
  tokens, each position's ancestor bitmask and depth), then ``prefix, top_k, greedy`` (one per
  row); floats ``uniforms`` (``n``: the uniform of each position's depth), then
  ``temperature, top_p``; a masked tree step also reads a third buffer, the allowed tokens of
  each position (bool, ``rows x width x V``);
* prefill: integers ``ids`` (``n``: the new prompt tokens, padded), then
  ``prefix, last, rows, top_k, greedy`` (per row: cached positions, index of the last real new
  token, the cache row); floats ``uniforms, temperature, top_p`` (per row).

Nothing here syncs with the host: a fix-up that sampling would otherwise decide on the host
always runs (:func:`~srt_agent.engine.sampling.sample` with ``host_sync=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from srt_agent.contracts.generation import SamplingParams
from srt_agent.engine.kv_cache import KVCache, mask_bias
from srt_agent.engine.llama import CausalLM
from srt_agent.engine.sampling import RowParams, sample

Flags = tuple[bool, bool, bool, bool]
"""``(all_greedy, any_greedy, scaled, any_filter)``: the batch's sampling flags, which choose ops."""

Body = Callable[[], torch.Tensor]
"""One step: returns ``(2, rows, ...)`` float64, the drawn tokens and their logprobs."""


def sampling_flags(params: Sequence[SamplingParams], vocab: int) -> Flags:
    """The sampling flags of a batch, as :meth:`RowParams.build` sets them."""
    greedy = [p.temperature == 0 for p in params]
    scaled = any(p.temperature not in (0.0, 1.0) for p in params)
    # Padding rows are unfiltered, so a filter is on only where some real row asks for one.
    any_filter = any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params)
    return all(greedy), any(greedy), scaled, any_filter


def tree_step(
    model: CausalLM,
    cache: KVCache,
    ints: torch.Tensor,
    floats: torch.Tensor,
    bb: int,
    tb: int,
    span: int,
    flags: Flags,
    allowed: torch.Tensor | None = None,
) -> Body:
    """A decode or verify step over cache rows ``0 .. bb-1``, trees of ``tb`` positions, span ``span``.

    ``allowed``, a ``(bb, tb, V)`` bool view of a fixed device buffer, masks the logits of every
    position before its draw (constrained tool calls): the step then draws from the masked,
    renormalised distribution, as the eager path does.
    """
    n = bb * tb
    ids = ints[:n].view(bb, tb)
    masks = ints[n : 2 * n].view(bb, tb)
    depths = ints[2 * n : 3 * n].view(bb, tb)
    prefix = ints[3 * n : 3 * n + bb]
    draw = _drawer(ints[3 * n + bb :], floats[n:], floats[:n].view(bb, tb), bb, flags)

    @torch.inference_mode()
    def run() -> torch.Tensor:
        offsets = torch.arange(tb, device=ids.device)
        positions = prefix[:, None] + depths  # (Bb, Tb): RoPE position = cached length + depth
        write = prefix[:, None] + offsets[None, :]  # (Bb, Tb): node j is stored at prefix + j
        bias = mask_bias(prefix, masks, span, model.dtype)  # (Bb, 1, Tb, L)
        hidden = model.forward(ids, positions, cache, 0, write, bias, hidden_only=True)  # (Bb, Tb, E)
        logits = model.head(hidden.view(n, -1)).view(bb, tb, -1)  # (Bb, Tb, V)
        if allowed is not None:  # in place: the head's output is the step's own tensor
            logits.masked_fill_(~allowed, float("-inf"))
        return draw(logits)

    return run


def prefill_step(
    model: CausalLM,
    cache: KVCache,
    ints: torch.Tensor,
    floats: torch.Tensor,
    kb: int,
    tb: int,
    span: int,
    flags: Flags,
) -> Body:
    """A prefill of ``kb`` rows (any cache rows, given as input) of up to ``tb`` new tokens each."""
    n = kb * tb
    ids = ints[:n].view(kb, tb)
    prefix = ints[n : n + kb]
    last = ints[n + kb : n + 2 * kb]
    rows = ints[n + 2 * kb : n + 3 * kb]
    draw = _drawer(ints[n + 3 * kb :], floats[kb:], floats[:kb], kb, flags)

    @torch.inference_mode()
    def run() -> torch.Tensor:
        positions = prefix[:, None] + torch.arange(tb, device=ids.device)[None, :]  # (Kb, Tb)
        cols = torch.arange(span, device=ids.device)
        blocked = cols[None, None, :] > positions[:, :, None]  # causal after the prefix
        bias = torch.zeros(blocked.shape, dtype=model.dtype, device=ids.device)
        bias = bias.masked_fill_(blocked, float("-inf"))[:, None]  # (Kb, 1, Tb, L)
        return draw(model.forward(ids, positions, cache, rows, positions, bias, logit_index=last))  # (Kb, V)

    return run


def _drawer(
    ints: torch.Tensor, floats: torch.Tensor, uniforms: torch.Tensor, rows: int, flags: Flags
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The draw of a step's logits with the rows' sampling parameters.

    The parameters are read at the start of ``ints`` (``top_k, greedy``) and of ``floats``
    (``temperature, top_p``), one per row.
    """
    top_k, greedy = ints[:rows], ints[rows : 2 * rows]
    temperature, top_p = floats[:rows], floats[rows : 2 * rows]
    all_greedy, any_greedy, scaled, any_filter = flags

    def draw(logits: torch.Tensor) -> torch.Tensor:
        params = RowParams(temperature, top_k, top_p, greedy != 0, any_filter, all_greedy, any_greedy, scaled)
        tokens, logprobs = sample(logits, params, None if all_greedy else uniforms, host_sync=False)
        return torch.stack((tokens.double(), logprobs.double()))  # one read back

    return draw
