"""Evaluation figures from trajectories: success rate, τ-bench pass^k, tool use, throughput.

pass^k (τ-bench): the chance that *all* k independent trials of a task succeed, averaged over
tasks. With n >= k trials of a task of which c succeeded, the unbiased estimate is
C(c, k) / C(n, k) (sampling k of the n trials without replacement); with n = k it is 1 when every
trial succeeded and 0 otherwise. pass^1 is the plain success rate. Failed episodes (env, template
or engine errors) count as unsuccessful trials: an evaluation must not look better because
episodes crashed.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import comb

from rich.table import Table

from srt_agent.algo.format_penalty import garbled_turns
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.rollout.metrics import SOURCES, RolloutMetrics

EVAL_SCHEMA = "srt-eval/1"


def pass_hat_k(trials: Iterable[Sequence[bool]], k: int) -> float:
    """τ-bench pass^k over tasks, with the unbiased estimator for n >= k trials per task.

    Args:
        trials: Per task, the success of each of its n trials.
        k: Trials that must all succeed.

    Returns:
        The mean over tasks of C(c, k) / C(n, k), where c = successes among the n trials.

    Raises:
        ValueError: ``k < 1``, no tasks, or a task with fewer than ``k`` trials.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    scores = []
    for i, task in enumerate(trials):
        n, c = len(task), sum(bool(s) for s in task)
        if n < k:
            raise ValueError(f"task {i} has {n} trials; pass^{k} needs at least {k}")
        scores.append(comb(c, k) / comb(n, k))
    if not scores:
        raise ValueError("pass^k needs at least one task")
    return sum(scores) / len(scores)


@dataclass(frozen=True)
class KindFigures:
    """Figures of the episodes of one task kind (an env's ``info["task_kind"]``, e.g. Retail's).

    Attributes:
        episodes: Episodes of this kind.
        success_rate: Solved episodes / episodes.
        pass_hat: pass^j for j = 1..k over this kind's tasks (index j-1).
        mean_turns: Mean generated turns per episode.
        mean_tool_calls: Mean tool calls per episode.
        tool_errors: Failed tool calls over this kind's episodes.
    """

    episodes: int
    success_rate: float
    pass_hat: tuple[float, ...]
    mean_turns: float
    mean_tool_calls: float
    tool_errors: int


def _trials_by_task(trajectories: Sequence[Trajectory]) -> dict[int | None, list[bool]]:
    """Per task (env seed), the success of each trial."""
    by_task: dict[int | None, list[bool]] = defaultdict(list)
    for t in trajectories:
        by_task[t.seed].append(t.success)
    return by_task


def _pass_hats(by_task: Mapping[int | None, Sequence[bool]], k: int) -> tuple[float, ...]:
    return tuple(pass_hat_k(by_task.values(), j) for j in range(1, k + 1))


def _kind_figures(trajectories: Sequence[Trajectory], k: int) -> KindFigures:
    n = len(trajectories)
    return KindFigures(
        episodes=n,
        success_rate=sum(t.success for t in trajectories) / n,
        pass_hat=_pass_hats(_trials_by_task(trajectories), k),
        mean_turns=sum(t.num_turns for t in trajectories) / n,
        mean_tool_calls=sum(t.tool_calls for t in trajectories) / n,
        tool_errors=sum(t.tool_errors for t in trajectories),
    )


def ending(t: Trajectory) -> str:
    """How an episode ended: ``terminated`` or its reason's category.

    ``terminated``: the env ended it (Retail's customer said STOP, a task was answered); else
    ``max_turns``, ``context limit``, ``env raised ...`` and the other reason categories.
    """
    return "terminated" if t.status == "ok" else reason_category(t.reason)


def slug(text: str) -> str:
    """``text`` as a JSON-key fragment: lower case, every other character ``_``."""
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


