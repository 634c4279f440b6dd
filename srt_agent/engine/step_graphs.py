"""Decode and verify forwards in static shapes, replayed as CUDA graphs.

On a GPU, a decode step of a small model is bound by the host: one forward launches a few hundred
kernels, each costing microseconds of Python and driver time, while its arithmetic takes a fraction
of that. :class:`StepGraphs` runs every decode and verify forward of the engine in a small set of
static shapes and captures each shape once as a CUDA graph. A step then costs one host-to-device
copy of its inputs per dtype, one graph launch, and one device-to-host copy of the drawn tokens and
their logprobs: the step's only sync.

**Shapes.** Rows are padded to a power of two (``Bb``) and the attention span to a power of two
(``L``, at least :data:`MIN_SPAN`, at most the cache's length). Tree positions per row (``Tb``) are
1 for a plain decode step and the engine's one verify width for every verify step (shorter drafts
are padded), as SGLang gives every request exactly N draft slots: one verify graph per row bucket
and span serves every step. A shape is keyed together with the batch's sampling flags (which
choose the sampling ops).

**Capture at start-up.** :meth:`StepGraphs.warm_up` captures every decode, verify and prefill
shape of the given sampling flags before any request runs, largest first (smaller graphs reuse the
larger ones' memory in the one pool), as SGLang's ``CudaGraphRunner`` does: a capture costs tens of
milliseconds, which mid-run lands inside a rollout's steps. After warm-up, a shape of warmed flags
that warm-up did not build (a prefill too large to be launch-bound, a step past the last
power-of-two span) runs eagerly and is counted, never captured mid-run; flags that were not warmed
(a greedy evaluation on an RL engine) are still captured the first time they are met.

**Static addressing.** The graphs read and write the KV cache in place, so the cache is allocated at
its full size once and never grown or moved (see :class:`~srt_agent.engine.kv_cache.KVCache`), and
weight updates copy into the model's existing tensors (:meth:`CausalLM.load`): every captured
address stays valid, so graphs survive weight updates. Inputs live in two device buffers (integers
and floats) that every graph reads through views at fixed offsets; the host fills a pinned twin of
each and copies it over without blocking.

**In the graph** (no host sync anywhere): RoPE positions (cached length + node depth), cache write
positions, the tree attention bias from each node's ancestor bitmask
(:func:`~srt_agent.engine.kv_cache.mask_bias`), the forward over all positions, the LM head, and a
draw at every position with the uniform of that position's depth in the row's stream: exactly the
draws of ``spec.draws='all'``, so a row gets the same tokens as on the eager path. Padding rows and
positions are causal chains whose draws are discarded; padding rows write only into cache rows that
no sequence holds, padding positions only past a row's tree (stale positions, free by contract).

**Prefills** of new prompt parts up to :data:`MAX_PREFILL` tokens run the same way (rows and new
tokens bucketed, a causal mask after each row's reused prefix, the draw at each row's last prompt
token). Their rows follow the running ones, wherever those end, so a prefill graph takes its rows
as a device tensor (keys and values are gathered, not sliced); its padding rows write into one
spare cache row kept for that. Warmed prefill graphs attend over the whole cache span, so one
graph per (rows, new tokens) bucket serves every reused prefix: an agent's next turn reuses a
prefix of any length and prefills a few dozen tokens, a launch-bound step where reading the whole
span's keys costs microseconds. Warm-up builds the launch-bound ones (at most
:data:`WARM_PREFILL_TOKENS` padded tokens); larger prefills are compute-bound and run eagerly at
their own span.

**Constrained steps** (a row inside a tool call, :mod:`~srt_agent.engine.constraint`) run as
their own shapes (kind ``"masked"``): the same step with the logits of every position masked by a
third input buffer, the allowed tokens per row and tree position, filled on the device before the
launch (all allowed for rows and positions without a constraint). Warm-up builds them only when
asked (``warm_up(..., masked=True)``: a rollout with ``constrain_tool_calls``); otherwise they are
captured the first time they are met. Without them every step with one constrained row would run
eagerly: at a few dozen rows, nearly every step of a tool-calling rollout.

With ``capture=False`` the same static-shape steps run eagerly: that is how the CPU tests check this
path against the engine's plain one, and the fallback when a capture fails on a device.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from srt_agent import native
from srt_agent.contracts.generation import SamplingParams
from srt_agent.engine.kv_cache import KVCache
from srt_agent.engine.llama import CausalLM
from srt_agent.engine.step_bodies import Flags, prefill_step, sampling_flags, tree_step

log = logging.getLogger(__name__)

MIN_SPAN = 256
"""Smallest attention span of a graph (shorter contexts share it: fewer shapes, negligible cost)."""

MAX_WIDTH = 32
"""Widest tree (root included) a graph takes; wider steps run on the engine's eager path."""

