"""The rollout half of a step's metrics: rewards, episode outcomes, throughput and speculation."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from srt_agent.algo.format_penalty import garbled_turns
from srt_agent.contracts.speculation import SpecStats
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.evaluation.report import by_kind, ending, mean_progress, slug


def rollout_metrics(trajectories: Sequence[Trajectory], seconds: float, spec: SpecStats) -> dict[str, float]:
    """Metrics of a step's training rollouts.

    Keys: ``episodes``, ``reward_mean``, ``reward_std``, ``success_rate``, ``failed``,
    ``truncated``, ``turns_mean``, ``gen_tokens`` (tokens the policy sampled), ``seq_len_mean``
    (whole episodes, prompt included), ``rollout_s``, ``tokens_per_s`` (sampled tokens per wall
    second), ``tokens_per_forward`` (the episodes' sampled tokens per forward pass that produced
    them: 1.0 without speculation), and from the engine's counters (run-ahead rows included)
    ``acceptance_rate`` (accepted / verified draft tokens), ``mean_accepted`` (accepted tokens per
    drafted sequence-step), ``drafts_<source>`` (verified drafts from the exact state's tree,
    the task's suffix match, the global one), ``runahead_accepted`` (accepted draft tokens that
    only run-ahead work had produced). Also ``tool_calls_mean``, ``tool_error_rate`` (failed /
    all tool calls), ``garbled_turn_rate`` (assistant turns neither a well-formed tool call nor
    plain text, :func:`~srt_agent.tooling.parser.turn_form`), ``ended_<how>`` (share of episodes per
    :func:`~srt_agent.evaluation.report.ending`: ``ended_terminated`` is Retail's customer STOP,
    ``ended_env_truncated`` the env's turn limit), and for an env that labels its tasks (``task_kind``)
    ``success_<kind>`` and ``turns_<kind>`` per kind in the batch; for an env that reports how far
    an episode got (``info["progress"]``, Retail's share of the goal reached) ``progress_mean``. With
    the reverse curriculum on (``env.oracle_prefix``), ``oracle_turns_mean``: turns the env's oracle
    played before the policy.
    """
    rewards = [t.total_reward for t in trajectories]
    gen = sum(t.generated_tokens for t in trajectories)
    passes = sum(t.forward_passes for t in trajectories)
    n = max(len(trajectories), 1)
    out = {
        "episodes": float(len(trajectories)),
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if rewards else 0.0,
        "success_rate": sum(t.success for t in trajectories) / n,
        "failed": float(sum(t.status == "failed" for t in trajectories)),
        "truncated": float(sum(t.status == "truncated" for t in trajectories)),
        "turns_mean": sum(t.num_turns for t in trajectories) / n,
        "gen_tokens": float(gen),
        "seq_len_mean": sum(len(t.token_ids) for t in trajectories) / n,
        "rollout_s": seconds,
        "tokens_per_s": gen / seconds if seconds > 0 else 0.0,
        "tokens_per_forward": gen / passes if passes else 0.0,
        "acceptance_rate": spec.acceptance_rate,
        "mean_accepted": spec.mean_accepted,
        "runahead_accepted": float(spec.runahead_nodes_accepted),
    }
    for source in ("exact", "task", "global"):
        out[f"drafts_{source}"] = float(spec.drafts_by_source.get(source, 0))
    calls = sum(t.tool_calls for t in trajectories)
    out["tool_calls_mean"] = calls / n
    out["tool_error_rate"] = sum(t.tool_errors for t in trajectories) / calls if calls else 0.0
    garbled = [g for t in trajectories for g in garbled_turns(t)]
    out["garbled_turn_rate"] = sum(garbled) / len(garbled) if garbled else 0.0
    for how, count in Counter(ending(t) for t in trajectories).items():
        out[f"ended_{slug(how)}"] = count / n
    prefixes = [t.final_info["oracle_turns"] for t in trajectories if "oracle_turns" in t.final_info]
    if prefixes:
        out["oracle_turns_mean"] = statistics.fmean(prefixes)
    progress = mean_progress(trajectories)
    if progress is not None:
        out["progress_mean"] = progress
    for kind, group in by_kind(trajectories).items():
        out[f"success_{slug(kind)}"] = sum(t.success for t in group) / len(group)
        out[f"turns_{slug(kind)}"] = sum(t.num_turns for t in group) / len(group)
    return out


def token_match(a: Sequence[Trajectory], b: Sequence[Trajectory]) -> float:
    """Share of episode pairs with identical token sequences.

    SRT on vs off: exact verification with the same per-request seeds samples the same tokens, up
    to float near-ties, so this is close to 1.
    """
    pairs = list(zip(a, b, strict=True))
    return sum(x.token_ids == y.token_ids for x, y in pairs) / max(len(pairs), 1)
