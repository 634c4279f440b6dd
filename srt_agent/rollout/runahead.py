"""Run-ahead: generation whose output only feeds the tree cache, done while live episodes wait.

While episodes wait on their tools, the engine's batch has free rows. The rollout scheduler fills
them with run-ahead requests (``priority="runahead"``): the engine reports their tokens to the
draft source (the tree cache) like any other, but their outputs never reach a trajectory, and live
requests take their rows whenever they need them (preemption is the engine's job). Two sources:

* **announced prompts** (:meth:`RunAhead.queue_announced`): the first turns of prompts the trainer
  will sample next. Their prompt tokens are rendered exactly as the live episode will render them,
  so the state key matches and the later live request gets ``exact`` drafts.
* **known tool results** (:meth:`RunAhead.predict_after_tools`): when every tool call of a turn was
  made before with the same arguments in the same env and task, the :class:`ToolMemo` knows the
  results, so the conversation after the tools can be rendered and generated from *while the real
  tools run*. Whether the prediction was right is checked when the live request for the next turn
  arrives (same state key or not) and counted.

A post-tool run-ahead works only while the real tools run: when the live request for its state
arrives, a queued job is dropped and a running one is cancelled (what it generated so far stays in
the cache and drafts the live request; generating on beside the live request would cost a batch row
each step for content the live request soon outruns, since it accepts several tokens per step). Announced
jobs run during the batch after their announcement (the trainer announces batch ``k + 1`` before
rolling out batch ``k``) and expire at its end; a prompt that is also live in that batch (the same
prompt in consecutive batches) keeps its jobs: they are extra samples for the later batch.

Sampling seeds of run-ahead requests are derived from their own counter, never from the live
requests' seeds: a run-ahead sample is an independent draw, like a sample from an earlier rollout.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from srt_agent.chat.messages import Message
from srt_agent.chat.template import ChatFormat, TokenTranscript
from srt_agent.contracts.generation import Engine, GenerationRequest, state_key
from srt_agent.rollout.config import RolloutConfig, RunAheadConfig, sampling_seed
from srt_agent.rollout.metrics import RunAheadStats
from srt_agent.rollout.tool_memo import ToolMemo
from srt_agent.tooling.grammar import ToolCallGrammar
from srt_agent.tooling.parser import parse_tool_calls

logger = logging.getLogger("srt_agent.rollout")


JobSource = Literal["announce", "tool"]


@dataclass(frozen=True)
class RunAheadJob:
    """One queued run-ahead generation.

    Attributes:
        prompt_ids: The exact token prefix to generate from.
        state_key: Its state key (what the live request will carry if the state is reached).
        task_id: The env task (for the cache's same-task fallback).
        source: ``announce`` or ``tool``.
        batch: Batches started when the job was queued (announced jobs expire after the next one).
        group: The request's ``draft_group`` (the env id where known).
        grammar: The tool-call grammar the live requests of this episode decode under
            (``rollout.constrain_tool_calls``), so a run-ahead samples what they would sample.
    """

    prompt_ids: tuple[int, ...]
    state_key: str
    task_id: str
    source: JobSource
    batch: int = 0
    group: str = ""
    grammar: ToolCallGrammar | None = None


@dataclass
class _Running:
    job: RunAheadJob
    task: asyncio.Task[None]


class RunAhead:
    """The run-ahead queue of a rollout scheduler: what to generate ahead, and when.

    All methods run on the scheduler's event loop (no locking). :meth:`pump` submits queued jobs
    while rows are spare: ``capacity`` less the episodes that hold a rollout slot and are not
    waiting on their env. It runs whenever that changes or jobs are queued.

    Args:
        engine: The engine (its draft source receives the run-ahead tokens).
        fmt: The chat format, to render predicted post-tool states.
        rollout: The rollout's sampling options (run-ahead samples like live requests).
        config: Run-ahead options.
    """

    def __init__(
        self, engine: Engine, fmt: ChatFormat, rollout: RolloutConfig, config: RunAheadConfig
    ) -> None:
        self.engine, self.fmt, self.rollout, self.config = engine, fmt, rollout, config
        self.capacity = config.capacity or rollout.max_concurrent
        self.memo = ToolMemo()
        self._queue: deque[RunAheadJob] = deque()
        self._running: dict[str, _Running] = {}  # request id -> running job
        self._live_now: Counter[str] = Counter()  # states of the live requests in flight
        self._predicted: dict[str, str] = {}  # episode id -> predicted next state key
        self._jobs = 0  # job counter: request ids and seeds
        self._counts = dict.fromkeys(RunAheadStats.__dataclass_fields__, 0)
        self._busy = 0  # episodes holding a slot and not waiting on their env: they need rows
        self._active = False  # a batch is running (jobs are only submitted then)
        self._batches = 0  # batches started

    # ------------------------------------------------------------------ counters
    def stats(self) -> RunAheadStats:
        """Counters since this queue was made."""
        return RunAheadStats(**self._counts)

    @property
    def queued(self) -> int:
        """Jobs waiting to start."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Run-ahead requests on the engine."""
        return len(self._running)

    # ------------------------------------------------------------------ sources
    def queue_announced(
        self, prompts: Sequence[tuple[tuple[int, ...], str, str, ToolCallGrammar | None]]
    ) -> int:
        """Queue ``announce_samples`` jobs per distinct first-turn prompt.

        Args:
            prompts: ``(prompt_ids, task_id, env_id, grammar)`` of each announced first turn (the
                env id is the requests' ``draft_group``, as for the live requests of that env; the
                grammar is theirs too, ``None`` when tool calls are not constrained).

        Returns:
            Jobs queued.
        """
        seen: set[str] = set()
        queued = 0
        for prompt_ids, task_id, env_id, grammar in prompts:
            key = state_key(prompt_ids)
            if key in seen:
                continue
            seen.add(key)
            for _ in range(self.config.announce_samples):
                job = RunAheadJob(tuple(prompt_ids), key, task_id, "announce", self._batches, env_id, grammar)
                self._push(job, front=False)
                queued += 1
        self._counts["announced"] += queued
        self.pump()
        return queued

    def predict_after_tools(
        self,
        episode_id: str,
        env_id: str,
        task_id: str,
        transcript: TokenTranscript,
        action: str,
        turn: int,
        grammar: ToolCallGrammar | None = None,
    ) -> str | None:
        """Queue a run-ahead of the state after this turn's tools, if the memo knows every result.

        Args:
            episode_id: The episode (its next live request checks the prediction).
            env_id: The env id (memo key).
            task_id: The task id (memo key).
            transcript: The conversation with this turn's generated tokens appended.
            action: The turn's text (its tool calls are parsed the way the env parses them).
            turn: Assistant turns so far, this one included (the env's call-id prefix).
            grammar: The episode's tool-call grammar (``None``: its calls are not constrained).

        Returns:
            The predicted state key, or ``None`` when nothing was predicted.
        """
        if not self.config.predict_tools:
            return None
        parsed = parse_tool_calls(action, id_prefix=f"t{turn}_")  # the ids MultiTurnEnv gives them
        if parsed.errors or not parsed.calls:
            return None
        messages = self.memo.predict(env_id, task_id, parsed.calls)
        if messages is None:
            return None
        try:
            predicted = self.fmt.add_observation(transcript, messages)
        except ValueError:  # a template that is not append-only: the live episode fails there too
            return None
        key = state_key(predicted.token_ids)
        self._predicted[episode_id] = key
        self._counts["predicted"] += 1
        job = RunAheadJob(predicted.token_ids, key, task_id, "tool", self._batches, env_id, grammar)
        self._push(job, front=True)
        self.pump()
        return key

    def record_tools(
        self, env_id: str, task_id: str, action: str, turn: int, observation: Sequence[Message]
    ) -> None:
        """Remember the results of a turn's tool calls (what the env answered)."""
        parsed = parse_tool_calls(action, id_prefix=f"t{turn}_")
        if parsed.calls and not parsed.errors:
            self.memo.record(env_id, task_id, parsed.calls, observation)

    # ------------------------------------------------------------------ live requests
    def live_started(self, episode_id: str, key: str) -> None:
        """A live request for state ``key`` was submitted: check the prediction, drop redundant work."""
        predicted = self._predicted.pop(episode_id, None)
        if predicted is not None:
            self._counts["prediction_checks"] += 1
            self._counts["prediction_hits"] += int(predicted == key)
        self._live_now[key] += 1
        before = len(self._queue)
        self._queue = deque(j for j in self._queue if not (j.source == "tool" and j.state_key == key))
        self._counts["dropped"] += before - len(self._queue)
        for rid, running in list(self._running.items()):
            if running.job.source == "tool" and running.job.state_key == key:
                self._cancel(rid)

    def live_finished(self, episode_id: str, key: str) -> None:
        """The live request for ``key`` ended."""
        self._live_now[key] -= 1
        if self._live_now[key] <= 0:
            del self._live_now[key]
        self._predicted.pop(episode_id, None)  # a stale prediction (the episode went on without one)

    # ------------------------------------------------------------------ rows
    # An episode needs an engine row from when it takes a rollout slot until it ends, except while
    # it waits on its env (tools): only those rows, and the slots of ended episodes, are spare.
    def episode_started(self) -> None:
        """An episode took a rollout slot (it will need a row)."""
        self._busy += 1

    def episode_ended(self, episode_id: str) -> None:
        """The episode is over: its row is spare, and its prediction can no longer be checked."""
        self._busy -= 1
        self._predicted.pop(episode_id, None)
        self.pump()

    def env_wait(self, waiting: bool) -> None:
        """An episode starts (``True``) or ends (``False``) waiting on an env step."""
        self._busy += -1 if waiting else 1
        self.pump()

    # ------------------------------------------------------------------ the batch
    def start_batch(self) -> None:
        """A rollout batch starts: submit work from now on."""
        self._active = True
        self._batches += 1
        self._live_now.clear()
        self._busy = 0
        self.pump()

    async def end_batch(self) -> None:
        """The batch is over: cancel running requests, drop tool jobs and announced jobs it was for."""
        self._active = False
        for rid in list(self._running):
            self._cancel(rid)
        before = len(self._queue)
        # Announced before this batch started: for the batch after it, which starts them live.
        self._queue = deque(j for j in self._queue if j.source == "announce" and j.batch >= self._batches)
        self._counts["dropped"] += before - len(self._queue)
        self._predicted.clear()
        await asyncio.sleep(0)  # let the cancelled tasks run their cleanup

    def pump(self) -> None:
        """Submit queued jobs while rows are free (live requests always come first)."""
        if not self._active or not self.config.enabled:
            return
        room = min(self.config.max_in_flight, self.capacity - self._busy) - len(self._running)
        while room > 0 and self._queue:
            job = self._queue.popleft()
            if job.source == "tool" and job.state_key in self._live_now:  # the live request got there
                self._counts["dropped"] += 1
                continue
            request = self._request(job)
            if request is None:
                self._counts["dropped"] += 1
                continue
            task = asyncio.get_running_loop().create_task(self._run(request))
            self._running[request.request_id] = _Running(job, task)
            self._counts["started"] += 1
            room -= 1

    # ------------------------------------------------------------------ internals
    def _push(self, job: RunAheadJob, *, front: bool) -> None:
        if front:
            self._queue.appendleft(job)
        else:
            self._queue.append(job)
        while len(self._queue) > self.config.max_queue:  # drop the oldest announced work first
            if front:
                self._queue.pop()
            else:
                self._queue.popleft()
            self._counts["dropped"] += 1

    def _request(self, job: RunAheadJob) -> GenerationRequest | None:
        base = self.rollout.seed if self.rollout.seed is not None else 0
        params = self.rollout.turn_sampling(
            prompt_len=len(job.prompt_ids),
            max_context=self.engine.max_context,
            stop_token_ids=self.fmt.stop_token_ids,
            seed=sampling_seed(base, f"runahead/{job.state_key}", self._jobs + 1),
        )
        if params is None:
            return None
        self._jobs += 1
        return GenerationRequest(
            request_id=f"runahead/{self._jobs}",
            prompt_ids=job.prompt_ids,
            params=params,
            state_key=job.state_key,
            task_id=job.task_id,
            priority="runahead",
            draft_group=job.group,
            tool_grammar=job.grammar,
        )

    async def _run(self, request: GenerationRequest) -> None:
        try:
            out = await self.engine.agenerate(request)
        except asyncio.CancelledError:
            self._counts["cancelled"] += 1
            raise
        except Exception:  # run-ahead is best effort: never disturb the live episodes
            logger.warning("run-ahead request %s failed", request.request_id, exc_info=True)
        else:
            self._counts["tokens"] += len(out.token_ids)
            if out.finish_reason == "preempted":
                self._counts["preempted"] += 1
            elif out.finish_reason in ("stop", "length"):
                self._counts["completed"] += 1
        finally:
            self._running.pop(request.request_id, None)
        self.pump()

    def _cancel(self, request_id: str) -> None:
        running = self._running.pop(request_id, None)
        if running is not None:
            running.task.cancel()
