"""PNG plots of a run from its metric records: reward per step, rollout time per step."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [
        (int(r["step"]), float(r[key]))
        for r in records
        if r.get("kind", "step") == "step" and isinstance(r.get(key), int | float)
    ]
    return [s for s, _ in points], [v for _, v in points]


def plot_run(records: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write ``reward.png`` and ``rollout_time.png`` into ``out_dir``.

    ``reward.png``: mean episode reward and success rate of the training rollouts per step, and
    the held-out evaluations as points. ``rollout_time.png``: the SRT rollout's wall seconds per
    step, and the speculation-off baseline's on the steps that measured it.

    Args:
        records: Records of ``metrics.jsonl`` (:func:`srt_agent.train.metrics_log.read_records`).
        out_dir: Where to write.

    Returns:
        The files written.
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend or window state
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    evals = [(int(r["step"]), float(r["success_rate"])) for r in records if r.get("kind") == "eval"]

    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(*_series(records, "reward_mean"), marker=".", linewidth=2.5, label="mean reward (train)")
    ax.plot(*_series(records, "success_rate"), "--", marker=".", label="success rate (train)")
    if evals:
        ax.plot(*zip(*evals, strict=True), "o", label="success rate (held-out eval)")
    ax.set(xlabel="step", ylabel="reward / rate", title="Reward per step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()
    reward_png = out / "reward.png"
    fig.savefig(reward_png, dpi=110)

    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(*_series(records, "rollout_s"), marker=".", label="rollout, SRT on")
    steps, base = _series(records, "baseline_rollout_s")
    if steps:
        ax.plot(steps, base, "s", label="same prompts, speculation off")
    ax.set(xlabel="step", ylabel="seconds", title="Rollout time per step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    time_png = out / "rollout_time.png"
    fig.savefig(time_png, dpi=110)
    return [reward_png, time_png]
