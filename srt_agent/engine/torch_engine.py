"""``TorchEngine``: in-process batched generation with a KV cache, continuous batching and speculation.

One worker thread owns the model, the KV cache and the :class:`Scheduler`; callers hand it requests
through a queue and wait on futures (``generate`` blocks on several, ``agenerate`` awaits one from
any asyncio task). The worker blocks on the queue when it has nothing to do (no busy spin) and
otherwise drains the queue between decode steps, so new requests join the running batch at the
next step. Weight updates run on the worker too, between two steps, never inside a forward.

With a draft source (the tree cache), decode steps verify draft trees exactly (see
:mod:`srt_agent.engine.speculation.speculator` and :mod:`srt_agent.engine.speculation.verify`):
outputs are distributed as without speculation, and a seeded request gets the same tokens either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from srt_agent.contracts.draft import DraftSourceProtocol
from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams, check_room
from srt_agent.contracts.speculation import SpecStats
from srt_agent.engine.batching import Detokenizer, Scheduler, SequenceState
from srt_agent.engine.constraint import CallMasks
from srt_agent.engine.hf_checkpoint import ModelConfig, check_state_dict, read_config, read_state_dict
from srt_agent.engine.kv_cache import KVCache
from srt_agent.engine.llama import CausalLM
from srt_agent.engine.prefix_cache import PrefixStore
from srt_agent.engine.sequence import load_tokenizer
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.speculation.speculator import Speculator
from srt_agent.engine.speculation.stats import SpecCounters
from srt_agent.engine.step_graphs import CaptureFreeTimer, StepGraphs, bucket

log = logging.getLogger(__name__)

T = TypeVar("T")
_STOP = object()  # queue sentinel: the worker exits


@dataclass(frozen=True)
class EngineStats:
    """Counters of a :class:`TorchEngine` since it started (a snapshot).

    Attributes:
        decode_steps: Batched decode forwards run.
        prefill_forwards: Batched prefill forwards run.
        peak_batch: Most sequences decoded together in one step.
        joined_running: Sequences admitted while others were decoding (continuous batching).
        running: Sequences holding a cache row now.
        waiting: Sequences admitted to the worker but waiting for a row.
        in_flight: Requests submitted and not yet answered.
        prefix_hits: Prefills that reused a parked prefix (see :mod:`srt_agent.engine.prefix_cache`).
        prefix_tokens_reused: Prompt tokens copied from parked prefixes instead of recomputed.
        graph_shapes: Step shapes captured as CUDA graphs.
        graph_replays: Decode and verify steps run by replaying a CUDA graph.
        graph_capture_s: Time spent capturing graphs (once per shape; inside the step and
            prefill times of :class:`~srt_agent.engine.speculation.stats.SpecStats`).
        prefill_capture_s: Of ``graph_capture_s``, the prefill shapes' (inside the
            prefill time; the rest is inside the decode and verify steps' time).
        static_eager_steps: Static-shape steps run eagerly (``cuda_graphs`` on a CPU, or after a
            failed capture).
        static_prefills: Prefills run as static-shape steps (graph replays on a GPU, or eager:
            capture off, or a shape warm-up did not build).
        static_prefill_replays: Of ``static_prefills``, those run by replaying a CUDA graph.
        graph_error: Why capturing was turned off, if a capture failed.
        warm_up_s: Spent in :meth:`TorchEngine.warm_up` (building every step shape before
            the first request; its captures are inside ``graph_capture_s`` too).
        warm_up_capture_s: Of ``graph_capture_s``, the captures made by warm-up (so
            ``graph_capture_s - warm_up_capture_s`` was captured mid-run).
        warm_up_prefill_capture_s: Of ``warm_up_capture_s``, the prefill shapes'.
        warm_shapes: Step shapes built by warm-up.
        unwarmed_shapes: Shapes of warmed sampling flags met after warm-up (run eagerly, never
            captured mid-run): 0 when warm-up covered everything the run needed.
        unwarmed_runs: Steps and prefills run on those shapes (each one eagerly: on a GPU, a
            few milliseconds of kernel launches instead of one graph launch).
    """

    decode_steps: int
    prefill_forwards: int
    peak_batch: int
    joined_running: int
    running: int
    waiting: int
    in_flight: int
    prefix_hits: int = 0
    prefix_tokens_reused: int = 0
    graph_shapes: int = 0
    graph_replays: int = 0
    graph_capture_s: float = 0.0
    prefill_capture_s: float = 0.0
    static_eager_steps: int = 0
    static_prefills: int = 0
    static_prefill_replays: int = 0
    graph_error: str | None = None
    warm_up_s: float = 0.0
    warm_up_capture_s: float = 0.0
    warm_up_prefill_capture_s: float = 0.0
    warm_shapes: int = 0
    unwarmed_shapes: int = 0
    unwarmed_runs: int = 0


PREFIX_CACHE_BYTES = 256 * 2**20
"""The default budget of parked keys/values (``TorchEngine(prefix_cache_bytes=...)``)."""


def default_dtype(device: torch.device | str) -> torch.dtype:
    """The engine's default dtype on ``device``: bfloat16 on a GPU, float32 elsewhere.

    On a GPU, bfloat16 halves the bytes every decode step reads (weights and KV cache) and uses the
    tensor cores; the sampled distribution is the bfloat16 model's, and its logprobs are what the
    engine records (the learner's ratio starts from them). CPUs lack fast bfloat16 matmuls.
    """
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


@dataclass(frozen=True)
class _Call:
    """A function to run on the worker between two steps, and where its result goes."""

    fn: Callable[[], Any]
    future: Future[Any]


class TorchEngine:
    """Generation engine over an HF-format Llama/Qwen2 checkpoint, running in this process.

    Conventions: ``logprobs`` are under the processed distribution (temperature, then top-k, then
    top-p); with ``temperature=0`` the token is the argmax and its logprob is taken under the
    temperature-1 distribution after top-k/top-p (see :mod:`srt_agent.engine.sampling`). A
    request's seed fixes its tokens whatever else shares the batch. ``forward_passes`` counts the
    forwards that produced the request's tokens (the prefill, which yields the first token, and
    each decode step), so plain decoding reports ``len(token_ids)`` and speculation fewer.
    Requests with ``priority="runahead"`` are admitted after live ones and give their rows to live
    requests that would wait otherwise (finishing as ``preempted``). Call :meth:`close` (or use the
    engine as a context manager) to stop the worker thread.

    Args:
        model_dir: Directory written by ``save_pretrained`` (config.json + weights).
        tokenizer: Tokenizer for stop strings; by default loaded from ``model_dir`` if present.
        max_context: Longest prompt + generation; defaults to ``max_position_embeddings``.
        max_batch_size: Most sequences decoding at once (more requests wait for a free row).
        dtype: Weights, cache and compute dtype; by default bfloat16 on a GPU, float32 on a CPU
            (:func:`default_dtype`). Sampling and logprobs are computed in float32 either way.
        device: ``cpu`` or a CUDA device.
        num_threads: If given, ``torch.set_num_threads`` (process-wide) for CPU kernels.
        seed: Seeds the engine's generator, which draws seeds for requests that set none.
        prefill_tokens: Padded-token budget of one batched prefill forward.
        draft_source: Where drafts come from (the tree cache); it also receives every committed
            token (``extend``) and every ended stream (``finish``), whether or not speculation is on.
        spec: Speculation options; ``None`` means the defaults (enabled) when a draft source is
            given. Without a draft source it is ignored. With the adaptive cost model (default),
            construction times a few forwards of the model (its prior of forward cost).
        prefix_cache_bytes: Budget for keys/values of ended sequences kept so that later prompts
            sharing their prefix (the next turn of an episode, a sibling sample) prefill only the
            rest; cleared on :meth:`update_weights`. 0 disables it.
        cuda_graphs: Run decode, verify and prefill forwards in static shapes captured as CUDA graphs
            (:mod:`srt_agent.engine.step_graphs`); the KV cache is then allocated at its full size
            up front. ``None``: on for a CUDA device, off on a CPU. ``True`` on a CPU runs the same
            static steps without capture (how the tests check that path).
        cost_clock: The time source of what the speculation cost model measures (its prior's
            forwards, draft lookups, decode and verify steps); default ``time.perf_counter``.
            Tests pass a simulated clock so the model's choices do not depend on machine load;
            the reported seconds (:meth:`spec_stats`) always use the real clock.

    Raises:
        CheckpointError: The directory is missing, not a supported causal LM, or inconsistent.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        tokenizer: Detokenizer | None = None,
        max_context: int | None = None,
        max_batch_size: int = 32,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        num_threads: int | None = None,
        seed: int | None = None,
        prefill_tokens: int = 4096,
        draft_source: DraftSourceProtocol | None = None,
        spec: SpecConfig | None = None,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        cuda_graphs: bool | None = None,
        cost_clock: Callable[[], float] | None = None,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        device = torch.device(device)
        self.device = device  # where it runs: run-ahead's "auto" and callers read it
        dtype = dtype if dtype is not None else default_dtype(device)
        self.config: ModelConfig = read_config(model_dir)
        self._max_context = max_context or self.config.max_position_embeddings
        if self._max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {self._max_context}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_dir)
        self.model = CausalLM(
            self.config,
            read_state_dict(model_dir),
            dtype=dtype,
            device=device,
            max_positions=self._max_context,
        )
        c = self.config
        self.spec = spec if spec is not None else SpecConfig()
        drafting = draft_source is not None and self.spec.enabled
        static = cuda_graphs if cuda_graphs is not None else device.type == "cuda"
        # A verify forward writes up to max_draft_tokens positions past a row's last real one
        # (padding of shorter trees included), so the cache has that much slack past the context;
        # static steps pad trees to a power of two.
        width = self.spec.tree_slots if drafting else 1
        slack = bucket(width) if static else width - 1
        # Static steps pad rows to a power of two and keep one spare row for prefills' padding.
        rows = bucket(max_batch_size) + 1 if static else max_batch_size
        positions = self._max_context + slack
        cache = KVCache(
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
            rows,
            positions,
            dtype=dtype,
            device=device,
            # Static steps read the cache in place: all of it, once, never grown or moved.
            initial_rows=rows if static else 1,
            initial_positions=positions if static else 256,
        )
        self.graphs = (
            StepGraphs(self.model, cache, max_width=width, capture=device.type == "cuda") if static else None
        )
        self._counters = SpecCounters()
        speculator = (
            Speculator(
                self.model, cache, draft_source, self.spec, self._counters, self.graphs, clock=cost_clock
            )
            if draft_source is not None
            else None
        )
        self._scheduler = Scheduler(
            self.model,
            cache,
            max_batch=max_batch_size,
            tokenizer=self.tokenizer,
            prefill_tokens=prefill_tokens,
            speculator=speculator,
            counters=self._counters,
            prefix_store=PrefixStore(prefix_cache_bytes),
            graphs=self.graphs,
        )
        self._rng = random.Random(seed)
        self._lock = threading.Lock()  # guards _rng, _inflight, _closed, _thread
        self._inflight: set[str] = set()
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def prefix_store_bytes(self) -> int:
        """Bytes of parked keys/values held now (bounded by ``prefix_cache_bytes``)."""
        return self._scheduler.prefix.bytes

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + generation) the engine can hold."""
        return self._max_context

    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters (approximate while the worker is stepping)."""
        sch = self._scheduler
        with self._lock:
            in_flight = len(self._inflight)
        counts = EngineStats(
            decode_steps=sch.decode_steps,
            prefill_forwards=sch.prefill_forwards,
            peak_batch=sch.peak_batch,
            joined_running=sch.joined_running,
            running=len(sch.rows),
            waiting=len(sch.waiting),
            in_flight=in_flight,
            prefix_hits=sch.prefix.hits,
            prefix_tokens_reused=sch.prefix.reused_tokens,
        )
        g = self.graphs
        if g is None:
            return counts
        return replace(
            counts,
            graph_shapes=g.captures,
            graph_replays=g.replays,
            graph_capture_s=g.capture_s,
            prefill_capture_s=g.prefill_capture_s,
            static_eager_steps=g.eager_steps,
            static_prefills=g.prefills,
            static_prefill_replays=g.prefill_replays,
            graph_error=g.capture_error,
            warm_up_s=g.warm_up_s,
            warm_up_capture_s=g.warm_up_capture_s,
            warm_up_prefill_capture_s=g.warm_up_prefill_capture_s,
            warm_shapes=g.warm_shapes,
            unwarmed_shapes=g.unwarmed_shapes,
            unwarmed_runs=g.unwarmed_runs,
        )

    def spec_stats(self, reset: bool = False) -> SpecStats:
        """A snapshot of the speculation metrics (tokens and forwards count without drafts too).

        Args:
            reset: Start counting afresh after the snapshot (per-batch numbers for benchmarks).

        Returns:
            The counters since the engine started or the last reset.
        """
        return self._counters.snapshot(reset=reset)

    # --- public API -------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Run requests to completion in the running batch and return outputs in request order.

        Args:
            requests: Requests with distinct ids.

        Returns:
            One output per request. A request that cannot run (token id out of range, stop strings
            without a tokenizer) gets ``finish_reason="abort"`` with ``error``; the others complete.

        Raises:
            PromptTooLongError: A prompt leaves no room to generate (checked before any work).
            ValueError: Duplicate request ids.
            RuntimeError: The engine is closed.
        """
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"request ids must be unique within a call, got duplicates in {ids}")
        for request in requests:
            self._check_length(request)
        futures = [self._submit(r) for r in requests]
        return [f.result() for f in futures]

    async def agenerate(self, request: GenerationRequest) -> GenerationOutput:
        """Submit one request to the running batch (continuous batching) and await its output.

        Cancelling the awaiting task aborts the request and frees its row at the next step.

        Args:
            request: The request.

        Returns:
            Its output (``abort`` with ``error`` if it could not run).

        Raises:
            PromptTooLongError: The prompt leaves no room to generate.
            ValueError: A request with the same id is in flight.
            RuntimeError: The engine is closed.
        """
        self._check_length(request)
        return await asyncio.wrap_future(self._submit(request))

    def call_masks(self) -> CallMasks:
        """The engine's tool-call masks (built on first use; their ``mask`` is thread-safe).

        An in-process learner scores constrained tokens under the masks they were drawn with: reading
        them from here, it finds every mask the rollout already walked in the cache.

        Raises:
            ConstraintError: The tokenizer has no single ``<tool_call>``/``</tool_call>`` tokens.
            ValueError: There is no tokenizer.
        """
        return self._scheduler.call_masks()

    def warm_up(self, params: Sequence[SamplingParams], *, masked: bool = False) -> float:
        """Build (on a GPU: capture) every static step shape the engine will run, before any request.

        Every decode, verify and launch-bound prefill shape for the sampling flags of ``params``
        (usually the rollout's one set), largest first, so that no graph is captured inside a
        rollout (see :mod:`srt_agent.engine.step_graphs`). A no-op without static steps (a CPU).

        Args:
            params: The sampling parameters requests will use (only their flags matter: greedy,
                temperature 1 or not, top-k/top-p filtering).
            masked: Requests will constrain their tool calls (a tokenizer's grammar masks): build
                the masked decode and verify shapes too, so those steps replay graphs as well.

        Returns:
            Seconds it took (0.0 without static steps).

        Raises:
            RuntimeError: Requests are running (warm-up writes placeholder keys and values into
                free cache rows), or the engine is closed.
        """
        graphs = self.graphs
        if graphs is None:
            return 0.0
        scheduler = self._scheduler

        def run() -> float:
            if scheduler.has_work():
                raise RuntimeError("warm_up runs before requests are submitted (rows are in use)")
            before = graphs.warm_up_s
            with torch.inference_mode():
                graphs.warm_up(params, masked=masked)
            return graphs.warm_up_s - before

        seconds = self._call(run)
        log.info("engine warm-up: %d step shapes in %.2f s", graphs.warm_shapes, seconds)
        return seconds

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (HF names, any subset) between two decode steps.

        Requests in flight continue with the new weights from the next step on (their cached keys
        and values stay from the old ones); call it between rollout batches for on-policy data.
        Parked prefixes (``prefix_cache_bytes``) are dropped: they were computed with the old weights.

        Args:
            state_dict: HF parameter name to tensor (e.g. the learner's ``model.state_dict()``).

        Raises:
            CheckpointError: Unknown names or wrong shapes (nothing is changed then).
            RuntimeError: The engine is closed.
        """
        accepted = check_state_dict(self.config, state_dict, complete=False)

        def load() -> None:
            self.model.load(accepted)
            self._scheduler.prefix.clear()

        self._call(load)

    def flush_cache(self) -> None:
        """Drop the parked keys and values of ended sequences (never the draft source's trees)."""
        self._call(self._scheduler.prefix.clear)

    def abort_all(self, reason: str) -> None:
        """End every running and waiting request between two steps; each answers ``abort`` with ``reason``."""
        self._call(lambda: self._scheduler.abort_all(reason))

    def close(self) -> None:
        """Stop the worker; requests still running or waiting finish with ``abort``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._inbox.put(_STOP)
            thread.join()
        self._scheduler.abort_all("engine closed")
        if self.graphs is not None:
            self.graphs.release()  # before the cache they point into
        self._scheduler.cache.data = torch.empty(0)

    def __enter__(self) -> TorchEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- submission -------------------------------------------------------------------------------

    def _check_length(self, request: GenerationRequest) -> None:
        check_room(request, self._max_context)

    def invalid_reason(self, request: GenerationRequest) -> str | None:
        """Why this engine cannot run ``request``, or ``None``.

        A token outside the vocabulary, stop strings without a tokenizer, or a tool grammar the
        tokenizer cannot serve: :meth:`generate` answers such a request with an abort.
        """
        vocab = self.config.vocab_size
        bad = [t for t in request.prompt_ids if not 0 <= t < vocab]
        if bad:
            return f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})"
        if request.params.stop_strings and self.tokenizer is None:
            return "stop_strings need a tokenizer: pass tokenizer= to TorchEngine or save one with the model"
        if request.tool_grammar is not None:
            try:
                self._scheduler.call_masks()
            except ValueError as exc:  # no tokenizer, or no single-token tags (ConstraintError)
                return str(exc)
        return None

    def _submit(self, request: GenerationRequest) -> Future[GenerationOutput]:
        future: Future[GenerationOutput] = Future()
        error = self.invalid_reason(request)
        if error is not None:
            message = f"request {request.request_id!r}: {error}"
            future.set_result(GenerationOutput(request.request_id, (), (), "abort", error=message))
            return future

        def deliver(output: GenerationOutput) -> None:
            with self._lock:
                self._inflight.discard(output.request_id)
            with contextlib.suppress(InvalidStateError):  # the caller cancelled meanwhile
                future.set_result(output)

        with self._lock:
            # Enqueue under the lock: every accepted item precedes close()'s stop sentinel.
            if self._closed:
                raise RuntimeError("TorchEngine is closed")
            if request.request_id in self._inflight:
                raise ValueError(f"request id {request.request_id!r} is already in flight; use unique ids")
            self._inflight.add(request.request_id)
            seed = request.params.seed if request.params.seed is not None else self._rng.randrange(2**63)
            self._ensure_worker()
            self._inbox.put(SequenceState(request, deliver, future.cancelled, seed, self._max_context))
        return future

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker between two steps and return its result."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("TorchEngine is closed")
            self._ensure_worker()
            self._inbox.put(_Call(fn, future))
        return future.result()

    def _ensure_worker(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="TorchEngine-worker", daemon=True)
            self._thread.start()

    # --- worker -----------------------------------------------------------------------------------

    def _loop(self) -> None:
        scheduler = self._scheduler
        while True:
            # Block while idle (no busy spin); otherwise only drain what has arrived.
            items: list[object] = []
            if not scheduler.can_step():
                scheduler.counters.idle_begin()
                items.append(self._inbox.get())
                scheduler.counters.idle_end()
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for item in items:
                if item is _STOP:
                    return
                self._handle(item)
            if scheduler.can_step():
                try:
                    self._timed_step()
                except Exception as exc:  # keep serving later requests whatever happened
                    log.exception("engine step failed")
                    scheduler.abort_all(f"engine step failed: {type(exc).__name__}: {exc}")

    def _timed_step(self) -> None:
        """One scheduler step, its time (and the device's share of it) added to the counters."""
        graphs = self.graphs
        device = graphs.device_s if graphs is not None else 0.0
        timer = CaptureFreeTimer(graphs)
        try:
            self._scheduler.step()
        finally:
            device = graphs.device_s - device if graphs is not None else 0.0
            self._counters.add_time(step=timer.seconds(), device=device)

    def _handle(self, item: object) -> None:
        if isinstance(item, SequenceState):
            self._scheduler.add(item)
            return
        assert isinstance(item, _Call)
        try:
            item.future.set_result(item.fn())
        except Exception as exc:  # handed to the caller of _call, which re-raises it
            log.exception("engine call failed")
            item.future.set_exception(exc)
