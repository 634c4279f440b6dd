"""The demo job: each registered env's oracle plays episodes, summarised per env.

This is the project's main job until training lands: it shows that every env resets, steps, runs
its tools and scores an oracle that solves its tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import gymnasium as gym

from srt_agent.env import oracle_policy
from srt_agent.policy import EpisodeResult, run_episode


@dataclass(frozen=True)
class OracleStats:
    """Summary of oracle episodes on one env.

    Attributes:
        env_id: The env.
        episodes: Episodes played.
        success_rate: Fraction of episodes with total reward 1 (the env's maximum).
        mean_reward: Mean total reward.
        mean_turns: Mean assistant turns.
        mean_tool_calls: Mean tool messages per episode.
        truncated: Episodes cut off by the turn limit.
        seconds: Wall-clock seconds for all episodes.
        last: The last episode (for printing its transcript).
    """

    env_id: str
    episodes: int
    success_rate: float
    mean_reward: float
    mean_turns: float
    mean_tool_calls: float
    truncated: int
    seconds: float
    last: EpisodeResult

    def flat(self) -> dict[str, float | int]:
        """The figures as flat JSON keys prefixed with the env id (``srt/Retail-v0`` -> ``srt_Retail_v0``)."""
        key = self.env_id.replace("/", "_").replace("-", "_")
        return {
            f"{key}_success_rate": self.success_rate,
            f"{key}_mean_reward": self.mean_reward,
            f"{key}_mean_turns": self.mean_turns,
            f"{key}_mean_tool_calls": self.mean_tool_calls,
            f"{key}_truncated": self.truncated,
            f"{key}_seconds": round(self.seconds, 4),
        }


def run_oracle(
    env_id: str, seeds: Iterable[int], *, on_episode: Callable[[EpisodeResult], None] | None = None
) -> OracleStats:
    """Play the env's oracle once per seed.

    Raises:
        NotImplementedError: The env has no oracle.
    """
    env = gym.make(env_id)
    results: list[EpisodeResult] = []
    t0 = time.perf_counter()
    try:
        for seed in seeds:
            results.append(run_episode(env, oracle_policy, seed=seed))
            if on_episode is not None:
                on_episode(results[-1])
    finally:
        env.close()
    if not results:
        raise ValueError("run_oracle needs at least one seed")
    n = len(results)
    return OracleStats(
        env_id=env_id,
        episodes=n,
        success_rate=sum(r.total_reward >= 1.0 for r in results) / n,
        mean_reward=sum(r.total_reward for r in results) / n,
        mean_turns=sum(r.turns for r in results) / n,
        mean_tool_calls=sum(sum(m.role == "tool" for m in r.transcript) for r in results) / n,
        truncated=sum(r.truncated for r in results),
        seconds=time.perf_counter() - t0,
        last=results[-1],
    )
