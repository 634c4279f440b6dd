"""Benchmark runs: N tasks of an env, k sampled trials each, through the rollout scheduler.

Evaluation env seeds are ``first_seed, first_seed + 1, ...`` inside ``[0, EVAL_SEED_END)``; the
model builder's demonstrations use seeds from ``EVAL_SEED_END`` (10,000,000) up, so a model is
never evaluated on a task it was warm-started on. The k trials of a task share its env seed and
differ only in their sampling seeds (derived from ``seed``, the episode id and the turn), so a run
is reproducible with an engine that honours per-request seeds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from rich.console import Console
from typing_extensions import Unpack

from srt_agent.chat.template import ChatFormat
from srt_agent.config.sections import SpecSection
from srt_agent.contracts.generation import Engine
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.devices import resolve_device
from srt_agent.distributed.ray_config import RayConfig
from srt_agent.env.multi_turn import EnvConfigError
from srt_agent.env.registration import UnknownEnvError, require_oracle, validate_env_options
from srt_agent.errors import SrtAgentError
from srt_agent.evaluation.report import EvalReport, reason_category, summarize
from srt_agent.output.console import make_console
from srt_agent.output.paths import OutputPathError
from srt_agent.output.reporting import check_outputs, print_error, write_json
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig
from srt_agent.rollout.progress import RolloutProgress
from srt_agent.rollout.scheduler import ProgressCallback, RolloutScheduler, rollout_sync
from srt_agent.rollout.trace import write_trace
from srt_agent.runtime import Runtime, build_runtime
from srt_agent.serving.engine_config import EngineConfig
from srt_agent.tree_cache import TreeCache

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

EVAL_SEED_END = 10_000_000
"""Evaluation seeds stay below this; it equals ``srt_agent.recipe.demos.DEMO_SEED_BASE``, where the
model builder's demonstration seeds start."""


class ModelLoadError(SrtAgentError, RuntimeError):
    """The model directory could not be loaded into an engine and chat format."""


def eval_episodes(
    env_id: str,
    tasks: int,
    k: int,
    *,
    first_seed: int = 0,
    env_options: dict[str, Any] | None = None,
    oracle_prefix: float | None = None,
) -> list[EpisodeRequest]:
    """The episodes of an evaluation: ``k`` trials of each of ``tasks`` consecutive env seeds.

    With ``oracle_prefix``, every episode starts after the env's oracle has played that share of
    its solution (the ``reset`` option of :class:`~srt_agent.env.multi_turn.MultiTurnEnv`).

    Raises:
        ValueError: ``tasks`` or ``k`` below 1, or seeds outside ``[0, EVAL_SEED_END)``.
    """
    if tasks < 1 or k < 1:
        raise ValueError(f"need tasks >= 1 and k >= 1, got tasks={tasks}, k={k}")
    if first_seed < 0 or first_seed + tasks > EVAL_SEED_END:
        raise ValueError(
            f"eval seeds {first_seed}..{first_seed + tasks - 1} leave [0, {EVAL_SEED_END}); "
            "seeds from 10,000,000 up are the model builder's training demonstrations"
        )
    return [
        EpisodeRequest(
            env_id,
            seed=s,
            trial=j,
            env_options=dict(env_options or {}),
            reset_options=None if oracle_prefix is None else {"oracle_prefix": oracle_prefix},
        )
        for s in range(first_seed, first_seed + tasks)
        for j in range(k)
    ]


