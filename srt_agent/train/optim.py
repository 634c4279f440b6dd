"""AdamW over the policy (and its value head) with a warmup-then-decay learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from srt_agent.config import RunConfig
from srt_agent.train.policy_model import PolicyModel


def updates_per_step(cfg: RunConfig) -> int:
    """Optimizer updates in one training step: ``algo.epochs * algo.mini_batches``."""
    return cfg.algo.epochs * cfg.algo.mini_batches


def lr_factor(cfg: RunConfig) -> Callable[[int], float]:
    """The schedule as a multiplier of the peak LR, by optimizer update (``LambdaLR``'s function).

    Linear warmup from 0 over ``optim.warmup_steps`` updates, then ``constant``, or ``linear`` /
    ``cosine`` decay to ``optim.min_lr_ratio`` at the run's last update.
    """
    o = cfg.optim
    total = max(cfg.trainer.steps * updates_per_step(cfg), 1)
    warmup = o.warmup_steps

    def factor(update: int) -> float:
        if update < warmup:
            return (update + 1) / warmup  # the first update already moves (not LR 0)
        if o.schedule == "constant":
            return 1.0
        progress = min((update - warmup) / max(total - 1 - warmup, 1), 1.0)  # the last update: 1
        shape = 1.0 - progress if o.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return o.min_lr_ratio + (1.0 - o.min_lr_ratio) * shape

    return factor


def build_optimizer(policy: PolicyModel, cfg: RunConfig) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW with the LM at ``optim.lr`` and the value head at ``optim.critic_lr``, and its schedule.

    Args:
        policy: The model to train.
        cfg: The run config (``optim`` and the step counts of the schedule).

    Returns:
        The optimizer and its per-update LR scheduler.
    """
    o = cfg.optim
    groups: list[dict[str, object]] = [{"params": [p for p in policy.lm.parameters() if p.requires_grad]}]
    if policy.value_head is not None:
        groups.append({"params": list(policy.value_head.parameters()), "lr": o.critic_lr or o.lr})
    optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    return optimizer, LambdaLR(optimizer, lr_factor(cfg))
