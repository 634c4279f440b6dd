"""``srt-agent bench rollout``: multi-round rollouts with and without SRT, and peers, on one model.

The workload: for each env, ``prompts`` tasks (env seeds ``first_env_seed ..``) times ``samples``
trials each (a GRPO-style group), ``rounds`` rounds over the same prompt set, temperature 1 by
default. Between rounds the policy drifts: every configuration gets the same small update
(:func:`~srt_agent.speed.peers.drift_weights`: Gaussian noise of ``drift`` times each
tensor's standard deviation, seeded per round), standing in for one RL step. Round ``r`` uses the
same sampling seeds in every configuration (derived from the episode ids, which carry the round),
so TorchEngine configurations generate the same tokens whatever they speculate (exact verification
with per-request seeds); the HF peers sample with HF's generator, so only their episodes and
settings match.

Configurations (:data:`CONFIGS`), all in one process and interleaved round by round (their order
rotating each round), so that load on a shared machine hits them alike:

* ``off``: TorchEngine without a draft source (plain decoding; the reference of every ratio);
* ``eager``: ``off`` in float32 without CUDA graphs: the engine as it ran before static steps (on a
  CPU it is ``off`` again, so its ratio reads ~1);
* ``srt``: TorchEngine + TreeCache as a run config gets them by default (run-ahead of announced
  next-round prompts and known tool results by ``spec.run_ahead``: ``auto``, on a GPU only);
* ``srt_runahead`` / ``srt_no_runahead``: the same with run-ahead forced on / off;
* ``useless``: TorchEngine speculating from random drafts (the cache's content disabled);
* ``cache_only``: TorchEngine + TreeCache with speculation off: the cache takes every committed
  token and is never asked for a draft, so its ratio is the cost of the cache's upkeep alone;
* ``hf_generate``: HF ``generate()`` through :class:`~srt_agent.speed.peers.HFEngine`
  (static batches of the requests that arrive together), first ``hf_rounds`` rounds only;
* ``prompt_lookup``: HF prompt lookup decoding (``prompt_lookup_num_tokens=10``), which HF supports
  only at batch size 1: requests run one at a time; first ``hf_rounds`` rounds only;
* ``latency_srt`` / ``latency_srt_no_runahead``: ``srt`` / ``srt_no_runahead`` with ``latency_s``
  added to every tool-calling env step (simulated slow tools), where run-ahead has time to work;
* ``server``: an ``SGLangEngine`` client of the server at ``server_url`` (SGLang with srt-agent's
  drafter, or ``srt-agent serve``), run only when a URL is given; it drafts on its side.

Every ratio is "speed relative to ``off``": ``off`` wall-clock over the configuration's wall-clock on
the same rounds (> 1: faster than plain decoding). The latency configurations are compared with each
other (``off`` has no latency).
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from srt_agent.chat.template import ChatFormat
from srt_agent.config.sections import SpecSection
from srt_agent.contracts.generation import Engine, GenerationRequest, SamplingParams
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig, RunAheadConfig
from srt_agent.rollout.metrics import RolloutMetrics
from srt_agent.rollout.scheduler import RolloutScheduler, rollout_sync
from srt_agent.tree_cache.options import TreeCacheConfig

if TYPE_CHECKING:
    from srt_agent.engine.torch_engine import TorchEngine

log = logging.getLogger(__name__)

CONFIGS = (
    "off",
    "eager",
    "srt",
    "srt_runahead",
    "srt_no_runahead",
    "useless",
    "cache_only",
    "hf_generate",
    "prompt_lookup",
    "latency_srt",
    "latency_srt_no_runahead",
    "server",
)
"""Every configuration the benchmark knows, in table order."""

HF_CONFIGS = ("hf_generate", "prompt_lookup")
DTYPES: dict[str, torch.dtype | None] = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}
"""``--dtype`` names (``auto``: the engine's default for the device)."""
LATENCY_CONFIGS = ("latency_srt", "latency_srt_no_runahead")


@dataclass(frozen=True)
class RolloutBenchConfig:
    """What ``srt-agent bench rollout`` runs.

    Attributes:
        model_dir: HF Llama/Qwen2 directory with a tokenizer and chat template.
        envs: Env ids; each gets its own batch per round.
        prompts: Tasks per env (env seeds ``first_env_seed ..``).
        samples: Trials per task (a GRPO group).
        rounds: Rollout rounds over the same prompts (>= 1; the issue asks for >= 5).
        hf_rounds: Rounds the HF peers run (they are slow; compared with ``off`` on the same rounds).
        temperature: Sampling temperature.
        max_new_tokens: Most tokens per turn.
        max_turns: Env turn limit (``max_turns`` env option), bounding an episode's length.
        drift: Policy update between rounds: noise std as a fraction of each tensor's std.
        latency_s: Tool latency of the latency configurations.
        threads: Torch threads.
        max_batch_size: Engine batch (also the rollout's ``max_concurrent``).
        seed: Base of sampling seeds and of the weight drift.
        first_env_seed: Env seed of the first task.
        configs: Configurations to run (``off`` is always run: it is every ratio's reference).
        max_draft_tokens: Draft budget per row of the speculating configurations (``None``: the
            ``spec_options`` value).
        backoff_window: The tree caches' suffix back-off (``spec.cache.backoff_window``; 0: off;
            ``None``: the ``spec_options`` value).
        draws: How verify steps draw (``spec.draws``: ``auto``, ``walk`` or ``all``; ``None``:
            the ``spec_options`` value).
        spec_options: A run config's ``spec`` section (tree cache, engine options, run-ahead)
            that the speculating configurations start from (``None``: the defaults); the three
            options above override it where given.
        device: Torch device of every engine (``cpu`` or ``cuda``).
        dtype: The TorchEngine configurations' dtype (``auto``: bfloat16 on a GPU, float32 on a
            CPU; or ``float32``, ``bfloat16``); ``eager`` always runs float32.
        server_url: The server of the ``server`` configuration (which runs only with one).
        profile_dir: If given, ``off`` and ``srt`` each run one more round, untimed, under
            torch.profiler, and its tables go to ``profile_dir/<config>.txt``
            (:func:`~srt_agent.speed.profiling.profile_engine`: each kind of step's host and
            device time, then the kernels and operators).
    """

    model_dir: Path
    envs: tuple[str, ...] = ("srt/Calculator-v0", "srt/Retail-v0")
    prompts: int = 8
    samples: int = 4
    rounds: int = 5
    hf_rounds: int = 1
    temperature: float = 1.0
    max_new_tokens: int = 128
    max_turns: int = 8
    drift: float = 0.002
    latency_s: float = 0.2
    threads: int = 1
    max_batch_size: int = 32
    seed: int = 0
    first_env_seed: int = 0
    configs: tuple[str, ...] = CONFIGS
    max_draft_tokens: int | None = None
    backoff_window: int | None = None
    draws: str | None = None
    spec_options: SpecSection | None = None
    device: str = "cpu"
    dtype: str = "auto"
    server_url: str | None = None
    profile_dir: Path | None = None

    def __post_init__(self) -> None:
        unknown = [c for c in self.configs if c not in CONFIGS]
        if unknown:
            raise ValueError(f"unknown bench configurations {unknown}; choose from {', '.join(CONFIGS)}")
        for name in ("prompts", "samples", "rounds", "hf_rounds", "max_new_tokens", "max_turns", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.envs:
            raise ValueError("envs must name at least one env")
        if "off" not in self.configs:
            object.__setattr__(self, "configs", ("off", *self.configs))
        if self.server_url is None and "server" in self.configs:
            if self.configs != CONFIGS:
                raise ValueError("the server configuration needs a server URL (--url)")
            object.__setattr__(self, "configs", tuple(c for c in self.configs if c != "server"))
        elif self.server_url is not None and "server" not in self.configs:
            object.__setattr__(self, "configs", (*self.configs, "server"))
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.backoff_window is not None and self.backoff_window < 0:
            raise ValueError(f"backoff_window must be >= 0 (0: off), got {self.backoff_window}")
        self.spec_configs()  # their own validation (a ValueError naming the field and its bounds)
        if torch.device(self.device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asks for CUDA, which this torch cannot see; use cpu")

    def spec_configs(self) -> tuple[TreeCacheConfig, SpecConfig]:
        """The tree cache's and the engine's speculation settings of the speculating configurations."""
        base = self.spec_options or SpecSection()
        cache = base.cache
        if self.backoff_window is not None:  # validated: the tree cache's own bounds hold
            cache = TreeCacheConfig.model_validate(
                {**cache.model_dump(), "backoff_window": self.backoff_window}
            )
        limits: dict[str, Any] = {}
        if self.draws is not None:
            limits["draws"] = self.draws
        if self.max_draft_tokens is not None:
            limits["max_draft_tokens"] = self.max_draft_tokens
        # The section itself travels (a SpecSection is a SpecConfig): no round trip through dicts.
        return cache, SpecSection.model_validate({**base.model_dump(), **limits}) if limits else base

    def run_ahead(self, *, force: bool = True) -> RunAheadConfig:
        """The run-ahead settings of a configuration: ``spec_options``'s, forced on unless not ``force``."""
        base = self.spec_options.run_ahead if self.spec_options is not None else RunAheadConfig()
        return base.model_copy(update={"enabled": True}) if force else base


@dataclass(frozen=True)
class RoundResult:
    """One configuration's batch of one env in one round.

    Attributes:
        config: The configuration.
        env_id: The env (its base id, also for latency configurations).
        round: 0-based round.
        metrics: What the batch measured (its ``wall_s`` is the batch's wall-clock).
        success_rate: Share of solved episodes.
        token_prob: Mean probability of the sampled tokens (``exp`` of their logprobs): the chance
            that one independent sample from the policy drafts the sampled token, a reference for
            acceptance at this temperature.
    """

    config: str
    env_id: str
    round: int
    metrics: RolloutMetrics
    success_rate: float
    token_prob: float


@dataclass
class _Arm:
    """One configuration: its engine and scheduler, and the env ids it rolls out."""

    name: str
    engine: Engine
    scheduler: RolloutScheduler
    rounds: int
    env_ids: dict[str, str]  # base env id -> the id rolled out (a latency wrapper for some)
    start_s: float = 0.0  # building the engine (model load, warm-up) and the untimed first generation
    results: list[RoundResult] = field(default_factory=list)


def episodes_of(
    config: RolloutBenchConfig, env_id: str, round_: int, *, rolled_id: str = ""
) -> list[EpisodeRequest]:
    """The episodes of one env in one round (ids carry the round, so sampling seeds differ by round)."""
    rolled = rolled_id or env_id
    options = {"max_turns": config.max_turns}
    return [
        EpisodeRequest(
            rolled,
            seed=config.first_env_seed + i,
            trial=j,
            episode_id=f"r{round_}/{env_id}/{config.first_env_seed + i}/{j}",
            env_options=options,
        )
        for i in range(config.prompts)
        for j in range(config.samples)
    ]


def _make_arm(name: str, config: RolloutBenchConfig, fmt: ChatFormat) -> _Arm:
    from srt_agent.engine.hf_checkpoint import read_config
    from srt_agent.runtime import build_runtime
    from srt_agent.serving.engine_config import EngineConfig
    from srt_agent.speed.peers import HFEngine, UselessDrafts, register_latency_env
    from srt_agent.tree_cache import TreeCache

    rollout = RolloutConfig(
        max_concurrent=config.max_batch_size,
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
    )
    engine: Engine
    start = time.perf_counter()
    if name in HF_CONFIGS:  # the peers: HF's own generation, wired by hand (not TorchEngine)
        if name == "prompt_lookup":  # HF supports prompt lookup only at batch size 1
            engine = HFEngine(config.model_dir, prompt_lookup=10, device=config.device)
        else:
            engine = HFEngine(config.model_dir, max_batch_size=config.max_batch_size, device=config.device)
        scheduler = RolloutScheduler(engine, fmt, rollout)
    elif name == "server":
        remote = EngineConfig(kind="sglang", url=config.server_url)
        runtime = build_runtime(config.model_dir, rollout, fmt=fmt, engine=remote)
        engine, scheduler = runtime.engine, runtime.scheduler
    else:
        source: Any = None
        cache_config, spec = config.spec_configs()
        if name == "useless":
            source = UselessDrafts(read_config(config.model_dir).vocab_size, seed=config.seed)
        elif name not in ("off", "eager"):
            source = TreeCache(cache_config)
        if name == "cache_only":
            spec = spec.model_copy(update={"enabled": False})
        runtime = build_runtime(
            config.model_dir,
            rollout,
            draft_source=source,
            spec=spec,
            run_ahead=config.run_ahead(force=name != "srt")
            if name in ("srt", "srt_runahead", "latency_srt")
            else None,
            fmt=fmt,
            device=config.device,
            dtype=torch.float32 if name == "eager" else DTYPES[config.dtype],
            cuda_graphs=False if name == "eager" else None,
        )
        engine, scheduler = runtime.engine, runtime.scheduler
    latency = name in LATENCY_CONFIGS
    env_ids = {e: register_latency_env(e, config.latency_s) if latency else e for e in config.envs}
    rounds = min(config.hf_rounds, config.rounds) if name in HF_CONFIGS else config.rounds
    _warm_up(engine, fmt)
    return _Arm(name, engine, scheduler, rounds, env_ids, start_s=time.perf_counter() - start)


def _warm_up(engine: Engine, fmt: ChatFormat) -> None:
    """A short generation before timing: allocator, thread pools and kernels warm up untimed.

    Greedy from a fixed text, so it adds nothing random (a speculating engine's cache does see it).
    """
    prompt = tuple(fmt.encode("Warm-up: count from one to ten."))
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    engine.generate([GenerationRequest("bench-warm-up", prompt, params)])


PROFILED_CONFIGS = ("off", "srt")
"""The configurations that ``profile_dir`` profiles (one extra, untimed round each)."""


def _profile_round(arm: _Arm, engine: TorchEngine, config: RolloutBenchConfig, folder: Path) -> None:
    """One more round of ``arm``'s envs under torch.profiler, outside every timed figure."""
    from srt_agent.speed.profiling import profile_engine

    r = config.rounds  # after the timed rounds: same weights as the last, new sampling seeds

    def work() -> None:
        for env_id in config.envs:
            _run_batch(arm, config, env_id, r)

    title = f"{arm.name}, an extra round after the timed ones: {', '.join(config.envs)}"
    profile_engine(engine, work, folder / f"{arm.name}.txt", title)


def run_rollout_bench(
    config: RolloutBenchConfig,
    *,
    on_round: Callable[[RoundResult], None] | None = None,
    engine_figures: dict[str, float | int | str] | None = None,
) -> list[RoundResult]:
    """Run every configuration for its rounds, interleaved, and return one result per batch.

    Args:
        config: What to run.
        on_round: Called with each batch's result as it completes (progress output).
        engine_figures: If given, receives each configuration's ``<config>_engine_start_s`` (model
            load, warm-up and the untimed first generation: outside every ``wall_s``) and each
            TorchEngine configuration's static-step figures at the end: ``<config>_graph_shapes``,
            ``<config>_graph_replays``, ``<config>_graph_capture_s`` (captured mid-run: inside the
            step and prefill times, so inside ``wall_s``), ``<config>_prefill_capture_s`` (the
            prefill shapes' share of it), ``<config>_warm_up_s`` and ``<config>_warm_up_capture_s``
            (every shape captured at start-up, outside ``wall_s``), ``<config>_warm_shapes``,
            ``<config>_unwarmed_shapes`` (shapes met after warm-up that it had not built) and
            ``<config>_unwarmed_runs`` (steps and prefills run on them, each eagerly),
            ``<config>_static_eager_steps``, ``<config>_static_prefills``,
            ``<config>_prefill_replays`` (of the static prefills, graph replays),
            ``<config>_decode_steps``
            and, if a capture failed,
            ``<config>_graph_error``.

    Returns:
        Results in the order they ran.

    Raises:
        FileNotFoundError: ``config.model_dir`` does not exist.
    """
    from srt_agent.engine.hf_checkpoint import read_state_dict
    from srt_agent.engine.torch_engine import TorchEngine
    from srt_agent.speed.peers import drift_weights

    if not config.model_dir.is_dir():
        raise FileNotFoundError(f"model dir {config.model_dir} does not exist")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    fmt = ChatFormat.from_pretrained(config.model_dir)
    arms = [_make_arm(name, config, fmt) for name in CONFIGS if name in config.configs]
    weights = dict(read_state_dict(config.model_dir))
    results: list[RoundResult] = []
    try:
        for r in range(config.rounds):
            if r > 0:
                weights = drift_weights(weights, config.drift, seed=config.seed * 1000 + r)
            order = arms[r % len(arms) :] + arms[: r % len(arms)]  # rotate: no arm always goes first
            for arm in order:
                if r >= arm.rounds:
                    continue
                if r > 0:
                    arm.engine.update_weights(weights)
                for env_id in config.envs:
                    # Start every timed batch from an empty collector: a full collection walks
                    # the whole heap (0.3-0.4 s in this process, the arms' tree caches included)
                    # and otherwise lands in whichever batch happens to cross the threshold.
                    gc.collect()
                    result = _run_batch(arm, config, env_id, r)
                    arm.results.append(result)
                    results.append(result)
                    if on_round is not None:
                        on_round(result)
        if engine_figures is not None:  # before the profiled round: these counters are the timed rounds'
            for arm in arms:
                engine_figures.update(_engine_figures(arm))
        if config.profile_dir is not None:
            for arm in arms:
                if arm.name in PROFILED_CONFIGS and isinstance(arm.engine, TorchEngine):
                    _profile_round(arm, arm.engine, config, config.profile_dir)
    finally:
        for arm in arms:
            arm.engine.close()
        torch.set_num_threads(previous_threads)
    return results


def _engine_figures(arm: _Arm) -> dict[str, float | int | str]:
    """A TorchEngine arm's static-step counters (none for HF peers and servers)."""
    from srt_agent.engine.torch_engine import TorchEngine

    start: dict[str, float | int | str] = {f"{arm.name}_engine_start_s": round(arm.start_s, 3)}
    if not isinstance(arm.engine, TorchEngine):
        return start
    stats = arm.engine.stats()
    midrun = stats.graph_capture_s - stats.warm_up_capture_s
    midrun_prefill = stats.prefill_capture_s - stats.warm_up_prefill_capture_s
    out: dict[str, float | int | str] = {
        **start,
        f"{arm.name}_graph_shapes": stats.graph_shapes,
        f"{arm.name}_graph_replays": stats.graph_replays,
        f"{arm.name}_graph_capture_s": round(midrun, 3),
        f"{arm.name}_prefill_capture_s": round(midrun_prefill, 3),
        f"{arm.name}_warm_up_s": round(stats.warm_up_s, 3),
        f"{arm.name}_warm_up_capture_s": round(stats.warm_up_capture_s, 3),
        f"{arm.name}_warm_shapes": stats.warm_shapes,
        f"{arm.name}_unwarmed_shapes": stats.unwarmed_shapes,
        f"{arm.name}_unwarmed_runs": stats.unwarmed_runs,
        f"{arm.name}_static_eager_steps": stats.static_eager_steps,
        f"{arm.name}_static_prefills": stats.static_prefills,
        f"{arm.name}_prefill_replays": stats.static_prefill_replays,
        f"{arm.name}_decode_steps": stats.decode_steps,
    }
    if stats.graph_error is not None:
        out[f"{arm.name}_graph_error"] = stats.graph_error
    return out


def _run_batch(arm: _Arm, config: RolloutBenchConfig, env_id: str, r: int) -> RoundResult:
    rolled = arm.env_ids[env_id]
    specs = episodes_of(config, env_id, r, rolled_id=rolled)
    if arm.scheduler.runahead is not None and r + 1 < config.rounds:
        # The trainer knows its next batch: announce it (same prompts, next round's episode ids).
        arm.scheduler.announce(episodes_of(config, env_id, r + 1, rolled_id=rolled))
    t0 = time.perf_counter()
    batch = rollout_sync(arm.scheduler, specs)
    wall = time.perf_counter() - t0
    trajectories = batch.trajectories
    probs = [math.exp(lp) for t in trajectories for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m]
    tokens = len(probs)
    return RoundResult(
        config=arm.name,
        env_id=env_id,
        round=r,
        metrics=replace(batch.metrics, wall_s=wall),
        success_rate=sum(t.success for t in trajectories) / len(trajectories),
        token_prob=sum(probs) / tokens if tokens else 0.0,
    )


def totals(results: Sequence[RoundResult], config: str, rounds: int | None = None) -> dict[str, float]:
    """Sums over a configuration's batches (the first ``rounds`` rounds only, if given)."""
    rows = [x for x in results if x.config == config and (rounds is None or x.round < rounds)]
    m = [x.metrics for x in rows]
    tokens = sum(x.live_tokens for x in m)
    forwards = sum(x.live_forward_passes for x in m)
    drafted = sum(x.spec.nodes_drafted for x in m)
    accepted = sum(x.spec.nodes_accepted for x in m)
    steps = sum(x.spec.drafted_row_steps for x in m)
    lookups = sum(x.draft_lookups for x in m)
    out = {
        "batches": float(len(rows)),
        "wall_s": sum(x.wall_s for x in m),
        "tokens": float(tokens),
        "tokens_per_forward": tokens / forwards if forwards else 0.0,
        "target_forwards": float(sum(x.spec.target_forwards for x in m)),
        "forward_s": sum(x.spec.forward_s + x.spec.verify_s for x in m),
        "verify_s": sum(x.spec.verify_s for x in m),
        "draft_s": sum(x.spec.draft_s for x in m),
        "prefill_s": sum(x.spec.prefill_s for x in m),
        "idle_s": sum(x.spec.idle_s for x in m),
        "driver_s": sum(x.idle_s for x in m),
        "prefill_forwards": float(sum(x.spec.prefill_forwards for x in m)),
        "verify_forwards": float(sum(x.spec.verify_forwards for x in m)),
        "prefill_rows": float(sum(x.spec.prefill_rows for x in m)),
        "prefill_tokens": float(sum(x.spec.prefill_tokens for x in m)),
        **{
            key: sum(getattr(x.spec, key) for x in m)
            for key in (
                "decode_step_s",
                "verify_step_s",
                "decode_device_s",
                "verify_device_s",
                "prefill_device_s",
            )
        },
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted": accepted / steps if steps else 0.0,
        "runahead_tokens": float(sum(x.spec.runahead_tokens for x in m)),
        "runahead_accepted_tokens": float(sum(x.spec.runahead_nodes_accepted for x in m)),
        "success_rate": sum(x.success_rate for x in rows) / len(rows) if rows else 0.0,
        "token_prob": sum(x.token_prob * x.metrics.live_tokens for x in rows) / tokens if tokens else 0.0,
    }
    for source in ("exact", "task", "global"):
        hits = sum(x.spec.drafts_by_source.get(source, 0) for x in m)
        out[f"hit_rate_{source}"] = hits / lookups if lookups else 0.0
    checks = sum(x.runahead.prediction_checks for x in m)
    out["prediction_hit_rate"] = sum(x.runahead.prediction_hits for x in m) / checks if checks else 0.0
    return out
