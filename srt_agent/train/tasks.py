"""Which tasks each training step rolls out: env seeds drawn from ``env.train_seeds``.

The draw is a pure function of ``(trainer.seed, step, round)``, not of a running generator, so a
resumed run picks the same prompts as an uninterrupted one, and the trainer knows the next step's
prompts in advance (to announce them to the run-ahead queue).
"""

from __future__ import annotations

import random

from srt_agent.config import RunConfig
from srt_agent.rollout.config import EpisodeRequest


def step_seeds(cfg: RunConfig, step: int, round_: int = 0, count: int | None = None) -> list[int]:
    """Distinct env seeds for one rollout round of a step.

    Args:
        cfg: The run config (``env.train_seeds``, ``trainer.seed``, ``rollout.prompts_per_step``).
        step: 1-based training step.
        round_: Rollout round within the step (dynamic sampling refills in rounds 1, 2, ...).
        count: How many; default ``rollout.prompts_per_step`` (capped by the range's size).

    Returns:
        The seeds, in draw order.
    """
    seeds = cfg.env.train_seeds
    n = min(cfg.rollout.prompts_per_step if count is None else count, len(seeds))
    rng = random.Random(f"srt-train/{cfg.trainer.seed}/{step}/{round_}")  # str seeds hash stably
    return rng.sample(range(seeds.start, seeds.stop), n)


def step_episodes(
    cfg: RunConfig, step: int, round_: int = 0, count: int | None = None
) -> list[EpisodeRequest]:
    """The episodes of one rollout round: ``rollout.n`` trials of each of :func:`step_seeds`.

    Episode ids name the step and round, so every request's sampling seed (derived from the id) is
    new each step, and a baseline rollout of the same specs samples the same tokens.
    """
    return [
        EpisodeRequest(
            cfg.env.id,
            seed=seed,
            trial=trial,
            episode_id=f"train/{step}/{round_}/{seed}/{trial}",
            env_options=dict(cfg.env.options),
        )
        for seed in step_seeds(cfg, step, round_, count)
        for trial in range(cfg.rollout.n)
    ]