def run_eval(
    env_id: str,
    model: str | Path | Engine,
    *,
    fmt: ChatFormat | None = None,
    episodes: int = 16,
    k: int = 1,
    temperature: float = 1.0,
    max_new_tokens: int = 512,
    max_turns: int | None = None,
    max_concurrent: int = 32,
    seed: int = 0,
    first_seed: int = 0,
    env_options: dict[str, Any] | None = None,
    progress: ProgressCallback | None = None,
    trace_path: str | Path | None = None,
    speculate: bool = True,
    engine: EngineConfig | None = None,
    ray: RayConfig | None = None,
    device: str = "cpu",
    spec_options: SpecSection | None = None,
    isolation: Literal["thread", "process"] | None = None,
    constrain_tool_calls: bool = False,
    copy_tool_arguments: bool = False,
    oracle_prefix: float | None = None,
) -> EvalReport:
    """Evaluate a model (directory or engine) on an env: ``episodes`` tasks, ``k`` trials each.

    Args:
        env_id: Any registered env id (built-in or custom).
        model: A model directory (loaded, with a fresh tree cache if ``speculate``, and closed
            afterwards) or an engine instance (left open; pass ``fmt`` with it).
        fmt: The chat format of an engine instance's model.
        episodes: Tasks to evaluate (env seeds ``first_seed ..``).
        k: Trials per task (for pass^k); ``episodes * k`` episodes are played.
        temperature: Sampling temperature.
        max_new_tokens: Most tokens per assistant turn.
        max_turns: Rollout-level turn cap on top of the env's own.
        max_concurrent: Episodes in flight at once.
        seed: Base of the per-request sampling seeds.
        first_seed: Env seed of the first task.
        env_options: Options for ``make`` (e.g. ``{"max_turns": 8}``).
        progress: Called with each finished trajectory (e.g. a :class:`RolloutProgress`).
        trace_path: Also write the per-turn JSONL trace (``srt-trace/1``) here.
        speculate: For a model directory, speculate from a tree cache (SRT) filled by the run's own
            turns; ignored for an engine instance (its draft source decides).
        engine: For a model directory, which engine: in-process (default), or a server
            (``kind: sglang``) that drafts on its side (speculation is then the server's business).
        ray: For a model directory, roll out on a Ray cluster (engine replicas, env workers).
        device: For a model directory, where the in-process engine runs (``cpu``, ``cuda``, ``auto``).
        spec_options: For a model directory, the tree cache, speculation and run-ahead settings
            (a run config's ``spec`` section; default: its defaults). Run-ahead needs ``speculate``; its
            jobs run beside the live episodes and only feed the cache.
        isolation: Where env code runs (``rollout.env_isolation``): ``process`` puts each
            episode's env in a worker process, so an env that crashes, exits or hangs fails its
            episode only; ``None``: the env's registered choice.
        constrain_tool_calls: Decode every ``<tool_call>`` block under the grammar of the env's
            tools (``rollout.constrain_tool_calls``; the in-process engine only).
        copy_tool_arguments: With ``constrain_tool_calls``, string arguments are copied from the
            conversation (``rollout.copy_tool_arguments``).
        oracle_prefix: Start each episode after the env's oracle has played this share of its
            solution: success from part-way through a task says where a policy breaks down.

    Returns:
        The report; ``report.trajectories`` holds the episodes.

    Raises:
        UnknownEnvError: ``env_id`` is not registered.
        EnvConfigError: Bad ``env_options``.
        ModelLoadError: ``model`` is a directory that cannot be loaded.
        ValueError: Bad counts or seeds, or an engine without ``fmt``.
    """
    if constrain_tool_calls and engine is not None and engine.kind == "sglang":
        raise ValueError(
            "--constrain-tool-calls needs the in-process engine (--engine torch): a server engine does "
            "not apply the grammar"
        )
    specs = eval_episodes(
        env_id, episodes, k, first_seed=first_seed, env_options=env_options, oracle_prefix=oracle_prefix
    )
    validate_env_options(env_id, env_options)  # a typo fails in milliseconds, before the model loads
    if oracle_prefix is not None:
        require_oracle(env_id, f"oracle_prefix={oracle_prefix}")
    config = RolloutConfig(
        max_concurrent=max_concurrent,
        max_turns=max_turns,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        env_isolation=isolation,
        constrain_tool_calls=constrain_tool_calls,
        copy_tool_arguments=copy_tool_arguments,
    )
    used_spec: bool | None
    used: Engine
    if isinstance(model, str | Path):
        runtime = _load(model, config, speculate, progress, engine, ray, device, spec_options)
        used, scheduler, close = runtime.engine, runtime.scheduler, runtime.close
        name = str(model)
        remote = engine is not None and engine.kind == "sglang"
        used_spec = None if remote else speculate
        if remote:
            name = f"{model} @ {engine.url}"  # type: ignore[union-attr]
    elif fmt is None:
        raise ValueError("run_eval with an engine instance needs fmt=ChatFormat(...) for its tokenizer")
    else:
        used, name, used_spec = model, type(model).__name__, None
        scheduler = RolloutScheduler(used, fmt, config, progress=progress)
        close = scheduler.close  # the engine is the caller's: only the env processes end here
    try:
        t0 = time.perf_counter()
        batch = rollout_sync(scheduler, specs)
        wall_s = time.perf_counter() - t0
    finally:
        close()
    trajectories = list(batch.trajectories)
    if trace_path is not None:
        write_trace(trace_path, trajectories)
    return summarize(
        trajectories,
        k=k,
        model=name,
        temperature=temperature,
        seed=seed,
        wall_s=wall_s,
        spec=used_spec,
        metrics=batch.metrics,
        constrained=constrain_tool_calls,
        copied=copy_tool_arguments,
        oracle_prefix=oracle_prefix,
    )


