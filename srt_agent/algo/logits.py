"""From a causal LM's logits to token-aligned logprobs and entropies.

A causal LM's logits at position ``t`` predict token ``t + 1``. The learner's tensors are
*token-aligned* instead (see :mod:`srt_agent.algo.advantages`): position ``t`` describes token
``t``, like ``Trajectory.logprobs``. The functions here do that shift once, so no caller has an
off-by-one to get wrong; position 0 (no distribution produced the first token) is 0.

:func:`logprobs_of` and :func:`entropy_of` are the unshifted kernels, for logits that were already
gathered at the positions of interest (the trainer computes the output layer only where the next
token was sampled by the policy, a third of the positions in a multi-turn episode).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 (greedy rollouts have no logprobs to train on), got {temperature}"
        )


def _check(logits: Tensor, temperature: float) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}")
    _check_temperature(temperature)


def logprobs_of(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)[token]`` for each row of logits, unshifted.

    Args:
        logits: ``(..., V)`` (the softmax runs in float32).
        token_ids: ``(...)``, the token each row scores.
        temperature: Sampling temperature (> 0).

    Returns:
        ``(...)`` float32.

    Raises:
        ValueError: Bad shapes or temperature.
    """
    _check_temperature(temperature)
    if token_ids.shape != logits.shape[:-1]:
        raise ValueError(f"token_ids {tuple(token_ids.shape)} must be logits' {tuple(logits.shape[:-1])}")
    scaled = logits.float() / temperature  # (..., V)
    picked = scaled.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def entropy_of(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` for each row of logits, unshifted.

    Args:
        logits: ``(..., V)``.
        temperature: Sampling temperature (> 0).

    Returns:
        ``(...)`` float32.
    """
    _check_temperature(temperature)
    scaled = logits.float() / temperature
    probs = torch.softmax(scaled, dim=-1)
    # Tokens masked out (-inf logits, as constrained tool calls give) have probability 0 and add
    # nothing; as 0 * -inf they would make the entropy and its gradient NaN.
    finite = scaled.masked_fill(torch.isneginf(scaled), 0.0)
    return torch.logsumexp(scaled, dim=-1) - (probs * finite).sum(dim=-1)


def token_logprobs(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``log p(token_t | tokens_<t)`` of every token, token-aligned.

    The engine records logprobs of its *sampling* distribution (logits divided by the
    temperature), so compute them here with the same ``temperature`` or the PPO ratio will not be 1
    on the first update. (Top-p / top-k truncation is not reproduced: with those on, ratios of
    tokens near the cut are biased; keep them off for training.)

    Args:
        logits: ``(B, T, V)`` the model's output for the whole sequences (float32 or lower; the
            softmax runs in float32).
        token_ids: ``(B, T)`` the sequences.
        temperature: Sampling temperature of the rollout.

    Returns:
        ``(B, T)`` float32, position 0 is 0.

    Raises:
        ValueError: Bad shapes or temperature.
    """
    _check(logits, temperature)
    if token_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"token_ids {tuple(token_ids.shape)} must be logits' (B, T) {tuple(logits.shape[:2])}"
        )
    logp = logprobs_of(logits[:, :-1], token_ids[:, 1:], temperature)  # (B, T-1): tokens 1..T-1
    return F.pad(logp, (1, 0))


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of the distribution each token was sampled from, token-aligned.

    ``H_t = logsumexp(z) - sum softmax(z) * z`` with ``z`` the logits at ``t - 1`` (divided by the
    temperature). Take :func:`srt_agent.algo.masked.masked_mean` over the generated-token mask for
    the policy's entropy (logging, or an entropy bonus).

    Args:
        logits: ``(B, T, V)``.
        temperature: Sampling temperature of the rollout.

    Returns:
        ``(B, T)`` float32, position 0 is 0.

    Raises:
        ValueError: Bad shape or temperature.
    """
    _check(logits, temperature)
    return F.pad(entropy_of(logits[:, :-1], temperature), (1, 0))  # (B, T)