@dataclass(frozen=True)
class EvalReport:
    """Figures of one evaluation run (see :meth:`flat` for the JSON form).

    Attributes:
        env_id: The env.
        model: The model directory, or the engine's class name.
        tasks: Distinct tasks (env seeds) evaluated.
        k: Trials per task.
        temperature: Sampling temperature.
        seed: Base sampling seed.
        first_env_seed: Env seed of the first task (tasks use consecutive seeds).
        episodes: Episodes played (``tasks * k``).
        success_rate: Solved episodes / episodes.
        pass_hat: pass^j for j = 1..k (index j-1).
        mean_reward: Mean total reward per episode.
        mean_progress: Mean of the episodes' final ``info["progress"]`` (the share of the goal an
            env says was reached, e.g. Retail's), over the episodes that report it; ``None`` if none does.
        mean_turns: Mean generated turns per episode.
        tokens_generated: Tokens sampled over all episodes.
        forward_passes: Engine forward passes over all episodes (0 if the engine reports none).
        tool_calls: Tool calls over all episodes.
        tool_errors: Failed tool calls over all episodes.
        garbled_turns: Assistant turns that are neither well-formed tool calls nor plain text
            (:func:`srt_agent.tooling.parser.turn_form`), over all episodes.
        assistant_turns: Assistant turns over all episodes (the base of ``garbled_turns``).
        ok: Episodes the env terminated.
        truncated: Episodes cut off (env turn limit, rollout cap, context limit).
        failed: Episodes that failed (env, chat template or engine error).
        wall_s: Wall seconds of the whole run.
        generation_s: Sum over episodes of seconds spent awaiting the engine.
        env_s: Sum over episodes of seconds spent in the env (tools included).
        reasons: Non-ok episodes per reason category (``"context limit"``, ``"env raised ValueError"``).
        endings: Episodes per :func:`ending` (``terminated``, ``max_turns``, ...).
        kinds: Per task kind, when the env labels its tasks (``info["task_kind"]``); else empty.
        spec: Whether the engine speculated from a tree cache (``None``: not known, an engine instance).
        constrained: Whether tool-call blocks were decoded under the tools' grammar.
        copied: Whether, under the grammar, string arguments were copied from the conversation.
        oracle_prefix: The share of each task's solution the env's oracle played before the policy
            (``None``: the policy played from the opening).
        metrics: The rollout's speculation and time-split figures (``None``: not measured).
        trajectories: The episodes themselves (not part of :meth:`flat`).
    """

    env_id: str
    model: str
    tasks: int
    k: int
    temperature: float
    seed: int | None
    first_env_seed: int
    episodes: int
    success_rate: float
    pass_hat: tuple[float, ...]
    mean_reward: float
    mean_turns: float
    tokens_generated: int
    forward_passes: int
    tool_calls: int
    tool_errors: int
    ok: int
    truncated: int
    failed: int
    wall_s: float
    generation_s: float
    env_s: float
    reasons: Mapping[str, int] = field(default_factory=dict, hash=False)
    endings: Mapping[str, int] = field(default_factory=dict, hash=False)
    kinds: Mapping[str, KindFigures] = field(default_factory=dict, hash=False)
    spec: bool | None = None
    constrained: bool = False
    copied: bool = False
    oracle_prefix: float | None = None
    garbled_turns: int = 0
    assistant_turns: int = 0
    mean_progress: float | None = None
    metrics: RolloutMetrics | None = field(default=None, repr=False, compare=False)
    trajectories: tuple[Trajectory, ...] = field(default=(), repr=False, compare=False)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per wall-clock second of the whole run."""
        return self.tokens_generated / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Generated tokens per engine forward pass (above 1 when speculation accepts drafts)."""
        return self.tokens_generated / self.forward_passes if self.forward_passes else 0.0

    @property
    def garbled_turn_rate(self) -> float:
        """Garbled assistant turns per assistant turn (0.0 when no turn was generated)."""
        return self.garbled_turns / self.assistant_turns if self.assistant_turns else 0.0

    def flat(self) -> dict[str, str | int | float | None]:
        """The report as one flat JSON object (every value a string, number or null).

        Keys: ``schema`` (``"srt-eval/1"``), ``env_id``, ``model``, ``tasks``, ``k``, ``episodes``,
        ``temperature``, ``constrained_tool_calls``, ``copied_tool_arguments``, ``oracle_prefix``
        (null unless the oracle played the start of each task), ``seed``,
        ``first_env_seed``, ``success_rate``,
        ``pass_hat_k`` (pass^k at the run's k, a fixed key to compare runs),
        ``pass_hat_1`` .. ``pass_hat_<k>``,
        ``mean_reward``, ``mean_progress`` (null unless the env reports progress), ``mean_turns``,
        ``tokens_generated``, ``mean_tokens_per_episode``,
        ``forward_passes``, ``tokens_per_forward``, ``tool_calls``, ``tool_errors``,
        ``mean_tool_calls``, ``garbled_turns``, ``garbled_turn_rate`` (over assistant turns), ``ok``,
        ``truncated``, ``failed``, ``wall_s``, ``generation_s``, ``env_s``, ``tokens_per_s``;
        ``ending_<how>`` (share of episodes per :func:`ending`, as a slug: ``ending_terminated``,
        ``ending_env_truncated``, ``ending_max_turns``); for an env that labels its tasks, per kind
        ``kind_<kind>_episodes``, ``kind_<kind>_success_rate``,
        ``kind_<kind>_pass_hat_<j>``, ``kind_<kind>_mean_turns``, ``kind_<kind>_mean_tool_calls``,
        ``kind_<kind>_tool_errors``; the attributes above say what each means. With measured
        metrics also ``spec`` (bool or null), ``acceptance_rate`` (accepted / verified draft tokens),
        ``mean_accepted`` (accepted draft tokens per drafted step), ``verify_forwards``,
        ``target_forwards`` and ``draft_hit_rate_<exact|task|global>`` (share of draft lookups each
        source answered).
        """
        out: dict[str, str | int | float | None] = {
            "schema": EVAL_SCHEMA,
            "env_id": self.env_id,
            "model": self.model,
            "tasks": self.tasks,
            "k": self.k,
            "episodes": self.episodes,
            "temperature": self.temperature,
            "constrained_tool_calls": self.constrained,
            "copied_tool_arguments": self.copied,
            "oracle_prefix": self.oracle_prefix,
            "seed": self.seed,
            "first_env_seed": self.first_env_seed,
            "success_rate": self.success_rate,
            "pass_hat_k": self.pass_hat[-1],
        }
        out.update({f"pass_hat_{j}": p for j, p in enumerate(self.pass_hat, 1)})
        out.update(
            mean_reward=self.mean_reward,
            mean_progress=self.mean_progress,
            mean_turns=self.mean_turns,
            tokens_generated=self.tokens_generated,
            mean_tokens_per_episode=self.tokens_generated / self.episodes,
            forward_passes=self.forward_passes,
            tokens_per_forward=round(self.tokens_per_forward, 4),
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            mean_tool_calls=self.tool_calls / self.episodes,
            garbled_turns=self.garbled_turns,
            garbled_turn_rate=self.garbled_turn_rate,
            ok=self.ok,
            truncated=self.truncated,
            failed=self.failed,
            wall_s=round(self.wall_s, 4),
            generation_s=round(self.generation_s, 4),
            env_s=round(self.env_s, 4),
            tokens_per_s=round(self.tokens_per_s, 2),
        )
        out.update({f"ending_{slug(how)}": n / self.episodes for how, n in sorted(self.endings.items())})
        for kind, f in sorted(self.kinds.items()):
            key = f"kind_{slug(kind)}"
            out.update({f"{key}_episodes": f.episodes, f"{key}_success_rate": f.success_rate})
            out.update({f"{key}_pass_hat_{j}": p for j, p in enumerate(f.pass_hat, 1)})
            out.update(
                {
                    f"{key}_mean_turns": f.mean_turns,
                    f"{key}_mean_tool_calls": f.mean_tool_calls,
                    f"{key}_tool_errors": f.tool_errors,
                }
            )
        m = self.metrics
        if m is not None:
            out.update(
                spec=self.spec,
                acceptance_rate=round(m.spec.acceptance_rate, 4),
                mean_accepted=round(m.spec.mean_accepted, 4),
                verify_forwards=m.spec.verify_forwards,
                target_forwards=m.spec.target_forwards,
            )
            out.update({f"draft_hit_rate_{s}": round(m.hit_rate(s), 4) for s in SOURCES})
        return out

    def table(self) -> Table:
        """A two-column rich table of the figures, for terminals."""
        t = Table(title=f"Evaluation of {self.model} on {self.env_id}", show_header=False)
        t.add_column("metric", no_wrap=True)
        t.add_column("value", justify="right")
        rows = [
            ("tasks x trials", f"{self.tasks} x {self.k} = {self.episodes} episodes"),
            ("success rate", f"{self.success_rate:.1%}"),
            *((f"pass^{j}", f"{p:.1%}") for j, p in enumerate(self.pass_hat, 1)),
            ("mean reward", f"{self.mean_reward:.3f}"),
            *(
                (("mean share of the goal reached", f"{self.mean_progress:.1%}"),)
                if self.mean_progress is not None
                else ()
            ),
            ("mean turns", f"{self.mean_turns:.2f}"),
            ("tool calls (errors)", f"{self.tool_calls} ({self.tool_errors})"),
            *((("  decoded under the tools' grammar", "yes"),) if self.constrained else ()),
            *((("  string arguments copied from the conversation", "yes"),) if self.copied else ()),
            *(
                (("started after the oracle's share", f"{self.oracle_prefix:.0%}"),)
                if self.oracle_prefix is not None
                else ()
            ),
            ("garbled turns", f"{self.garbled_turns} of {self.assistant_turns}"),
            ("ok / truncated / failed", f"{self.ok} / {self.truncated} / {self.failed}"),
            *(
                (f"  ended: {how}", f"{n} ({n / self.episodes:.0%})")
                for how, n in sorted(self.endings.items(), key=lambda kv: -kv[1])
            ),
            *self._kind_rows(),
            ("tokens generated", str(self.tokens_generated)),
            ("tokens per forward", f"{self.tokens_per_forward:.2f}" if self.forward_passes else "-"),
            *self._spec_rows(),
            ("wall time", f"{self.wall_s:.2f} s"),
            ("tokens / s", f"{self.tokens_per_s:.1f}"),
        ]
        for name, value in rows:
            t.add_row(name, value)
        return t

    def _kind_rows(self) -> list[tuple[str, str]]:
        rows = []
        for kind, f in sorted(self.kinds.items()):
            passes = " ".join(f"{p:.0%}" for p in f.pass_hat)
            rows.append(
                (
                    f"  {kind} ({f.episodes})",
                    f"pass^1..{len(f.pass_hat)} {passes}; {f.mean_turns:.1f} turns, "
                    f"{f.mean_tool_calls:.1f} calls ({f.tool_errors} errors)",
                )
            )
        return [("per task kind", ""), *rows] if rows else []

    def _spec_rows(self) -> list[tuple[str, str]]:
        m = self.metrics
        if m is None or self.spec is None:
            return []
        if not self.spec:
            return [("speculation (SRT)", "off")]
        hits = ", ".join(f"{s} {m.hit_rate(s):.0%}" for s in SOURCES)
        return [
            ("draft acceptance", f"{m.spec.acceptance_rate:.1%} ({m.spec.mean_accepted:.2f} tokens/step)"),
            ("draft hits", hits),
        ]


