"""Vectorised per-row sampling: temperature, top-k, top-p, then inverse-CDF draws.

Every row of a batch has its own parameters, so one step processes the whole batch with tensor ops.
Randomness never comes from a shared generator: each request owns a stream of uniforms (from its
own ``torch.Generator``) and a token is drawn by inverse CDF of the processed distribution with the
next uniform of that stream. The tokens a request gets therefore depend only on its own seed and
logits, never on which other requests share the batch.

Processing order follows transformers' logits warpers: temperature, then top-k, then top-p on the
renormalised top-k distribution. Convention for ``temperature == 0`` (greedy): the token is the
argmax of the raw logits, and its reported logprob is taken under the temperature-1 distribution
after top-k/top-p (the distribution greedy decoding is the mode of). The distribution greedy
actually samples from is a point mass; exact verification of drafts treats it as such (accept iff
the drafted token is the argmax).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from srt_agent.contracts.generation import SamplingParams


@dataclass
class RowParams:
    """Sampling parameters of the rows of a batch as tensors.

    Attributes:
        temperature: ``(B,)``; greedy rows hold 1.0 (see the module's convention).
        top_k: ``(B,)`` int64; disabled rows hold the vocabulary size.
        top_p: ``(B,)``.
        greedy: ``(B,)`` bool.
        any_filter: Some row uses top-k or top-p (else the sort is skipped).
        all_greedy: Every row is greedy (else uniforms are needed).
        any_greedy: Some row is greedy.
        scaled: Some row's temperature is not 1 (else the division is skipped).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    greedy: torch.Tensor
    any_filter: bool
    all_greedy: bool
    any_greedy: bool
    scaled: bool

    @classmethod
    def build(cls, params: Sequence[SamplingParams], vocab_size: int, device: torch.device) -> RowParams:
        """Stack per-request parameters into row tensors.

        Args:
            params: One entry per row.
            vocab_size: ``V``.
            device: Device of the logits.

        Returns:
            The row parameters.
        """
        temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
        ks = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_k=torch.tensor(ks, dtype=torch.long, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            greedy=torch.tensor([p.temperature == 0 for p in params], dtype=torch.bool, device=device),
            any_filter=any(k < vocab_size or p.top_p < 1.0 for k, p in zip(ks, params, strict=True)),
            all_greedy=all(p.temperature == 0 for p in params),
            any_greedy=any(p.temperature == 0 for p in params),
            scaled=any(t != 1.0 for t in temps),
        )

    def select(self, index: torch.Tensor) -> RowParams:
        """The parameters of rows ``index`` (e.g. one entry per tree position of a verify step).

        Args:
            index: ``(K,)`` int64 row indices, on the parameters' device.

        Returns:
            Parameters of ``K`` rows.
        """
        return RowParams(
            temperature=self.temperature[index],
            top_k=self.top_k[index],
            top_p=self.top_p[index],
            greedy=self.greedy[index],
            any_filter=self.any_filter,
            all_greedy=self.all_greedy,
            any_greedy=self.any_greedy,
            scaled=self.scaled,
        )


def processed_logits(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """Unnormalised log-probabilities of each row's sampling distribution (temperature, top-k, top-p).

    Args:
        logits: ``(B, V)`` or ``(B, T, V)`` raw logits (``T`` shares the row's parameters).
        rows: Parameters of the ``B`` rows.

    Returns:
        Same shape as ``logits``, float32; filtered-out tokens are ``-inf``. Normalising them
        (``log_softmax``) gives :func:`processed_logprobs`.
    """
    x = logits.float()
    shape = (-1,) + (1,) * (x.dim() - 1)
    if rows.scaled:
        x = x / rows.temperature.view(shape)
    if rows.any_filter:
        sorted_x, order = x.sort(dim=-1, descending=True)
        rank = torch.arange(x.shape[-1], device=x.device)
        keep = rank < rows.top_k.view(shape)  # top-k: the k best ranks
        sorted_x = sorted_x.masked_fill(~keep, float("-inf"))
        probs = sorted_x.softmax(dim=-1)
        # top-p on the renormalised top-k distribution: keep a token while the mass ranked above it
        # is below top_p (so the best token is always kept).
        mass_before = probs.cumsum(dim=-1) - probs
        sorted_x = sorted_x.masked_fill(mass_before >= rows.top_p.view(shape), float("-inf"))
        x = torch.empty_like(x).scatter_(-1, order, sorted_x)
    return x


def processed_logprobs(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """Log-probabilities of the sampling distribution of each row (after temperature, top-k, top-p).

    Args:
        logits: ``(B, V)`` or ``(B, T, V)`` raw logits (``T`` shares the row's parameters).
        rows: Parameters of the ``B`` rows.

    Returns:
        Same shape as ``logits``, float32; filtered-out tokens are ``-inf``.
    """
    return processed_logits(logits, rows).log_softmax(dim=-1)


def sample(
    logits: torch.Tensor, rows: RowParams, uniforms: torch.Tensor | None, *, host_sync: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw a token from each processed distribution by inverse CDF (argmax for greedy rows).

    Works on one distribution per row (``(B, V)``) or several (``(B, T, V)``, e.g. the nodes of a
    draft tree, all sharing the row's parameters and each with its own uniform). A sampled row
    costs one pass for the max, one for ``exp`` (shared by the draw and the normaliser), one
    cumulative sum and a binary search: this runs at every position of every decode step.

    Args:
        logits: ``(B, V)`` or ``(B, T, V)`` raw logits.
        rows: Parameters of the ``B`` rows.
        uniforms: ``(B,)`` or ``(B, T)`` uniforms in ``[0, 1)`` (ignored for greedy rows; may be
            ``None`` when every row is greedy).
        host_sync: Allow one device-to-host read (whether a rare rounding fix-up is needed, so
            that only then its extra pass runs). ``False`` always runs the fix-up: no sync, as
            inside a CUDA graph capture; the tokens are the same.

    Returns:
        ``(tokens, token logprobs)``, shaped like ``logits`` without ``V``: int64 tokens and their
        float32 logprobs under the processed distribution.
    """
    x = processed_logits(logits, rows)
    top, best = x.max(dim=-1, keepdim=True)  # (..., 1): the mode, which greedy rows take
    if rows.all_greedy or uniforms is None:
        tokens = best[..., 0]
        return tokens, -(x - top).exp().sum(dim=-1).log()
    cdf = (x - top).exp().cumsum(dim=-1)  # (..., V), unnormalised
    total = cdf[..., -1]
    # Scale u by the total mass so rounding in the cumsum can never push u past the end; with
    # `right=True` the first cdf entry strictly above u is a token of non-zero probability.
    drawn = torch.searchsorted(cdf, (uniforms.to(cdf.dtype) * total)[..., None], right=True)[..., 0]
    over = drawn >= x.shape[-1]
    if not host_sync or bool(over.any()):
        # u * total rounded up to total: take the last token of non-zero probability (the first
        # index where the cdf reaches its total). Rare, so only those rows pay the extra pass.
        drawn = torch.where(over, (cdf < total[..., None]).sum(dim=-1), drawn)
    if rows.any_greedy:
        greedy = rows.greedy.view((-1,) + (1,) * (drawn.dim() - 1))
        drawn = torch.where(greedy, best[..., 0], drawn)
    token_logprobs = x.gather(-1, drawn[..., None])[..., 0] - top[..., 0] - total.log()
    return drawn, token_logprobs