def _load(
    model_dir: str | Path,
    config: RolloutConfig,
    speculate: bool,
    progress: ProgressCallback | None,
    engine: EngineConfig | None,
    ray: RayConfig | None = None,
    device: str = "cpu",
    options: SpecSection | None = None,
) -> Runtime:
    """The runtime of a model directory, or :class:`ModelLoadError`.

    With ``speculate``: a fresh tree cache and ``options.run_ahead``, as ``train`` builds them.
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"model directory {str(path)!r} does not exist")
    where = resolve_device(device)  # a ValueError naming the device: bad arguments, not a bad model
    try:
        options = options or SpecSection()
        cache = TreeCache(options.cache) if speculate and (engine is None or engine.kind == "torch") else None
        return build_runtime(
            path,
            config,
            draft_source=cache,
            spec=options,
            run_ahead=options.run_ahead if speculate else None,  # as train: in-process, Ray or a server
            progress=progress,
            engine=engine,
            ray=ray,
            device=where,
        )
    except Exception as exc:  # checkpoint, tokenizer and template errors all mean "cannot load"
        raise ModelLoadError(f"cannot load the model in {str(path)!r}: {type(exc).__name__}: {exc}") from exc


class EvalOptions(TypedDict, total=False):
    """The :func:`run_eval` keyword arguments :func:`eval_command` passes on (each as typed there)."""

    fmt: ChatFormat | None
    max_turns: int | None
    max_concurrent: int
    seed: int
    first_seed: int
    env_options: dict[str, Any] | None
    speculate: bool
    engine: EngineConfig | None
    ray: RayConfig | None
    device: str
    spec_options: SpecSection | None
    isolation: Literal["thread", "process"] | None
    constrain_tool_calls: bool
    copy_tool_arguments: bool
    oracle_prefix: float | None


def failure_examples(trajectories: Sequence[Trajectory]) -> dict[str, tuple[int, str]]:
    """Failed episodes per reason category: how many, and the first one's full reason."""
    out: dict[str, tuple[int, str]] = {}
    for t in trajectories:
        if t.status == "failed":
            why = reason_category(t.reason)
            n, example = out.get(why, (0, t.reason))
            out[why] = (n + 1, example)
    return out


def eval_command(
    env_id: str,
    model: str | Path | Engine,
    *,
    episodes: int = 16,
    k: int = 1,
    temperature: float = 1.0,
    max_new_tokens: int = 512,
    json_path: str | Path | None = None,
    trace_path: str | Path | None = None,
    console: Console | None = None,
    max_failed: float = 0.1,
    **options: Unpack[EvalOptions],
) -> int:
    """What ``srt-agent eval`` runs: evaluate with a progress bar, print the table, write files.

    Args:
        env_id: Registered env id.
        model: Model directory (or an engine instance, with ``fmt=`` in ``options``).
        episodes: Tasks to evaluate.
        k: Trials per task.
        temperature: Sampling temperature.
        max_new_tokens: Most tokens per turn.
        json_path: Write :meth:`EvalReport.flat` here (sorted keys, indented).
        trace_path: Write the JSONL trace here.
        console: Where to print (default: stdout).
        max_failed: The share of failed episodes (env, template or engine errors) above which the
            run exits 1; the failures are reported either way.
        **options: More :func:`run_eval` keyword arguments (:class:`EvalOptions`).

    Returns:
        The exit code: 0 done, 1 done but more than ``max_failed`` of the episodes failed (env,
        template or engine errors), 2 bad arguments (unknown env, bad options, unloadable model, bad counts).
    """
    out = console or make_console()
    try:
        # Checked before the run: results that cannot be written after it would be lost.
        check_outputs((json_path, "--json"), (trace_path, "--trace"))
        with RolloutProgress(episodes * k, description=env_id, console=out) as bar:
            report = run_eval(
                env_id,
                model,
                episodes=episodes,
                k=k,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                progress=bar,
                trace_path=trace_path,
                **options,
            )
    except (UnknownEnvError, EnvConfigError, ModelLoadError, OutputPathError, ValueError) as exc:
        return print_error(out, exc)
    out.print(report.table())
    if trace_path is not None:
        out.print(f"[dim]wrote {trace_path}[/dim]")
    write_json(out, json_path, report.flat())
    if report.failed:
        out.print(f"[red]{report.failed} episode(s) failed[/red]; see the log for the errors")
        for why, (n, example) in failure_examples(report.trajectories).items():
            out.print(f"  {n} x {why}, e.g. {example}", markup=False, highlight=False)
        if report.failed > max_failed * report.episodes:
            return 1
    return 0
