"""One training step's learning: trajectories -> advantages -> mini-batch updates of the policy.

Old logprobs. The PPO ratio's denominator is the rollout's own per-token logprob: the engine
records ``log p(token)`` of the exact distribution it sampled from (float32, after temperature), and
its forward equals the HF model's within float error (tested in the engine's suite). Recomputing
them with a trainer forward (as verl and OpenRLHF do, for engines whose numerics differ) would cost
a forward over the batch and change nothing here. The ``logprob_mismatch`` metric keeps this honest:
the mean ``|trainer logprob - rollout logprob|`` over the first mini-batch, measured before its
update (about 1e-6 in float32 on CPU; larger under bf16 autocast on CUDA, which the ratio corrects).

Micro-batches. Each optimizer update (a mini-batch) accumulates gradients over micro-batches of at
most ``optim.micro_batch_tokens`` padded tokens (rows sorted by length, so little is padding), with
the loss aggregated over the mini-batch's totals so the sum is exactly the mini-batch's gradient.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from srt_agent.algo import (
    Aggregation,
    TokenBatch,
    collate,
    compute_advantages,
    format_penalties,
    kl_estimate,
    kl_penalized_rewards,
    logprobs_of,
    masked_mean,
    masked_var,
    overlong_penalty,
    scale_negative,
    token_rewards,
)
from srt_agent.config import RunConfig
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.engine.constraint import CallMasks
from srt_agent.train.constrained import allowed_tokens, micro_allowed
from srt_agent.train.objective import MicroBatch, micro_loss
from srt_agent.train.policy_model import PolicyModel, unpack


def micro_batches(lengths: Sequence[int], rows: Sequence[int], budget: int) -> list[list[int]]:
    """Pack rows into micro-batches of at most ``budget`` padded tokens (rows x longest row).

    Rows go longest first, so each micro-batch holds rows of similar length. A row longer than
    the budget gets a micro-batch of its own (it cannot be split: attention needs the whole row).

    Args:
        lengths: Real length of every row of the batch.
        rows: The rows to pack (indices into ``lengths``).
        budget: ``optim.micro_batch_tokens``.

    Returns:
        Lists of row indices; every row appears once.
    """
    out: list[list[int]] = []
    for row in sorted(rows, key=lambda r: -lengths[r]):
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(row)
        else:
            out.append([row])
    return out


@dataclass(frozen=True)
class PreparedBatch:
    """A step's training data: the padded batch and everything computed before the update.

    Attributes:
        batch: Tokens, masks, rollout logprobs and prompt groups, ``(B, T)``.
        lengths: Real length of every row.
        advantages: ``(B, T)``.
        returns: ``(B, T)``.
        old_values: ``(B, T)`` critic values at rollout time (GAE), else ``None``.
        ref_logprobs: ``(B, T)`` reference logprobs (when ``algo.kl.coef > 0``), else ``None``.
        allowed: Per row, the masks its constrained tool-call tokens were drawn under
            (:func:`~srt_agent.train.constrained.allowed_tokens`); empty when nothing was constrained.
    """

    batch: TokenBatch
    lengths: list[int]
    advantages: Tensor
    returns: Tensor
    old_values: Tensor | None
    ref_logprobs: Tensor | None
    allowed: tuple[Mapping[int, Tensor], ...] = ()

    def micro(self, rows: Sequence[int], device: torch.device) -> MicroBatch:
        """The rows as a :class:`MicroBatch` on ``device``, trimmed to their longest row."""
        idx = torch.tensor(list(rows))
        width = max(self.lengths[r] for r in rows)

        def take(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[idx, :width].to(device)

        b = self.batch
        loss_mask = b.loss_mask[idx, :width]
        constrained = micro_allowed(self.allowed, rows, loss_mask, device)
        return MicroBatch(
            token_ids=b.token_ids[idx, :width].to(device),
            attention_mask=b.attention_mask[idx, :width].to(device),
            loss_mask=loss_mask.to(device),
            old_logprobs=b.logprobs[idx, :width].to(device),
            advantages=self.advantages[idx, :width].to(device),
            returns=self.returns[idx, :width].to(device),
            old_values=take(self.old_values),
            ref_logprobs=take(self.ref_logprobs),
            allowed_index=None if constrained is None else constrained[0],
            allowed_masks=None if constrained is None else constrained[1],
        )


class Learner:
    """Computes advantages and updates the policy (the trainer's learning half).

    Args:
        policy: The model being trained.
        optimizer: Its optimizer.
        scheduler: The per-update learning-rate schedule.
        cfg: The run config.
        device: Where the policy lives.
        reference: The frozen reference model (only when ``algo.kl.coef > 0``).
        call_masks: The tool-call masks over the policy's vocabulary, when rollouts decode tool
            calls constrained (``rollout.constrain_tool_calls``): the learner then scores those
            tokens under the same masked distribution.
    """

    def __init__(
        self,
        policy: PolicyModel,
        optimizer: Optimizer,
        scheduler: LRScheduler,
        cfg: RunConfig,
        device: torch.device,
        reference: PolicyModel | None = None,
        call_masks: CallMasks | None = None,
    ) -> None:
        self.policy, self.optimizer, self.scheduler = policy, optimizer, scheduler
        self.cfg, self.device, self.reference = cfg, device, reference
        self.call_masks = call_masks

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.device.type == "cuda" and self.cfg.optim.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()  # CPU trains in float32, like the engine samples

    # ------------------------------------------------------------------ before the update
    def prepare(self, trajectories: Sequence[Trajectory]) -> PreparedBatch:
        """Collate, place rewards (KL, overlong and format penalties) and compute advantages.

        Args:
            trajectories: Episodes with at least one generated token each.

        Returns:
            The prepared batch.
        """
        a = self.cfg.algo
        batch = collate(trajectories)
        width = batch.token_ids.shape[1]
        lengths = [len(t.token_ids) for t in trajectories]
        masks = self.call_masks
        allowed = tuple(allowed_tokens(t, masks) for t in trajectories) if masks is not None else ()
        rewards = token_rewards(
            trajectories,
            length=width,
            placement=a.reward_placement,
            turn_bonuses=self._turn_bonuses(trajectories),
        )
        ref = (
            self._no_grad_rows(batch, lengths, self._ref_logprobs, allowed)
            if self.reference is not None
            else None
        )
        if ref is not None and a.kl.mode == "reward":
            rewards = kl_penalized_rewards(
                rewards, batch.logprobs, ref, batch.loss_mask, a.kl.coef, a.kl.estimator
            )
        values = self._no_grad_rows(batch, lengths, self._values, allowed) if a.uses_critic else None
        adv = compute_advantages(
            a.estimator,
            rewards,
            batch.loss_mask,
            group_ids=batch.group_ids,
            values=values,
            gamma=a.gamma,
            lam=a.lam,
        )
        advantages = adv.advantages
        if a.negative_weight != 1.0:
            advantages = scale_negative(advantages, a.negative_weight)
        return PreparedBatch(batch, lengths, advantages, adv.returns, values, ref, allowed)

    def _turn_bonuses(self, trajectories: Sequence[Trajectory]) -> list[list[float]] | None:
        """Per-turn reward shaping: DAPO's overlong penalty plus the format penalty (``None``: neither)."""
        a = self.cfg.algo
        parts = [self._overlong(trajectories)] if a.overlong.enabled else []
        if a.format_penalty:
            parts.append(format_penalties(trajectories, a.format_penalty))
        if not parts:
            return None
        return [[sum(turn) for turn in zip(*per_traj, strict=True)] for per_traj in zip(*parts, strict=True)]

    def _overlong(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        o, limit = self.cfg.algo.overlong, self.cfg.rollout.max_new_tokens
        return [
            overlong_penalty(
                torch.tensor([e - s for s, e in t.turn_spans]), limit, o.buffer_tokens, o.factor
            ).tolist()
            for t in trajectories
        ]

    def _ref_logprobs(self, mb: MicroBatch) -> Tensor:
        assert self.reference is not None
        out = self.reference(mb.token_ids, mb.attention_mask, mb.loss_mask)
        sampled = mb.token_ids[mb.loss_mask.bool()]
        return unpack(logprobs_of(mb.logits(out), sampled, self.cfg.rollout.temperature), mb.loss_mask)

    def _values(self, mb: MicroBatch) -> Tensor:
        values: Tensor | None = self.policy(mb.token_ids, mb.attention_mask, mb.loss_mask).values
        assert values is not None  # the policy has a value head whenever the estimator is gae
        return unpack(values, mb.loss_mask)

    def _no_grad_rows(
        self,
        batch: TokenBatch,
        lengths: list[int],
        fn: Callable[[MicroBatch], Tensor],
        allowed: tuple[Mapping[int, Tensor], ...] = (),
    ) -> Tensor:
        """``fn`` over every row in micro-batches, without gradient, assembled to ``(B, T)``."""
        zeros = torch.zeros_like(batch.logprobs)
        scratch = PreparedBatch(batch, lengths, zeros, zeros, None, None, allowed)
        out = torch.zeros_like(batch.logprobs)
        budget = self.cfg.optim.micro_batch_tokens
        with torch.no_grad(), self._autocast():
            for rows in micro_batches(lengths, range(len(lengths)), budget):
                result = fn(scratch.micro(rows, self.device)).float().cpu()  # (b, L)
                out[torch.tensor(rows), : result.shape[1]] = result
        return torch.where(batch.loss_mask.bool(), out, 0.0)

    # ------------------------------------------------------------------ the update
    def update(self, prep: PreparedBatch) -> dict[str, float]:
        """``algo.epochs`` passes of ``algo.mini_batches`` optimizer updates over the batch.

        Returns:
            Token-weighted means of the loss statistics, the sums of the loss terms averaged over
            updates, ``grad_norm`` (mean, before clipping), ``lr``, ``updates``, ``skipped_updates``
            (non-finite gradients), ``kl`` (rollout policy vs reference, if any),
            ``explained_variance`` (GAE) and ``logprob_mismatch`` (first mini-batch, before its update).
        """
        a = self.cfg.algo
        acc = _Accumulator()
        num_rows = len(prep.lengths)
        for epoch in range(a.epochs):
            perm = torch.randperm(num_rows)  # the global torch RNG: checkpointed, so resumes repeat it
            for index, rows in enumerate(_chunks(perm.tolist(), a.mini_batches)):
                first = epoch == 0 and index == 0
                self._update_one(prep, rows, acc, record_mismatch=first)
        stats = acc.result()
        stats["lr"] = float(self.scheduler.get_last_lr()[0])
        if prep.old_values is not None:
            stats["explained_variance"] = explained_variance(
                prep.old_values, prep.returns, prep.batch.loss_mask
            )
        if prep.ref_logprobs is not None:
            kl = kl_estimate(prep.batch.logprobs, prep.ref_logprobs, a.kl.estimator)
            stats["kl"] = float(masked_mean(kl, prep.batch.loss_mask))
        return stats

    def backward(
        self,
        prep: PreparedBatch,
        rows: Sequence[int],
        acc: _Accumulator | None = None,
        record_mismatch: bool = False,
    ) -> None:
        """Zero the gradients, then accumulate the loss gradient of the mini-batch ``rows`` of ``prep``.

        The parameters' ``.grad`` then hold exactly the gradient one optimizer update would apply
        (before clipping). :meth:`update` uses it; so does ``benchmarks/gradient_snr.py``, which
        compares the gradients of independent batches.

        Args:
            prep: A prepared batch.
            rows: The rows of the mini-batch.
            acc: Where to add the loss statistics (default: dropped).
            record_mismatch: Record ``logprob_mismatch`` (the first mini-batch of a step).
        """
        cfg = self.cfg
        mask = prep.batch.loss_mask[torch.tensor(list(rows))]
        agg = Aggregation(
            cfg.algo.loss_agg,
            norm_tokens=cfg.loss_norm_tokens,
            total_tokens=float(mask.sum()),
            total_seqs=float((mask.sum(dim=-1) > 0).sum()),
        )
        self.optimizer.zero_grad(set_to_none=True)
        for micro_rows in micro_batches(prep.lengths, rows, cfg.optim.micro_batch_tokens):
            mb = prep.micro(micro_rows, self.device)
            with self._autocast():
                out = self.policy(mb.token_ids, mb.attention_mask, mb.loss_mask)
            result = micro_loss(out, mb, cfg, agg)
            result.loss.backward()  # type: ignore[no-untyped-call]
            if acc is not None:
                acc.add_micro(result.parts, result.means, result.ratio_max, mb.num_tokens, record_mismatch)

    def gradients(self) -> dict[str, Tensor]:
        """The current gradient of each trainable LM parameter, flattened (zeros where it has none)."""
        return {
            name: torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten()
            for name, p in self.policy.lm.named_parameters()
            if p.requires_grad
        }

    def _update_one(
        self, prep: PreparedBatch, rows: list[int], acc: _Accumulator, record_mismatch: bool
    ) -> None:
        cfg = self.cfg
        self.backward(prep, rows, acc, record_mismatch)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip is not None else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        if math.isfinite(norm):
            self.optimizer.step()
        else:  # one bad batch must not destroy the weights: skip it, and count it
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        acc.add_update(norm)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the generated tokens of the whole batch.

    How much of the returns' variance the critic predicted at rollout time (1: all, 0: no better
    than a constant). Taken over the step's batch, not per micro-batch: a micro-batch's returns can
    be near-constant, which makes the ratio explode. 0 when the returns do not vary.
    """
    returns_var = float(masked_var(returns, mask))
    if returns_var <= 1e-12:
        return 0.0
    return 1.0 - float(masked_var(returns - values, mask)) / returns_var


def _chunks(items: list[int], parts: int) -> Iterator[list[int]]:
    """``items`` split into ``parts`` near-equal consecutive chunks (empty ones skipped)."""
    n = len(items)
    for i in range(parts):
        chunk = items[i * n // parts : (i + 1) * n // parts]
        if chunk:
            yield chunk


class _Accumulator:
    """Sums and token-weighted means of the micro-batch statistics over a step's updates."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self.means: dict[str, float] = {}
        self.tokens = 0
        self.mismatch = 0.0
        self.mismatch_tokens = 0
        self.ratio_max = 0.0
        self.norms: list[float] = []

    def add_micro(
        self, parts: dict[str, float], means: dict[str, float], ratio_max: float, tokens: int, mismatch: bool
    ) -> None:
        for key, value in parts.items():
            self.parts[key] = self.parts.get(key, 0.0) + value
        for key, value in means.items():
            if key == "logprob_mismatch":
                if mismatch:
                    self.mismatch += value * tokens
                    self.mismatch_tokens += tokens
                continue
            self.means[key] = self.means.get(key, 0.0) + value * tokens
        self.tokens += tokens
        self.ratio_max = max(self.ratio_max, ratio_max)

    def add_update(self, grad_norm: float) -> None:
        self.norms.append(grad_norm)

    def result(self) -> dict[str, float]:
        updates = max(len(self.norms), 1)
        out = {k: v / updates for k, v in self.parts.items()}  # each update's terms sum to its loss
        out.update({k: v / max(self.tokens, 1) for k, v in self.means.items()})
        finite = [n for n in self.norms if math.isfinite(n)]
        out["grad_norm"] = sum(finite) / len(finite) if finite else math.nan
        out["updates"] = float(len(self.norms))
        out["skipped_updates"] = float(len(self.norms) - len(finite))
        out["ratio_max"] = self.ratio_max
        out["logprob_mismatch"] = self.mismatch / max(self.mismatch_tokens, 1)
        out["learner_tokens"] = float(self.tokens)
        return out
