"""The loss of one micro-batch: PPO-clip policy loss, entropy bonus, KL loss and value loss.

Everything is masked by the trajectories' loss mask, so prompt, observation and tool tokens (which
the policy did not sample) and padding contribute neither loss nor gradient. Aggregation uses the
whole mini-batch's token and sequence counts (:class:`~srt_agent.algo.Aggregation`), so summing
the micro-batches' gradients gives exactly the mini-batch's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from srt_agent.algo import Aggregation, entropy_of, kl_loss, logprobs_of, masked_mean, policy_loss
from srt_agent.algo import value_loss as clipped_value_loss
from srt_agent.config import RunConfig
from srt_agent.train.constrained import constrain_logits
from srt_agent.train.policy_model import PolicyOutput, unpack


@dataclass(frozen=True)
class MicroBatch:
    """Rows of a prepared batch, trimmed to their longest sequence; all ``(b, L)`` on the device.

    Attributes:
        token_ids: Tokens (int64).
        attention_mask: 1 on real tokens.
        loss_mask: 1 on tokens the policy sampled.
        old_logprobs: The rollout's sampling logprobs (the PPO ratio's denominator).
        advantages: Per-token advantages.
        returns: Per-token returns (the critic's targets).
        old_values: Values at rollout time (GAE only).
        ref_logprobs: The reference policy's logprobs (KL in the loss only).
        allowed_index: Packed rows (of the policy's logits) of tokens sampled inside a constrained
            tool call, or ``None``.
        allowed_masks: ``(n, V)`` bool, the tokens each of those was drawn among.
    """

    token_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    returns: Tensor
    old_values: Tensor | None = None
    ref_logprobs: Tensor | None = None
    allowed_index: Tensor | None = None
    allowed_masks: Tensor | None = None

    def logits(self, out: PolicyOutput) -> Tensor:
        """A forward's logits at the sampled tokens, restricted where the rollout was constrained."""
        return constrain_logits(out.logits, self.allowed_index, self.allowed_masks)

    @property
    def num_tokens(self) -> int:
        """Generated tokens (the weight of this micro-batch's mean statistics)."""
        return int(self.loss_mask.sum())


@dataclass(frozen=True)
class MicroResult:
    """The loss to backpropagate and what to log about it.

    Attributes:
        loss: Scalar, this micro-batch's share of the mini-batch loss.
        parts: Loss terms (``pg_loss``, ``entropy_loss``, ``kl_loss``, ``vf_loss``), shares of the
            mini-batch's terms: sum them over micro-batches.
        means: Token means (clip fractions, entropy, ratios, value stats, logprob mismatch):
            average them over micro-batches weighted by :attr:`MicroBatch.num_tokens`.
        ratio_max: Largest importance ratio.
    """

    loss: Tensor
    parts: dict[str, float]
    means: dict[str, float]
    ratio_max: float


def micro_loss(out: PolicyOutput, mb: MicroBatch, cfg: RunConfig, agg: Aggregation) -> MicroResult:
    """The objective of one micro-batch, from the policy's forward over it.

    Args:
        out: The policy's forward over ``mb`` (at its sampled tokens).
        mb: The micro-batch.
        cfg: The run config (``algo``; ``rollout.temperature`` for the logprobs).
        agg: Aggregation with the mini-batch's totals.

    Returns:
        The loss and its statistics.
    """
    a, temperature = cfg.algo, cfg.rollout.temperature
    mask = mb.loss_mask
    sampled = mb.token_ids[mask.bool()]  # (N,) in the order of out.logits' rows
    logits = mb.logits(out)  # the distribution each token was sampled from (masked in tool calls)
    logprobs = unpack(logprobs_of(logits, sampled, temperature), mask)  # (b, L), 0 off the mask
    loss, pstats = policy_loss(
        logprobs,
        mb.old_logprobs,
        mb.advantages,
        mask,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        dual_clip=a.dual_clip,
        agg=agg,
    )
    parts = {"pg_loss": float(loss.detach())}
    means = {k.removeprefix("policy/"): v for k, v in pstats.as_dict().items() if k != "policy/ratio_max"}
    with torch.no_grad():
        # How far the trainer's forward is from the engine's recorded logprobs (0 up to float error
        # before the first update; bf16 autocast on CUDA shows up here).
        diff = (logprobs - mb.old_logprobs).abs()
        means["logprob_mismatch"] = float(masked_mean(diff, mask))
    entropy = unpack(entropy_of(logits if a.entropy_coef > 0 else logits.detach(), temperature), mask)
    means["entropy"] = float(masked_mean(entropy.detach(), mask))
    if a.entropy_coef > 0:
        bonus = a.entropy_coef * agg(entropy, mask)
        loss = loss - bonus
        parts["entropy_loss"] = -float(bonus.detach())
    if a.kl.coef > 0 and a.kl.mode == "loss":
        if mb.ref_logprobs is None:
            raise ValueError("algo.kl.mode 'loss' needs the reference logprobs in the micro-batch")
        kl_term = a.kl.coef * kl_loss(logprobs, mb.ref_logprobs, mask, a.kl.estimator, agg)
        loss = loss + kl_term
        parts["kl_loss"] = float(kl_term.detach())
    if out.values is not None:
        if mb.old_values is None:
            raise ValueError("a value head's output needs old_values in the micro-batch (GAE)")
        values = unpack(out.values, mask)  # (b, L)
        clip = a.value_clip
        vloss, vstats = clipped_value_loss(values, mb.old_values, mb.returns, mask, clip=clip, agg=agg)
        loss = loss + a.vf_coef * vloss
        parts["vf_loss"] = float(vloss.detach())
        means.update(value_clip_frac=vstats.clip_frac, value_mean=vstats.value_mean)
    return MicroResult(loss=loss, parts=parts, means=means, ratio_max=pstats.ratio_max)