MIN_PREFILL = 16
"""Fewest new tokens per row a prefill graph is shaped for (shorter prompts share it)."""

MAX_PREFILL = 1024
"""Most new tokens per row a prefill graph takes; longer prompts prefill on the eager path."""

WARM_PREFILL_TOKENS = 2048
"""Most padded tokens (rows x new tokens) of a prefill shape that warm-up captures."""

_Key = tuple[str, int, int, int, Flags]  # kind (step, masked, prefill), rows, width, span, sampling flags


def bucket(n: int, floor: int = 1) -> int:
    """The smallest power of two ``>= max(n, floor)``."""
    n = max(n, floor, 1)
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class StepDraws:
    """What a static step drew: per row, the token and its logprob at each of its tree positions.

    Attributes:
        tokens: ``tokens[b][j]``: the token drawn from the distribution after position ``j`` of row
            ``b`` (its root is position 0).
        logprobs: Their logprobs under the row's processed distribution.
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]


@dataclass
class _Graph:
    """One captured shape: its replay (or eager) function and where its output lands."""

    run: Callable[[], torch.Tensor]
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None  # (2, Bb, Tb) float64, the captured output (graphs only)
    unwarmed: bool = False  # a shape warm-up should have built but did not (eager on every call)


class StepGraphs:
    """Static-shape decode and verify steps over the engine's model and (full-size) KV cache.

    Args:
        model: The target model.
        cache: The engine's KV cache, allocated at its full size (``rows == max_rows`` and
            ``positions == max_positions``); rows past the running ones are padding's scratch,
            and its last row is kept for the padding rows of prefills (no sequence holds it).
        max_width: The verify width: tree positions of every verify step (root included; capped
            at :data:`MAX_WIDTH`; 1: no verify steps); the cache needs that many positions of slack.
        capture: Capture CUDA graphs (on a CUDA device); ``False`` runs the same steps eagerly.

    Raises:
        ValueError: The cache is not at its full size, or ``capture`` off a CUDA device.
    """

    def __init__(self, model: CausalLM, cache: KVCache, *, max_width: int, capture: bool) -> None:
        if cache.rows != cache.max_rows or cache.positions != cache.max_positions:
            raise ValueError("static steps need the KV cache allocated at its full size (never moved)")
        device = model.device
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        self.model = model
        self.cache = cache
        self.capture = capture
        self.max_rows = cache.rows - 1  # the last row is the prefills' padding row
        if self.max_rows < 1:
            raise ValueError("static steps need a KV cache of at least 2 rows (one is kept spare)")
        self.spare_row = cache.rows - 1
        self.max_width = min(max(max_width, 1), MAX_WIDTH)
        self.max_span = cache.positions
        rows = bucket(self.max_rows)
        n = rows * self.max_width
        pinned = device.type == "cuda"
        # Sized for the larger of the two input layouts (see srt_agent.engine.step_bodies).
        ints = max(3 * n + 3 * rows, rows * MAX_PREFILL + 5 * rows)
        self._ints_host = torch.zeros(ints, dtype=torch.long, pin_memory=pinned)
        self._floats_host = torch.zeros(n + 2 * rows, dtype=torch.float32, pin_memory=pinned)
        # numpy views of the pinned buffers: filling them from Python lists is ~10x cheaper than
        # building a tensor per step (a decode step's inputs are a few hundred numbers).
        self._ints_np = self._ints_host.numpy()
        self._floats_np = self._floats_host.numpy()
        self._ints = torch.zeros_like(self._ints_host, device=device)
        self._floats = torch.zeros_like(self._floats_host, device=device)
        self._graphs: dict[_Key, _Graph] = {}
        # Allowed tokens per row and tree position of masked steps: made on the first one, then
        # never moved (captured graphs read it where it is).
        self._allowed: torch.Tensor | None = None
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._stream: torch.cuda.Stream | None = None  # where graphs are captured (made on first use)
        self.captures = 0  # graphs captured
        self.replays = 0  # decode and verify steps run through a captured graph
        self.eager_steps = 0  # static decode and verify steps run eagerly (capture off, or it failed)
        self.prefills = 0  # prefills run as static steps (replayed or eager)
        self.prefill_replays = 0  # of which run through a captured graph
        self.capture_error: str | None = None  # why capturing was turned off, if it was
        self.capture_s = 0.0  # spent capturing (a one-off per shape, not a step's cost)
        self.prefill_capture_s = 0.0  # of which prefill shapes
        self.warm_up_s = 0.0  # spent in warm_up (its captures included)
        self.warm_up_capture_s = 0.0  # of capture_s, at warm-up (not mid-run)
        self.warm_up_prefill_capture_s = 0.0  # of which prefill shapes
        self.warm_shapes = 0  # shapes built by warm_up
        self.unwarmed_shapes = 0  # shapes of warmed flags met later: run eagerly, never captured
        self.unwarmed_runs = 0  # steps and prefills run on those shapes (each one eagerly)
        self._warm: set[Flags] = set()  # sampling flags whose shapes warm_up built
        self._warm_masked: set[Flags] = set()  # ... and whose masked step shapes it built
        # Spent launching steps and waiting for their results (the whole forward where steps run
        # eagerly, e.g. on a CPU): a step's time less this is the host's own work.
        self.device_s = 0.0

    @property
    def shapes(self) -> int:
        """Step shapes built so far (captured, or eager where capture is off)."""
        return len(self._graphs)

    def release(self) -> None:
        """Drop every captured graph and its memory (the engine is closing)."""
        self._graphs.clear()
        self._allowed = None

    def fits(self, rows: int, width: int) -> bool:
        """Whether a step of ``rows`` rows and trees of ``width`` positions can run here.

        A verify step (``width > 1``) is padded to :attr:`max_width`, so any ``width`` up to it fits.
        """
        return bucket(rows) <= self.max_rows + 1 and rows <= self.max_rows and width <= self.max_width

    def fits_prefill(self, rows: int, new_tokens: int, reused: int) -> bool:
        """Whether a prefill can run here.

        Args:
            rows: Rows prefilled together.
            new_tokens: The most new tokens of a row.
            reused: The longest reused prefix of a row (cached positions before the new ones).
        """
        width = bucket(new_tokens, MIN_PREFILL)
        return rows <= self.max_rows and width <= MAX_PREFILL and reused + width <= self.max_span

    def run(
        self,
        ids: Sequence[Sequence[int]],
        prefix: Sequence[int],
        parents: Sequence[Sequence[int]] | None,
        uniforms: Sequence[Sequence[float]] | None,
        params: Sequence[SamplingParams],
        masks: torch.Tensor | None = None,
    ) -> StepDraws:
        """Run one decode or verify forward over rows ``0 .. B-1`` and draw at every position.

        Args:
            ids: Per row, its tree's tokens: the root (the last committed token, not yet cached)
                then the draft nodes; a plain decode step has the root alone.
            prefix: Per row, the positions already cached (the root is written at ``prefix[b]``).
            parents: Per row, the parent position of each tree position (``-1`` for the root; a
                parent precedes its child); ``None`` when every row is a lone root.
            uniforms: Per row, the uniforms of its stream by depth (``uniforms[b][d]`` for a
                position at depth ``d``; deeper padding reuses the last); ``None`` if all greedy.
            params: Per row, its sampling parameters.
            masks: ``(B, width, V)`` bool on the model's device, the tokens allowed at each
                position (constrained tool calls); ``None``: all allowed.

        Returns:
            The token and logprob drawn at each real position of each row (with ``masks``,
            from the masked, renormalised distribution).

        Raises:
            ValueError: The step does not fit (:meth:`fits`) or overruns the cache.
        """
        rows = len(ids)
        width = max(len(r) for r in ids)
        if not self.fits(rows, width):
            raise ValueError(f"a step of {rows} rows x {width} positions does not fit the static shapes")
        bb, tb = bucket(rows), (1 if width == 1 else self.max_width)
        need = max(prefix) + tb
        if need > self.max_span:
            raise ValueError(f"a step needs {need} cache positions; the cache has {self.max_span}")
        span = min(bucket(need, MIN_SPAN), self.max_span)
        flags = sampling_flags(params, self.model.config.vocab_size)
        self._fill(ids, prefix, parents, uniforms, params, bb, tb)
        kind = "step"
        if masks is not None:
            self._fill_allowed(masks, bb, tb)
            kind = "masked"
        timer = CaptureFreeTimer(self)
        out, replayed = self._launch((kind, bb, tb, span, flags))
        if replayed:
            self.replays += 1
        else:
            self.eager_steps += 1
        values = out[:, :rows, :width].cpu()  # the step's one sync
        self.device_s += timer.seconds()
        return StepDraws(values[0].long().tolist(), values[1].tolist())

    def prefill(
        self,
        ids: Sequence[Sequence[int]],
        prefix: Sequence[int],
        row_start: int,
        uniforms: Sequence[float] | None,
        params: Sequence[SamplingParams],
        *,
        whole_span: bool = False,
    ) -> StepDraws:
        """Prefill new prompt parts into rows ``row_start ..`` and draw each row's first token.

        Args:
            ids: Per row, the prompt tokens not yet cached (at least one).
            prefix: Per row, the positions already cached (a reused prefix, copied in before).
            row_start: The first row (rows follow each other).
            uniforms: Per row, the uniform of its first token; ``None`` if all greedy.
            params: Per row, its sampling parameters.
            whole_span: Attend over the whole cache (the shape :meth:`warm_up` builds), whatever
                the prefix; by default a warmed whole-span shape is used where one exists, else
                the span the prefix needs.

        Returns:
            One token and its logprob per row.

        Raises:
            ValueError: The prefill does not fit (:meth:`fits_prefill`).
        """
        rows = len(ids)
        longest = max(len(r) for r in ids)
        if not self.fits_prefill(rows, longest, max(prefix)) or row_start + rows > self.max_rows:
            raise ValueError(
                f"a prefill of {rows} rows x {longest} new tokens does not fit the static shapes"
            )
        kb, tb = bucket(rows), bucket(longest, MIN_PREFILL)
        span = min(bucket(max(prefix) + tb, MIN_SPAN), self.max_span)
        flags = sampling_flags(params, self.model.config.vocab_size)
        if whole_span or ("prefill", kb, tb, self.max_span, flags) in self._graphs:
            span = self.max_span  # a warmed graph (whole span) serves any reused prefix
        pad = kb - rows
        flat: list[int] = []
        for r in ids:
            flat.extend(r)
            flat.extend([0] * (tb - len(r)))
        flat.extend([0] * (tb * pad))
        ints = [*flat, *prefix, *([0] * pad), *(len(r) - 1 for r in ids), *([tb - 1] * pad)]
        firsts = [*uniforms, *([0.5] * pad)] if uniforms is not None else [0.5] * kb
        self._ints_np[: len(ints)] = ints
        self._floats_np[: len(firsts)] = firsts
        self._fill_params(
            [*range(row_start, row_start + rows), *([self.spare_row] * pad)],
            len(ints),
            len(firsts),
            params,
            pad,
        )
        timer = CaptureFreeTimer(self)
        out, replayed = self._launch(("prefill", kb, tb, span, flags))
        self.prefills += 1
        self.prefill_replays += replayed
        values = out[:, :rows].cpu()  # the prefill's one sync
        self.device_s += timer.seconds()
        return StepDraws([[t] for t in values[0].long().tolist()], [[lp] for lp in values[1].tolist()])

    # --- warm-up ------------------------------------------------------------------------------

    def warm_up(self, params: Sequence[SamplingParams], *, masked: bool = False) -> int:
        """Build every step shape of ``params``' sampling flags now, largest first (see the module doc).

        Must run while no sequence holds a cache row: each shape runs once on placeholder inputs
        (on a GPU, its capture runs it), writing keys and values into rows that nothing reads.
        The step counters are left as they were; the time goes to :attr:`warm_up_s`.

        Args:
            params: Sampling parameters the engine will run (e.g. the rollout's); one set of shapes
                per distinct sampling flags. Flags warmed before are skipped. Verify shapes are
                built where the engine verifies at all (:attr:`max_width` > 1).
            masked: Build the masked (constrained) decode and verify shapes as well.

        Returns:
            Shapes built.
        """
        start = time.perf_counter()
        captured, prefill_captured = self.capture_s, self.prefill_capture_s
        before = (self.replays, self.eager_steps, self.prefills, self.prefill_replays, self.device_s)
        vocab = self.model.config.vocab_size
        built = len(self._graphs)
        for p in params:
            flags = sampling_flags([p], vocab)
            for done, steps_only in ((self._warm, False), (self._warm_masked, True)):
                if flags in done or (steps_only and not masked):
                    continue
                for kind, rows, width, span in self.warm_shape_list():
                    if kind == "step":
                        self._warm_step(rows, width, span, p, masked=steps_only)
                    elif not steps_only:
                        self._warm_prefill(rows, width, p)
                done.add(flags)
        self.replays, self.eager_steps, self.prefills, self.prefill_replays, self.device_s = before
        new = len(self._graphs) - built
        self.warm_shapes += new
        self.warm_up_capture_s += self.capture_s - captured
        self.warm_up_prefill_capture_s += self.prefill_capture_s - prefill_captured
        self.warm_up_s += time.perf_counter() - start
        return new

    def warm_shape_list(self) -> list[tuple[str, int, int, int]]:
        """The shapes :meth:`warm_up` builds per sampling flags: ``(kind, rows, width, span)``, largest first.

        Steps: every row bucket, width 1 (and the verify width), every power-of-two span of the
        cache (the last span, past the largest power of two, is left to the eager path: only rows
        within a tree's width of the full context reach it). Prefills: every row and new-token
        bucket of at most :data:`WARM_PREFILL_TOKENS` padded tokens, over the whole span.
        """
        row_buckets = [1 << k for k in range(self.max_rows.bit_length()) if 1 << k <= self.max_rows]
        spans = [s for s in (MIN_SPAN << k for k in range(32)) if s <= self.max_span] or [self.max_span]
        widths = [1, self.max_width] if self.max_width > 1 else [1]
        shapes = [("step", b, w, s) for b in row_buckets for w in widths for s in spans if w <= s]
        tbs = [t for t in (MIN_PREFILL << k for k in range(16)) if t <= min(MAX_PREFILL, self.max_span)]
        prefills = [(k, t) for k in row_buckets for t in tbs if k * t <= WARM_PREFILL_TOKENS]
        shapes += [("prefill", k, t, self.max_span) for k, t in prefills]
        return sorted(shapes, key=lambda s: (-s[1] * s[2] * s[3], s))

    def _warm_step(
        self, rows: int, width: int, span: int, p: SamplingParams, *, masked: bool = False
    ) -> None:
        """Run one decode or verify step of shape ``(rows, width, span)`` on placeholder inputs."""
        chain = [-1, *range(width - 1)] if width > 1 else None
        uniforms = [[0.5] * width] * rows if p.temperature > 0 else None
        prefix = [span - width] * rows  # so the step's span bucket is `span`
        vocab = self.model.config.vocab_size
        masks = None
        if masked:  # all allowed: one vocabulary row broadcast, not a rows x width x V tensor
            masks = torch.ones((1, 1, vocab), dtype=torch.bool, device=self.model.device).expand(
                rows, width, vocab
            )
        self.run([[0] * width] * rows, prefix, [chain] * rows if chain else None, uniforms, [p] * rows, masks)

    def _warm_prefill(self, rows: int, width: int, p: SamplingParams) -> None:
        """Run one prefill of ``rows`` rows x ``width`` new tokens (whole span) on placeholder inputs."""
        uniforms = [0.5] * rows if p.temperature > 0 else None
        self.prefill([[0] * width] * rows, [0] * rows, 0, uniforms, [p] * rows, whole_span=True)

    def _launch(self, key: _Key) -> tuple[torch.Tensor, bool]:
        """Run the step of ``key`` on the inputs just filled: its output, and whether it was a replay."""
        entry = self._graphs.get(key)
        if entry is None:
            warmed = key[-1] in (self._warm_masked if key[0] == "masked" else self._warm)
            self.unwarmed_shapes += warmed
            entry = self._graphs[key] = self._build(key, capture=self.capture and not warmed)
            entry.unwarmed = warmed
        self.unwarmed_runs += entry.unwarmed
        if entry.graph is not None:
            entry.graph.replay()
            assert entry.out is not None
            return entry.out, True
        return entry.run(), False

    # --- inputs -------------------------------------------------------------------------------

    def _fill(
        self,
        ids: Sequence[Sequence[int]],
        prefix: Sequence[int],
        parents: Sequence[Sequence[int]] | None,
        uniforms: Sequence[Sequence[float]] | None,
        params: Sequence[SamplingParams],
        bb: int,
        tb: int,
    ) -> None:
        """Write the step's inputs in shape ``(bb, tb)``'s layout and copy them to the device."""
        rows = len(ids)
        pad = bb - rows
        if tb > 1 and native.core is not None:  # the same layout, written in C++ (one call)
            k_int, k_float = native.core.tree_layout(
                ids, parents if parents is not None else [()] * rows, uniforms, prefix, bb, tb,
                self._ints_np, self._floats_np,
            )  # fmt: skip
            self._fill_params(None, k_int, k_float, params, pad)
            return
        if tb == 1:  # plain decode: every row is a lone root
            flat_ids = [r[0] for r in ids] + [0] * pad
            masks = [1] * bb
            depths = [0] * bb
            flat_u = [u[0] for u in uniforms] + [0.5] * pad if uniforms is not None else [0.5] * bb
        else:
            flat_ids, masks, depths, flat_u = [], [], [], []
            for b in range(bb):
                row = ids[b] if b < rows else ()
                ups = parents[b] if parents is not None and b < rows else ()
                us = uniforms[b] if uniforms is not None and b < rows else (0.5,)
                row_masks: list[int] = []
                row_depths: list[int] = []
                for j in range(tb):
                    # Past the row's tree (and in padding rows) positions chain onto the previous one.
                    up = (ups[j] if j < len(ups) else -1) if j < len(row) else j - 1
                    row_masks.append((row_masks[up] if up >= 0 else 0) | (1 << j))
                    depth = row_depths[up] + 1 if up >= 0 else 0
                    row_depths.append(depth)
                    flat_u.append(us[min(depth, len(us) - 1)])
                flat_ids.extend(row)
                flat_ids.extend([0] * (tb - len(row)))
                masks.extend(row_masks)
                depths.extend(row_depths)
        ints = [*flat_ids, *masks, *depths, *prefix, *([0] * pad)]
        self._ints_np[: len(ints)] = ints
        self._floats_np[: len(flat_u)] = flat_u
        self._fill_params(None, len(ints), len(flat_u), params, pad)

    def _fill_allowed(self, masks: torch.Tensor, bb: int, tb: int) -> None:
        """Write a masked step's allowed tokens (rows past ``masks`` and positions past its width: all)."""
        if self._allowed is None:
            shape = (bucket(self.max_rows), self.max_width, self.model.config.vocab_size)
            self._allowed = torch.ones(shape, dtype=torch.bool, device=self.model.device)
        rows, width = masks.shape[0], masks.shape[1]
        allowed = self._allowed[:bb, :tb]
        allowed.fill_(True)
        allowed[:rows, :width].copy_(masks, non_blocking=True)

    def _fill_params(
        self,
        rows: list[int] | None,
        k_int: int,
        k_float: int,
        params: Sequence[SamplingParams],
        pad: int,
    ) -> None:
        """Append the rows' sampling parameters to a step's inputs and copy them to the device.

        The step's own inputs are already in the buffers: ``k_int`` integers and ``k_float``
        floats (uniforms). Then come integers ``rows`` (if given), top-k and greedy flags; floats
        temperatures and top-p (padding rows: unfiltered, temperature 1).
        """
        vocab = self.model.config.vocab_size
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params] + [vocab] * pad
        greedy = [int(p.temperature == 0) for p in params] + [0] * pad
        temps = [p.temperature if p.temperature > 0 else 1.0 for p in params] + [1.0] * pad
        top_p = [p.top_p for p in params] + [1.0] * pad
        tail = [*(rows or ()), *top_k, *greedy]
        n_int, n_float = k_int + len(tail), k_float + 2 * len(temps)
        self._ints_np[k_int:n_int] = tail
        self._floats_np[k_float:n_float] = [*temps, *top_p]
        # The previous step ended with a device-to-host read, so no copy from these pinned
        # buffers is still in flight when they are refilled.
        self._ints[:n_int].copy_(self._ints_host[:n_int], non_blocking=True)
        self._floats[:n_float].copy_(self._floats_host[:n_float], non_blocking=True)

    # --- shapes -------------------------------------------------------------------------------

    def _build(self, key: _Key, *, capture: bool) -> _Graph:
        """The step of one shape: captured as a graph if ``capture`` (and it works), else eager."""
        kind, bb, tb, span, flags = key
        if kind == "prefill":
            run = prefill_step(self.model, self.cache, self._ints, self._floats, bb, tb, span, flags)
        else:
            allowed = None if kind == "step" else self._allowed_view(bb, tb)
            run = tree_step(self.model, self.cache, self._ints, self._floats, bb, tb, span, flags, allowed)
        if not capture:
            return _Graph(run)
        start = time.perf_counter()
        try:
            graph, out = self._capture(run)
        except Exception as exc:  # noqa: BLE001 (a failed capture costs speed, never the step)
            self.capture = False
            self.capture_error = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graph capture failed; decode steps run eagerly from now on: %s", exc)
            torch.cuda.synchronize(self.model.device)
            return _Graph(run)
        self.captures += 1
        took = time.perf_counter() - start
        self.capture_s += took
        if kind == "prefill":
            self.prefill_capture_s += took
        return _Graph(run, graph, out)

    def _allowed_view(self, bb: int, tb: int) -> torch.Tensor:
        assert self._allowed is not None, "a masked step fills its allowed tokens before it is built"
        return self._allowed[:bb, :tb]

    def _capture(self, run: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        device = self.model.device
        current = torch.cuda.current_stream(device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        side = self._stream
        side.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        # Capture on a side stream, as CUDA requires, without `torch.cuda.graph`'s full garbage
        # collection per capture (a second or more over a run's shapes in a large process).
        with torch.cuda.stream(side):
            # Warm up first (lazy initialisation, kernel selection). It runs the real step on
            # the inputs just filled, so its cache writes are exactly those the replay makes again.
            run()
            # thread_local: other threads (the trainer's, asyncio's) may use CUDA meanwhile.
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                out = run()
            except BaseException:
                with contextlib.suppress(Exception):
                    graph.capture_end()
                raise
            graph.capture_end()
        current.wait_stream(side)
        return graph, out


class CaptureFreeTimer:
    """Times engine work from its creation, leaving out graph captures made meanwhile.

    A step's first run at a new shape also captures its graph: a one-off, not what a step of that
    shape costs, so timings the cost model and the host/device split read must not include it.

    Args:
        graphs: The engine's static steps (``None``: no captures, a plain timer).
        clock: The time source (a simulated one in tests of the cost model).
    """

    def __init__(self, graphs: StepGraphs | None, clock: Callable[[], float] = time.perf_counter) -> None:
        self._graphs = graphs
        self._clock = clock
        self._captured = graphs.capture_s if graphs is not None else 0.0
        self._start = clock()

    def seconds(self) -> float:
        """Seconds since creation, less the capture time in between (never negative)."""
        elapsed = self._clock() - self._start
        if self._graphs is not None:
            elapsed -= self._graphs.capture_s - self._captured
        return max(elapsed, 0.0)
