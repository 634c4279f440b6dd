"""The in-process RL trainer: SRT rollouts -> advantages -> policy updates -> new weights to the engine.

One step (:meth:`Trainer.train_step`)::

    specs = step_episodes(cfg, step)                 # prompts_per_step tasks x n samples
    batch = rollouts.rollout(specs, announce=next)   # TorchEngine + TreeCache (SRT); next step's
                                                     # prompts go to the run-ahead queue
    (every trainer.baseline_every steps: the same specs again with speculation off -> srt_speedup)
    prep = learner.prepare(trajectories)             # rewards, KL penalty, advantages
    stats = learner.update(prep)                     # epochs x mini-batches of AdamW updates
    rollouts.push_weights(policy)                    # the engine samples from the new policy

Failed episodes (an env or tool that crashed, an engine abort) are counted in ``failed`` and left
out of the update; the step goes on. Checkpoints (:mod:`srt_agent.train.checkpoint`) are atomic,
and :class:`Trainer` with ``resume=True`` continues from the newest complete one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srt_agent.algo import informative_mask, prompt_groups
from srt_agent.chat.template import ChatFormat
from srt_agent.config import ConfigError, RunConfig, load_config
from srt_agent.contracts.speculation import SpecStats, spec_sum
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.devices import resolve_device
from srt_agent.engine.constraint import CallMasks, Vocabulary
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.errors import SrtAgentError, describe_fault
from srt_agent.evaluation.report import slug
from srt_agent.train.checkpoint import (
    Checkpoint,
    NonFiniteWeights,
    check_finite,
    clean_partial,
    latest_checkpoint,
    nested_values,
    resume_order,
    rng_state,
    set_rng_state,
    weights_file,
    write_checkpoint,
)
from srt_agent.train.learner import Learner
from srt_agent.train.metrics_log import MetricsLogger
from srt_agent.train.optim import build_optimizer
from srt_agent.train.policy_model import VALUE_HEAD_FILE, PolicyModel, load_reference
from srt_agent.train.rollouts import Rollouts, StepRollout
from srt_agent.train.step_metrics import rollout_metrics, token_match
from srt_agent.train.tasks import step_episodes
from srt_agent.train.train_progress import TrainProgress
from srt_agent.tree_cache import TreeCache

log = logging.getLogger("srt_agent.train")

CONFIG_FILE = "config.yaml"


class TrainError(SrtAgentError, RuntimeError):
    """A run cannot start as configured; the message names the problem and the fix."""


def _device(name: str) -> torch.device:
    """``trainer.device`` as a torch device (see :func:`srt_agent.devices.resolve_device`)."""
    try:
        return resolve_device(name)
    except ValueError as exc:
        raise TrainError(f"trainer.device: {exc}") from None


@dataclass
class RunState:
    """What a checkpoint carries besides weights, optimizer and RNG (``state.json``).

    Attributes:
        step: Completed training steps.
        eval_before: The held-out evaluation before training (``success_rate``, ...).
        last_eval: The step of the latest held-out evaluation (-1: none yet).
        checkpoint_s: Seconds spent writing checkpoints so far.
        announced: Whether the scheduler accepted run-ahead announcements.
    """

    step: int = 0
    eval_before: dict[str, float] | None = None
    last_eval: int = -1
    checkpoint_s: float = 0.0
    announced: bool = False


class Trainer:
    """Trains the policy of a :class:`RunConfig` in this process.

    Args:
        cfg: The run config; ``model.dir`` must hold a model (build it first).
        resume: Continue from the newest complete checkpoint in ``trainer.out_dir`` (a fresh start
            if there is none).
        progress: Where to show progress (default: none).

    Raises:
        TrainError: A fresh run's ``out_dir`` already holds checkpoints, or the device is missing.
    """

    def __init__(
        self, cfg: RunConfig, *, resume: bool = False, progress: TrainProgress | None = None
    ) -> None:
        self.cfg = cfg
        t = cfg.trainer
        self._threads_before = torch.get_num_threads()
        if t.threads is not None:
            torch.set_num_threads(t.threads)  # process-wide; restored by close()
        if cfg.rollout.top_p < 1.0:
            log.warning(
                "rollout.top_p = %s: the learner's logprobs do not reproduce the truncated sampling "
                "distribution, so PPO ratios near the cut are biased; use rollout.top_p=1 for training",
                cfg.rollout.top_p,
            )
        self.device = _device(t.device)
        self.out_dir = Path(t.out_dir)
        clean_partial(self.out_dir)
        existing = latest_checkpoint(self.out_dir)
        if existing is not None and not resume:
            raise TrainError(
                f"{self.out_dir} already holds checkpoints of a run (step {existing.step}); pass --resume "
                "to continue it, or set trainer.out_dir to a new directory"
            )
        self.resume_notes: list[str] = []
        """Checkpoints passed over when resuming, and why (also logged as warnings)."""
        self._losses_finite = True
        self.fmt = ChatFormat.from_pretrained(cfg.model.dir)
        reference = load_reference(cfg.model.dir, self.device) if cfg.algo.kl.coef > 0 else None
        ckpt, cache = self._start(resume, existing, reference)
        self.resumed_from = ckpt.step if ckpt is not None else 0
        self.progress = progress or TrainProgress(t.steps, self.resumed_from, disable=True)
        # On Ray each replica drafts from a cache of its own: a checkpoint keeps one file per replica.
        replica_caches = ckpt.path if ckpt is not None else None
        self.rollouts = Rollouts(cfg, Path(cfg.model.dir), self.fmt, cache, self.device, replica_caches)
        if ckpt is not None:  # the engines load the starting checkpoint: give them the trained weights
            self.rollouts.push_weights(self.policy.lm_state_dict())
        self.learner.call_masks = self._call_masks()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / CONFIG_FILE).write_text(cfg.to_yaml())
        self.metrics = MetricsLogger(self.out_dir, t.log, ckpt.step if ckpt is not None else None)

    # ------------------------------------------------------------------ checkpoints
    def _start(
        self, resume: bool, existing: Checkpoint | None, reference: Any
    ) -> tuple[Checkpoint | None, TreeCache]:
        """Start fresh, or from the newest checkpoint that is intact, loads, and whose weights are finite.

        Checkpoints passed over are noted in :attr:`resume_notes` (and logged) with the reason, one
        line each: ``"step-000012: model/model.safetensors holds non-finite values (NaN in '...')"``.

        Raises:
            TrainError: ``resume`` and no checkpoint can be resumed from (or there is none).
        """
        if not resume:
            return None, self._load(None, reference)
        for ckpt, why in resume_order(self.out_dir):
            if not why:
                try:
                    return ckpt, self._load(ckpt, reference)
                except NonFiniteWeights as exc:  # the files are as written, but hold NaN or inf
                    why = str(exc)
                except Exception as exc:  # noqa: BLE001 - any load failure: try the next checkpoint
                    why = f"could not be loaded ({_one_line(exc)})"
            line = f"{ckpt.path.name}: {why}"
            self.resume_notes.append(line)
            log.warning("not resuming from %s", line)
        if existing is None and not self.resume_notes:
            held = self.out_dir.exists() and any(self.out_dir.iterdir())
            leftovers = " (it holds files of a run, but no complete checkpoint)" if held else ""
            raise TrainError(
                f"--resume: nothing to resume in {self.out_dir}{leftovers}; run without --resume to start "
                "a fresh run, or point trainer.out_dir at the run to continue"
            )
        notes = "; ".join(self.resume_notes)
        raise TrainError(f"--resume: no checkpoint in {self.out_dir} can be resumed: {notes}")

    def _load(self, ckpt: Checkpoint | None, reference: Any) -> TreeCache:
        """Load the policy, learner and state of ``ckpt`` (``None``: the starting model, seeded)."""
        cfg = self.cfg
        start_dir = ckpt.model_dir if ckpt is not None else cfg.model.dir
        self.policy = PolicyModel.load(start_dir, self.device, value_head=cfg.algo.uses_critic)
        if ckpt is not None:  # the manifest proves the bytes are as written, not that they are finite
            model_dir = ckpt.model_dir
            check_finite(lambda name: weights_file(model_dir, name), self.policy.lm.state_dict().items())
            if self.policy.value_head is not None and (model_dir / VALUE_HEAD_FILE).is_file():
                check_finite(f"model/{VALUE_HEAD_FILE}", self.policy.value_head.state_dict().items())
        optimizer, scheduler = build_optimizer(self.policy, cfg)
        self.learner = Learner(self.policy, optimizer, scheduler, cfg, self.device, reference)
        self.state = RunState()
        if ckpt is None:
            random.seed(cfg.trainer.seed)
            np.random.seed(cfg.trainer.seed)
            torch.manual_seed(cfg.trainer.seed)
            return TreeCache(cfg.spec.cache)
        return self._restore(ckpt)

    def _call_masks(self) -> CallMasks | None:
        """The masks the learner scores constrained tokens under (``None``: calls are not constrained).

        With constrained calls the learner must score what the engine sampled: the masked policy.
        An in-process CPU engine's own masks, whose cache holds every mask the rollout walked;
        otherwise a CPU cache of the learner's own (an accelerator's masks would stay in its memory
        for the whole step, one per distinct state of the batch).
        """
        if not self.cfg.rollout.constrain_tool_calls:
            return None
        engine = self.rollouts.engine
        if isinstance(engine, TorchEngine) and engine.device.type == "cpu":
            return engine.call_masks()
        vocabulary = Vocabulary(self.fmt.tokenizer, int(self.policy.hf.config.vocab_size))
        return CallMasks(vocabulary, torch.device("cpu"))

    def _restore(self, ckpt: Checkpoint) -> TreeCache:
        """Load optimizer, scheduler, RNG and run state; return the checkpoint's tree cache."""
        saved = torch.load(ckpt.path / "optimizer.pt", map_location=self.device, weights_only=True)
        self.learner.optimizer.load_state_dict(saved["optimizer"])
        self.learner.scheduler.load_state_dict(saved["scheduler"])
        check_finite("optimizer.pt", self._optimizer_values())
        set_rng_state(torch.load(ckpt.path / "rng.pt", weights_only=True))
        known = {f.name for f in dataclasses.fields(RunState)}
        self.state = RunState(**{k: v for k, v in ckpt.state.items() if k in known})
        self.state.step = ckpt.step
        changed = _config_changes(ckpt.path / CONFIG_FILE, self.cfg)
        if changed:
            log.warning("resuming with settings changed since the checkpoint: %s", ", ".join(changed))
        if ckpt.cache_file.is_file():
            return TreeCache.load(ckpt.cache_file, self.cfg.spec.cache)
        return TreeCache(self.cfg.spec.cache)

    def _optimizer_values(self) -> Iterator[tuple[str, Any]]:
        """The loaded optimizer and scheduler state, named for :func:`check_finite` messages."""
        optimizer = self.learner.optimizer
        names = {id(p): name for name, p in self.policy.named_parameters()}
        for param, values in optimizer.state.items():
            for key, value in values.items():
                yield f"{key} of {names.get(id(param), '?')}", value
        yield from nested_values("param_groups", optimizer.param_groups)
        yield from nested_values("scheduler", self.learner.scheduler.state_dict())

    def save_checkpoint(self) -> Checkpoint:
        """Write an atomic checkpoint of the current step."""
        t0 = time.perf_counter()
        learner = self.learner

        def write(path: Path) -> None:
            self.policy.save(path / "model", self.fmt.tokenizer)
            optim = {"optimizer": learner.optimizer.state_dict(), "scheduler": learner.scheduler.state_dict()}
            torch.save(optim, path / "optimizer.pt")
            torch.save(rng_state(), path / "rng.pt")
            self.rollouts.save_caches(path)
            (path / CONFIG_FILE).write_text(self.cfg.to_yaml())

        state = dataclasses.asdict(self.state)
        # Pruning keeps the newest checkpoint with finite weights and losses, and resuming skips
        # the others: a run that diverged to NaN can go back to before it.
        state["finite"] = self._losses_finite and all(
            bool(torch.isfinite(p).all()) for p in self.policy.parameters()
        )
        if not state["finite"]:
            log.warning("step %d: the weights or losses are not finite (NaN or inf)", self.state.step)
        ckpt = write_checkpoint(self.out_dir, self.state.step, state, write)
        self.state.checkpoint_s += time.perf_counter() - t0
        return ckpt

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[dict[str, Any]]:
        """Evaluate, train to ``trainer.steps`` or ``trainer.time_limit_s`` (checkpointing), evaluate again.

        Returns:
            Every metrics record of the run (steps and evaluations; see :mod:`srt_agent.train.metrics_log`).
        """
        t, state = self.cfg.trainer, self.state
        if state.eval_before is None:
            state.eval_before = self.evaluate(state.step)
        saved = state.step
        started = time.monotonic()
        while state.step < t.steps:
            step = state.step + 1
            record = self.train_step(step)
            self._losses_finite = all(
                math.isfinite(v) for k, v in record.items() if k.endswith("loss") and isinstance(v, float)
            )
            state.step = step
            self.metrics.log(record)
            self.progress.step_done(record)
            if t.eval_every and step % t.eval_every == 0:
                self.evaluate(step)
            if t.checkpoint_every and step % t.checkpoint_every == 0:
                self.save_checkpoint()
                saved = step
            if step < t.steps and t.time_limit_s is not None and time.monotonic() - started >= t.time_limit_s:
                log.warning(
                    "trainer.time_limit_s=%g reached after step %d of %d: evaluating and checkpointing now",
                    t.time_limit_s,
                    step,
                    t.steps,
                )
                break
        if state.last_eval != state.step:  # the "after" number (also after a crash during it)
            self.evaluate(state.step)
            saved = -1  # the last checkpoint predates this evaluation: save it with it
        if saved != state.step:
            self.save_checkpoint()
        return self.metrics.records()

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation of the current weights, logged as an ``eval`` record at ``step``.

        The record has ``success_rate``, ``mean_reward``, ``episodes``, ``failed``,
        ``garbled_turn_rate`` (assistant turns neither a well-formed call nor plain text),
        ``temperature``, ``eval_s``, where the env labels its tasks' kinds ``success_<kind>`` per kind,
        and where it reports how far episodes got (Retail) ``mean_progress``.
        """
        callback = self.progress.phase("eval", self.cfg.trainer.eval_episodes)
        t0 = time.perf_counter()
        report = self.rollouts.evaluate(callback)
        result = {
            "success_rate": report.success_rate,
            "mean_reward": report.mean_reward,
            "episodes": float(report.episodes),
            "failed": float(report.failed),
            "garbled_turn_rate": report.garbled_turn_rate,
            "temperature": self.cfg.eval_temperature,
            "eval_s": time.perf_counter() - t0,
        }
        # Per task kind where the env labels its tasks (Retail: cancel, return, exchange, info).
        result.update({f"success_{slug(kind)}": f.success_rate for kind, f in sorted(report.kinds.items())})
        if report.mean_progress is not None:
            result["mean_progress"] = report.mean_progress
        self.metrics.log({"kind": "eval", "step": step, "time": time.time(), **result})
        self.state.last_eval = step
        return result

    def train_step(self, step: int) -> dict[str, Any]:
        """Roll out, (maybe) time a baseline, update the policy, push the weights.

        Returns:
            The step's metrics record (``kind``, ``step``, the keys of
            :func:`~srt_agent.train.step_metrics.rollout_metrics` and of :meth:`Learner.update`,
            ``rounds``, ``trained_episodes``, for group estimators ``informative_group_share``
            (of the first round's groups, those whose rewards differ), ``learner_s``, ``sync_s``,
            ``cache_states``, ``cache_mb``, ``step_s``, and on baseline steps
            ``baseline_rollout_s``, ``srt_speedup``, ``baseline_token_match`` and
            ``baseline_first``: 1 when the baseline ran before the SRT rollout; the order alternates
            between baseline steps).
        """
        cfg, t0 = self.cfg, time.perf_counter()
        every = cfg.trainer.baseline_every
        timed = bool(every) and step % every == 0
        # The rollout right after a learner update runs slower than the next one (measured: with
        # speculation off both ways the ratio read 0.74-0.88 when the baseline always went second),
        # so the two alternate: every other baseline step times the baseline first.
        base_first = timed and (step // every) % 2 == 1
        base = self._baseline(step) if base_first else None
        got = self._collect(step)
        record: dict[str, Any] = {
            "kind": "step",
            "step": step,
            "time": time.time(),
            "rounds": float(got.rounds),
        }
        record.update(rollout_metrics(got.trajectories, got.seconds, got.spec))
        record.update(got.first.extra)
        if timed:
            if base is None:
                base = self._baseline(step)
            record["baseline_first"] = float(base_first)
            record["baseline_rollout_s"] = base.seconds
            record["srt_speedup"] = base.seconds / max(got.first.seconds, 1e-9)
            record["baseline_token_match"] = token_match(got.first.trajectories, base.trajectories)
        if cfg.algo.uses_groups:
            # A group whose rewards are all equal has zero advantage: its tokens teach nothing (and
            # under `token-mean` dilute the rest). A low share says few tasks a step can teach
            # anything, whatever the learning rate (docs/retail.md).
            groups = _groups(trainable_episodes(got.first.trajectories))
            informative = _groups(_informative(got.first.trajectories))
            record["informative_group_share"] = informative / groups if groups else 0.0
        trainable = trainable_episodes(got.train)
        record["trained_episodes"] = float(len(trainable))
        t1 = time.perf_counter()
        if trainable:
            record.update(self.learner.update(self.learner.prepare(trainable)))
            record["learner_s"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            self.rollouts.push_weights(self.policy.lm_state_dict())
            record["sync_s"] = time.perf_counter() - t2
        else:  # nothing to learn from (every episode failed, or no informative group): go on
            log.warning(
                "step %d: no trainable episode of %d; skipping the update", step, len(got.trajectories)
            )
            record.update(updates=0.0, learner_s=0.0, sync_s=0.0)
        cache = self.rollouts.cache.stats()
        record.update(cache_states=float(cache.states), cache_mb=cache.bytes / 2**20)
        record["step_s"] = time.perf_counter() - t0
        self.state.announced = self.state.announced or self.rollouts.announced
        return record

    def _baseline(self, step: int) -> StepRollout:
        """The step's first round again with speculation off (timing only)."""
        specs = step_episodes(self.cfg, step, 0)
        return self.rollouts.baseline(specs, self.progress.phase("baseline", len(specs)))

    def _collect(self, step: int) -> _Collected:
        """The step's rollouts: one round, or with dynamic sampling more until the batch is full."""
        cfg = self.cfg
        specs = step_episodes(cfg, step, 0)
        ahead = step_episodes(cfg, step + 1, 0) if step < cfg.trainer.steps else []
        first = self.rollouts.rollout(
            specs, announce=ahead, progress=self.progress.phase("rollout", len(specs))
        )
        batches = [first]
        ds = cfg.algo.dynamic_sampling
        if not ds.enabled:
            return _Collected(first, first.trajectories, first.trajectories, first.seconds, first.spec, 1)
        keep = _informative(first.trajectories)
        want = cfg.rollout.prompts_per_step
        while _groups(keep) < want and len(batches) < ds.max_rounds:
            more = step_episodes(cfg, step, len(batches))
            batch = self.rollouts.rollout(more, progress=self.progress.phase("refill", len(more)))
            batches.append(batch)
            keep += _informative(batch.trajectories)
        groups = prompt_groups(keep).tolist() if keep else []
        keep = [x for x, g in zip(keep, groups, strict=True) if g < want]  # the first `want` groups
        every = [x for b in batches for x in b.trajectories]
        seconds = sum(b.seconds for b in batches)
        return _Collected(first, every, keep, seconds, spec_sum([b.spec for b in batches]), len(batches))

    def close(self) -> None:
        """Stop the engines and close the metric sinks."""
        self.rollouts.close()
        self.metrics.close()
        torch.set_num_threads(self._threads_before)


