"""SGLang's corpus on the native core: drafts laid out natively equal the Python layout, bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest

from srt_agent import native
from srt_agent.integrations.sglang.corpus import TreeCacheCorpus, native_flat
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

pytestmark = pytest.mark.skipif(native.core is None, reason="the native core is not built (or SRT_NATIVE=0)")


@pytest.mark.parametrize("width", [1, 2, 5, 9])
def test_native_layout_equals_the_python_layout(width: int) -> None:
    rng = random.Random(width)
    vocab = 40
    corpora = [
        TreeCacheCorpus(TreeCache(TreeCacheConfig(backend=b), python_prices=True), width, vocab)  # type: ignore[arg-type]
        for b in ("python", "native")
    ]
    phrases = [[rng.randrange(12) for _ in range(rng.randrange(2, 7))] for _ in range(10)]
    contexts: dict[str, list[int]] = {}
    prompts = [[rng.randrange(vocab) for _ in range(5)] for _ in range(4)]
    for step in range(300):
        while len(contexts) < 8:  # GRPO groups: several requests share a prompt
            rid = f"req{step}-{len(contexts)}"
            contexts[rid] = list(rng.choice(prompts))
            for corpus in corpora:
                corpus.bind(rid, contexts[rid])
        ids = list(contexts)
        tails = [contexts[r][-6:] for r in ids]
        lens = [len(contexts[r]) for r in ids]
        (t_py, m_py), (t_nat, m_nat) = (c.batch_get(ids, tails, lens) for c in corpora)
        assert np.array_equal(t_py, t_nat) and np.array_equal(m_py, m_nat), step
        for r in ids:
            contexts[r].extend(rng.choice(phrases)[: rng.randrange(1, 4)])
        done = [r for r in ids if len(contexts[r]) > rng.randrange(20, 60)]
        for corpus in corpora:
            corpus.erase_match_state(done)
        for r in done:
            del contexts[r]
    stats = [c.cache.stats() for c in corpora]
    assert stats[0] == stats[1] and (width == 1 or stats[0].nodes_served > 200)


def test_draft_flat_needs_the_native_core() -> None:
    with pytest.raises(RuntimeError, match="needs the native core"):
        native_flat(TreeCache(TreeCacheConfig(backend="python")), [], [], 4, 10)