def reason_category(reason: str) -> str:
    """The category of a trajectory's ``reason`` (the text before the first colon)."""
    return reason.split(":", 1)[0].strip()


def summarize(
    trajectories: Sequence[Trajectory],
    *,
    k: int,
    model: str,
    temperature: float,
    seed: int | None,
    wall_s: float,
    spec: bool | None = None,
    metrics: RolloutMetrics | None = None,
    constrained: bool = False,
    copied: bool = False,
    oracle_prefix: float | None = None,
) -> EvalReport:
    """Build the report of one run: ``k`` trials for each task, a task being one env seed.

    Tasks are grouped by env seed rather than task id: two seeds can draw the same task (a small
    task space), and each seed is still its own sample of the task distribution.

    Raises:
        ValueError: No trajectories, several envs, or a task without ``k`` trials.
    """
    if not trajectories:
        raise ValueError("summarize needs at least one trajectory")
    envs = sorted({t.env_id for t in trajectories})
    if len(envs) != 1:
        raise ValueError(f"one report covers one env, got {envs}")
    by_task = _trials_by_task(trajectories)
    n = len(trajectories)
    status = Counter(t.status for t in trajectories)
    seeds = [s for s in by_task if s is not None]
    garbled = [g for t in trajectories for g in garbled_turns(t)]  # the policy's turns only
    return EvalReport(
        env_id=envs[0],
        model=model,
        tasks=len(by_task),
        k=k,
        temperature=temperature,
        seed=seed,
        first_env_seed=min(seeds) if seeds else 0,
        episodes=n,
        success_rate=sum(t.success for t in trajectories) / n,
        pass_hat=_pass_hats(by_task, k),
        mean_reward=sum(t.total_reward for t in trajectories) / n,
        mean_turns=sum(t.num_turns for t in trajectories) / n,
        tokens_generated=sum(t.generated_tokens for t in trajectories),
        forward_passes=sum(t.forward_passes for t in trajectories),
        tool_calls=sum(t.tool_calls for t in trajectories),
        tool_errors=sum(t.tool_errors for t in trajectories),
        ok=status["ok"],
        truncated=status["truncated"],
        failed=status["failed"],
        wall_s=wall_s,
        generation_s=sum(t.generation_s for t in trajectories),
        env_s=sum(t.env_s for t in trajectories),
        reasons=dict(Counter(reason_category(t.reason) for t in trajectories if t.reason)),
        endings=dict(Counter(ending(t) for t in trajectories)),
        kinds={kind: _kind_figures(group, k) for kind, group in by_kind(trajectories).items()},
        spec=spec,
        constrained=constrained,
        copied=copied,
        oracle_prefix=oracle_prefix,
        garbled_turns=sum(garbled),
        assistant_turns=len(garbled),
        mean_progress=mean_progress(trajectories),
        metrics=metrics,
        trajectories=tuple(trajectories),
    )


def mean_progress(trajectories: Sequence[Trajectory]) -> float | None:
    """Mean final ``info["progress"]`` over the episodes whose env reports it (``None`` if none does)."""
    shares = [float(p) for t in trajectories if isinstance(p := t.final_info.get("progress"), int | float)]
    return statistics.fmean(shares) if shares else None


def by_kind(trajectories: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories per ``final_info["task_kind"]`` (empty when no episode is labelled).

    A task (an env seed) has one kind: an episode without a label (one that failed before its env
    reset) takes its task's label from the task's other trials, else goes under ``unlabelled``.
    """
    seed_kind: dict[int | None, str] = {}
    for t in trajectories:
        kind = t.final_info.get("task_kind")
        if isinstance(kind, str):
            seed_kind.setdefault(t.seed, kind)
    if not seed_kind:
        return {}
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[seed_kind.get(t.seed, "unlabelled")].append(t)
    return dict(groups)