@dataclass(frozen=True)
class _Collected:
    """A step's rollouts: the first round (what a baseline re-times), every episode, those to train on."""

    first: StepRollout
    trajectories: list[Trajectory]
    train: list[Trajectory]
    seconds: float
    spec: SpecStats
    rounds: int


def trainable_episodes(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The episodes a step can learn from: not failed, and with at least one generated token."""
    return [x for x in trajectories if x.status != "failed" and x.generated_tokens > 0]


def _informative(trajectories: list[Trajectory]) -> list[Trajectory]:
    """Dynamic sampling's filter: episodes of groups whose rewards differ (failed ones left out)."""
    ok = trainable_episodes(trajectories)
    if not ok:
        return []
    scores = torch.tensor([x.total_reward for x in ok])
    keep = informative_mask(scores, prompt_groups(ok)).tolist()
    return [x for x, k in zip(ok, keep, strict=True) if k]


def _groups(trajectories: list[Trajectory]) -> int:
    return len({(x.env_id, x.task_id, x.seed) for x in trajectories})


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """``"<Type>: <message>"`` of an exception on one bounded line (a message may echo file bytes)."""
    text = describe_fault(exc, first_line=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _config_changes(saved: Path, cfg: RunConfig) -> list[str]:
    """Dotted keys whose value differs between a checkpoint's config and ``cfg``."""
    try:
        before = load_config(saved).flat()
    except (ConfigError, OSError):  # an unreadable old config only loses the warning
        return []
    now = cfg.flat()
    return sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
