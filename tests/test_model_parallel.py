"""The build's parallel preprocessing gives exactly the single-process result, in order."""

from __future__ import annotations

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import pytest
from model_fixtures import tokenizer

from srt_agent.chat.template import ChatFormat
from srt_agent.recipe import parallel
from srt_agent.recipe.build import _weighted
from srt_agent.recipe.demos import DemoSource, collect_demos, demo_seeds, to_transcript
from srt_agent.recipe.parallel import chunks, collect_all, make_pool, tokenize_all


@pytest.mark.parametrize(("n", "parts"), [(10, 3), (7, 7), (2, 5), (1, 2), (1000, 2)])
def test_chunks_cover_the_range_in_order(n: int, parts: int) -> None:
    got = chunks(n, parts)
    assert [i for r in got for i in r] == list(range(n))
    assert len(got) == min(n, parts) and all(len(r) > 0 for r in got)
    assert max(map(len, got)) - min(map(len, got)) <= 1


def test_no_pool_for_small_builds() -> None:
    assert make_pool(2, 2 * parallel.MIN_CHUNK - 1) is None
    assert make_pool(1, 10**6) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the build forks only on Linux")
def test_parallel_collection_and_tokenization_equal_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "MIN_CHUNK", 3)  # split even these few episodes over two workers
    env = "srt/GuessNumber-v0"
    serial = collect_demos(env, 8, build_seed=1)
    fmt = ChatFormat(tokenizer())
    weigh = partial(_weighted, env, frozenset({5, 7}), 4.0)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        sources = [DemoSource(env, 8), DemoSource("srt/Calculator-v0", 6, "mental")]
        demos = collect_all(sources, 1, pool, 2)
        examples = tokenize_all(fmt, demos[env], pool, 2, weigh)
    assert demos[env] == serial
    mental = collect_demos("srt/Calculator-v0", 6, seeds=demo_seeds(6, 1), demonstrator="mental")
    assert demos["srt/Calculator-v0/mental"] == mental
    want = [weigh(tr.token_ids, tr.loss_mask) for tr in (to_transcript(fmt, d) for d in serial)]
    assert examples == want
