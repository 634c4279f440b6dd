"""The demo job: each registered env's oracle plays episodes, summarised per env.

This is the project's main job until training lands: it shows that every env resets, steps, runs
its tools and scores an oracle that solves its tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress
from rich.table import Table

from srt_agent.env.episode_loop import EpisodeResult, run_episode
from srt_agent.env.multi_turn import oracle_policy
from srt_agent.output.console import print_message


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


def _oracle_with_bar(env_id: str, seeds: range, console: Console) -> OracleStats | None:
    """``run_oracle`` with a progress bar; ``None`` when the env has no oracle."""
    with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), console=console) as bar:
        task = bar.add_task(env_id, total=len(seeds))
        try:
            return run_oracle(env_id, seeds, on_episode=lambda _: bar.advance(task))
        except NotImplementedError:
            return None


def oracle_table(
    env_ids: Iterable[str], seed: int, episodes: int, *, console: Console, quiet: bool = False
) -> tuple[Table, dict[str, Any], bool]:
    """What ``srt-agent demo`` prints: each env's oracle over ``episodes`` seeds from ``seed``.

    Returns:
        The table, the flat record for ``--json``, and whether every oracle solved every task.
    """
    table = Table(title=f"Oracle episodes (seeds {seed}..{seed + episodes - 1})")
    table.add_column("env", no_wrap=True)
    # Short headers so the table fits 80 columns: n = episodes, success = share with reward 1,
    # reward/turns/tools = means per episode, trunc = episodes cut off by the turn limit.
    for col in ("n", "success", "reward", "turns", "tools", "trunc", "sec"):
        table.add_column(col, justify="right")
    record: dict[str, Any] = {"seed": seed, "episodes": episodes}
    ok = True
    seeds = range(seed, seed + episodes)
    for env_id in env_ids:
        stats = _oracle_with_bar(env_id, seeds, console)
        if stats is None:
            table.add_row(env_id, "-", "no oracle", "-", "-", "-", "-", "-")
            continue
        if not quiet:
            console.rule(f"{env_id}: last episode (seed {seeds[-1]})")
            for message in stats.last.transcript:
                print_message(console, message)
        table.add_row(
            env_id,
            str(stats.episodes),
            f"{stats.success_rate:.0%}",
            f"{stats.mean_reward:.3f}",
            f"{stats.mean_turns:.1f}",
            f"{stats.mean_tool_calls:.1f}",
            str(stats.truncated),
            f"{stats.seconds:.2f}",
        )
        record.update(stats.flat())
        ok = ok and stats.success_rate == 1.0
    return table, record, ok
