"""The build's CPU-bound preprocessing (oracle episodes, tokenization) split over worker processes.

Playing 8k oracle episodes and tokenizing them turn by turn takes ~30 s in one process; both are
pure Python and independent per episode, so the build splits them into contiguous chunks over its
CPU threads' worth of forked processes. Chunks come back in order, so the result is identical to a
single-process run. Forking (as torch's DataLoader workers do) costs nothing at start-up and needs
no ``if __name__ == "__main__"`` guard in the caller's script, which ``spawn`` would; the workers
run no torch kernels. Where ``fork`` is unavailable (macOS, Windows) the work runs in-process.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from itertools import pairwise
from typing import TypeVar

from srt_agent.chat.template import ChatFormat
from srt_agent.recipe.copies import copy_mask
from srt_agent.recipe.demos import Demo, DemoSource, collect_demos, source_seeds, to_transcript
from srt_agent.recipe.sft import Example

T = TypeVar("T")
R = TypeVar("R")

MIN_CHUNK = 500
"""Fewer items than this per worker are not worth a process."""


def chunks(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into at most ``parts`` contiguous, near-equal, non-empty pieces."""
    parts = max(1, min(parts, n))
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [range(a, b) for a, b in pairwise(bounds) if b > a]


def ordered_map(fn: Callable[[T], R], items: Sequence[T], pool: Executor | None) -> list[R]:
    """``[fn(x) for x in items]``, on ``pool`` if given (results keep the items' order)."""
    if pool is None or len(items) <= 1:
        return [fn(x) for x in items]
    return list(pool.map(fn, items))


def make_pool(workers: int, items: int) -> ProcessPoolExecutor | None:
    """A forking process pool, or ``None`` when ``items`` are too few to gain from one (or no fork)."""
    workers = min(workers, items // MIN_CHUNK)
    if workers < 2 or not sys.platform.startswith("linux"):
        return None
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))


def collect_job(job: tuple[DemoSource, range]) -> list[Demo]:
    """Worker: the solved episodes of one source (env and demonstrator) over a slice of seeds."""
    source, seeds = job
    return collect_demos(
        source.env_id,
        len(seeds),
        seeds=seeds,
        demonstrator=source.demonstrator,
        options=source.options,
        turns=source.turns,
    )


def collect_all(
    demos: Sequence[DemoSource],
    build_seed: int,
    pool: Executor | None,
    parts: int,
    *,
    after: Sequence[DemoSource] = (),
) -> dict[str, list[Demo]]:
    """Per source (keyed by :attr:`DemoSource.label`), its solved episodes, in seed order.

    ``after``: sources whose seeds come first and are not played (:func:`source_seeds`).
    """
    jobs: list[tuple[DemoSource, range]] = []
    for source, seeds in zip(demos, source_seeds(demos, build_seed, after=after), strict=True):
        count = len(seeds)
        pieces = chunks(count, parts) if count >= 2 * MIN_CHUNK else [range(count)]
        jobs.extend((source, seeds[r.start : r.stop]) for r in pieces)
    out: dict[str, list[Demo]] = {source.label: [] for source in demos}
    for (source, _), got in zip(jobs, ordered_map(collect_job, jobs, pool), strict=True):
        out[source.label].extend(got)
    return out


Tokenized = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None]
"""A demonstration's ``(token_ids, loss_mask, copies)``: ``copies`` marks copied tool-call values
(:func:`~srt_agent.recipe.copies.copy_mask`), ``None`` where not asked for."""


def tokenize_job(job: tuple[ChatFormat, Sequence[Demo], bool]) -> list[Tokenized]:
    """Worker: each demonstration's tokens, built as a rollout would be, and its copies if asked."""
    fmt, demos, copies = job
    out: list[Tokenized] = []
    for d in demos:
        tr = to_transcript(fmt, d)
        out.append((tr.token_ids, tr.loss_mask, copy_mask(fmt, d, tr) if copies else None))
    return out


def tokenize_all(
    fmt: ChatFormat,
    demos: Sequence[Demo],
    pool: Executor | None,
    parts: int,
    to_example: Callable[[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None], Example],
    *,
    copies: bool = False,
) -> list[Example]:
    """Every demonstration as a training example, in order.

    ``to_example`` gets each one's token ids, loss mask and (with ``copies``) its copied values'
    tokens (:func:`~srt_agent.recipe.copies.copy_mask`; else ``None``).
    """
    pieces = chunks(len(demos), parts) if len(demos) >= 2 * MIN_CHUNK else [range(len(demos))]
    jobs = [(fmt, demos[r.start : r.stop], copies) for r in pieces]
    return [to_example(*got) for part in ordered_map(tokenize_job, jobs, pool) for got in part]


def keep_freed_memory() -> None:
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS.

    Training allocates and frees the same large activation buffers every step; with glibc's
    defaults each one is a fresh ``mmap`` whose pages the kernel zeroes again (~5% of a CPU build's
    time, measured). Process-wide and harmless elsewhere; a no-op off glibc.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameter numbers from <malloc.h>
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 1 << 31)
