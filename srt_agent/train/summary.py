"""The end-of-run summary: one flat JSON object (``srt-agent train --json``) and a table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from srt_agent.config import RunConfig

SUMMARY_SCHEMA = "srt-train/1"


def _values(steps: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in steps if isinstance(r.get(key), int | float)]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(
    records: Sequence[dict[str, Any]],
    cfg: RunConfig,
    *,
    wall_s: float,
    build_s: float = 0.0,
    checkpoint_s: float = 0.0,
    resumed_from: int = 0,
    announced: bool = False,
) -> dict[str, Any]:
    """The run's summary from its metrics records.

    Keys (``null`` where a figure was not measured):

    * ``schema``: ``srt-train/1``; ``env_id``, ``estimator``, ``model`` (starting checkpoint),
      ``out_dir``.
    * ``steps``: training steps completed (over all resumes); ``steps_planned``: ``trainer.steps``;
      ``resumed_from``: the checkpoint step this invocation started from (0: a fresh run).
    * ``success_before`` / ``success_after``: held-out success rate (``trainer.eval_episodes``
      tasks of ``env.eval_seeds``, the same sampling seeds) before training and after the last step;
      ``improvement``: after - before; ``eval_episodes``; ``eval_temperature`` (0: greedy);
      ``success_before_<kind>`` / ``success_after_<kind>``: the same per task kind, where the env
      labels its tasks (Retail: ``cancel``, ``return``, ``exchange``, ``info``);
      ``garbled_turn_rate_before`` / ``garbled_turn_rate_after``: the share of those evaluations'
      assistant turns that were neither a well-formed tool call nor plain text;
      ``progress_before`` / ``progress_after``: their mean share of the way to the goal, where the
      env reports it (Retail's ``info["progress"]``).
    * ``reward_first`` / ``reward_last``: mean episode reward of the first and last step's rollouts;
      ``train_success_first`` / ``train_success_last``: their success rates;
      ``informative_group_share_mean``: for group estimators, the mean over steps of the share of
      groups whose rewards differ (the only ones with a gradient).
    * ``wall_s``: seconds of this invocation (model build and evaluations included); ``build_s``:
      building the embedded model (0 if it existed); ``eval_s``: all evaluations; ``rollout_s``,
      ``learner_s``, ``baseline_s``: sums over steps of the SRT rollouts, the learner (advantages and
      updates) and the speculation-off baseline rollouts; ``checkpoint_s``: writing checkpoints;
      ``step_s_mean``: mean wall seconds per step.
    * ``srt_speedup_mean``: mean over the baseline steps of (speculation-off rollout seconds / SRT
      rollout seconds) for the same prompts and sampling seeds (which of the two runs first
      alternates, as the rollout right after a learner update runs slower); ``srt_speedup_steps``: how many;
      ``baseline_token_match_mean``: share of those episodes that sampled identical tokens both ways.
    * ``tokens_per_forward_mean``, ``acceptance_rate_mean``, ``tokens_per_s_mean``: means over steps
      (tokens per sequence-forward; accepted / verified draft tokens; sampled tokens per second).
    * ``gen_tokens``, ``episodes``, ``failed_episodes``: totals over steps.
    * ``logprob_mismatch_max``: the largest per-step mean |trainer - rollout| logprob gap.
    * ``kl_last``, ``entropy_last``: the last step's values.
    * ``run_ahead_announced``: whether the rollout scheduler accepted the next steps' prompts.

    Args:
        records: ``metrics.jsonl`` records of the whole run.
        cfg: The run config.
        wall_s: Seconds of this invocation.
        build_s: Seconds spent building the model.
        checkpoint_s: Seconds spent checkpointing (over all resumes).
        resumed_from: Checkpoint step this invocation started from.
        announced: Whether run-ahead announcements were accepted.

    Returns:
        The flat summary.
    """
    steps = [r for r in records if r.get("kind", "step") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    before = evals[0]["success_rate"] if evals else None
    after = evals[-1]["success_rate"] if len(evals) > 1 else before
    speedups = _values(steps, "srt_speedup")
    first, last = (steps[0], steps[-1]) if steps else ({}, {})
    kinds = sorted(
        {k.removeprefix("success_") for r in evals for k in r if k.startswith("success_")} - {"rate"}
    )
    per_kind: dict[str, Any] = {}
    for kind in kinds:
        per_kind[f"success_before_{kind}"] = evals[0].get(f"success_{kind}")
        per_kind[f"success_after_{kind}"] = evals[-1].get(f"success_{kind}")
    return {
        "schema": SUMMARY_SCHEMA,
        "env_id": cfg.env.id,
        "estimator": cfg.algo.estimator,
        "model": str(cfg.model.dir),
        "out_dir": str(cfg.trainer.out_dir),
        "steps": int(last.get("step", 0)),
        "steps_planned": cfg.trainer.steps,
        "resumed_from": resumed_from,
        "success_before": before,
        "success_after": after,
        "improvement": None if before is None or after is None else after - before,
        "garbled_turn_rate_before": evals[0].get("garbled_turn_rate") if evals else None,
        "garbled_turn_rate_after": evals[-1].get("garbled_turn_rate") if evals else None,  # as success_after
        "progress_before": evals[0].get("mean_progress") if evals else None,
        "progress_after": evals[-1].get("mean_progress") if evals else None,
        "eval_episodes": cfg.trainer.eval_episodes,
        "eval_temperature": cfg.eval_temperature,
        "reward_first": first.get("reward_mean"),
        "reward_last": last.get("reward_mean"),
        "train_success_first": first.get("success_rate"),
        "train_success_last": last.get("success_rate"),
        "informative_group_share_mean": _mean(_values(steps, "informative_group_share")),
        "wall_s": wall_s,
        "build_s": build_s,
        "eval_s": sum(_values(evals, "eval_s")),
        "rollout_s": sum(_values(steps, "rollout_s")),
        "learner_s": sum(_values(steps, "learner_s")),
        "baseline_s": sum(_values(steps, "baseline_rollout_s")),
        "checkpoint_s": checkpoint_s,
        "step_s_mean": _mean(_values(steps, "step_s")),
        "srt_speedup_mean": _mean(speedups),
        "srt_speedup_steps": len(speedups),
        "baseline_token_match_mean": _mean(_values(steps, "baseline_token_match")),
        "tokens_per_forward_mean": _mean(_values(steps, "tokens_per_forward")),
        "acceptance_rate_mean": _mean(_values(steps, "acceptance_rate")),
        "tokens_per_s_mean": _mean(_values(steps, "tokens_per_s")),
        "gen_tokens": int(sum(_values(steps, "gen_tokens"))),
        "episodes": int(sum(_values(steps, "episodes"))),
        "failed_episodes": int(sum(_values(steps, "failed"))),
        "logprob_mismatch_max": max(_values(steps, "logprob_mismatch"), default=None),
        "kl_last": last.get("kl"),
        "entropy_last": last.get("entropy"),
        "run_ahead_announced": announced,
        **per_kind,
    }


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def _kind_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """One row per task kind: held-out success before -> after."""
    kinds = [k.removeprefix("success_after_") for k in s if k.startswith("success_after_")]
    return [
        (
            f"  {kind}: before -> after",
            f"{_fmt(s.get(f'success_before_{kind}'), '.1%')} -> {_fmt(s[f'success_after_{kind}'], '.1%')}",
        )
        for kind in kinds
    ]


def summary_table(summary: dict[str, Any]) -> Table:
    """The headline figures of :func:`summarize` as a rich table."""
    s = summary
    table = Table(title=f"srt-agent train: {s['env_id']} ({s['estimator']}, {s['steps']} steps)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("held-out success before", _fmt(s["success_before"], ".1%")),
        ("held-out success after", _fmt(s["success_after"], ".1%")),
        ("improvement (absolute)", _fmt(s["improvement"], "+.1%")),
        *_kind_rows(s),
        (
            "held-out garbled turns before -> after",
            " -> ".join(_fmt(s.get(f"garbled_turn_rate_{when}"), ".1%") for when in ("before", "after")),
        ),
        *(
            (
                (
                    "held-out share of the goal reached",
                    " -> ".join(_fmt(s.get(f"progress_{when}"), ".1%") for when in ("before", "after")),
                ),
            )
            if s.get("progress_before") is not None
            else ()
        ),
        ("mean reward, first -> last step", f"{_fmt(s['reward_first'])} -> {_fmt(s['reward_last'])}"),
        *(
            (("groups whose rewards differ (mean)", _fmt(s["informative_group_share_mean"], ".1%")),)
            if s.get("informative_group_share_mean") is not None
            else ()
        ),
        ("SRT speedup (rollout, spec off / on)", _fmt(s["srt_speedup_mean"], ".2f") + "x"),
        ("tokens per forward", _fmt(s["tokens_per_forward_mean"], ".2f")),
        ("draft acceptance", _fmt(s["acceptance_rate_mean"], ".1%")),
        ("rollout tokens/s", _fmt(s["tokens_per_s_mean"], ".0f")),
        ("wall / build / eval s", f"{s['wall_s']:.0f} / {s['build_s']:.0f} / {s['eval_s']:.0f}"),
        (
            "rollout / learner / baseline s",
            f"{s['rollout_s']:.0f} / {s['learner_s']:.0f} / {s['baseline_s']:.0f}",
        ),
        ("mean s per step", _fmt(s["step_s_mean"], ".1f")),
        ("failed episodes", str(s["failed_episodes"])),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
