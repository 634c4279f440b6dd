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


def oracle_prefix(cfg: RunConfig, step: int, seed: int) -> float | None:
    """The share of its solution the env's oracle plays before the policy, for one training task.

    Drawn uniformly from ``[0, env.oracle_prefix x (1 - (step-1)/steps)]``: the curriculum starts
    episodes late in the task and moves their start back to the opening over the run. A pure
    function of ``(trainer.seed, step, seed)``, so a group's samples and a resumed run agree.
    ``None`` when the curriculum is off.
    """
    if cfg.env.oracle_prefix == 0:
        return None
    top = cfg.env.oracle_prefix * max(1 - (step - 1) / cfg.trainer.steps, 0.0)
    return random.Random(f"srt-prefix/{cfg.trainer.seed}/{step}/{seed}").uniform(0.0, top)


def step_episodes(
    cfg: RunConfig, step: int, round_: int = 0, count: int | None = None
) -> list[EpisodeRequest]:
    """The episodes of one rollout round: ``rollout.n`` trials of each of :func:`step_seeds`.

    Episode ids name the step and round, so every request's sampling seed (derived from the id) is
    new each step, and a baseline rollout of the same specs samples the same tokens. With
    ``env.oracle_prefix`` on, each task's reset options carry its :func:`oracle_prefix` share.
    """
    requests = []
    for seed in step_seeds(cfg, step, round_, count):
        share = oracle_prefix(cfg, step, seed)
        reset = None if share is None else {"oracle_prefix": share}
        requests += [
            EpisodeRequest(
                cfg.env.id,
                seed=seed,
                trial=trial,
                episode_id=f"train/{step}/{round_}/{seed}/{trial}",
                env_options=dict(cfg.env.options),
                reset_options=reset,
            )
            for trial in range(cfg.rollout.n)
        ]
    return requests
