"""The engine's per-step host paths: the native core (``srt_agent._native``) against its Python
twins (identical results), and one-pass fast paths against the rule they implement.

CI builds the core (``pip install -e .`` compiles it); the first test fails when it is missing, so
a broken build cannot pass unnoticed. ``SRT_NATIVE=0`` runs everything on the Python path.
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import pytest

from srt_agent import native
from srt_agent.contracts.draft import DraftTree
from srt_agent.contracts.generation import GenerationRequest, SamplingParams
from srt_agent.engine.batching import _commit_tokens
from srt_agent.engine.kv_cache import KVCache
from srt_agent.engine.sequence import SequenceState
from srt_agent.engine.speculation.acceptance import Acceptance
from srt_agent.engine.speculation.budget import CostModel, _depth_sums, subtree
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.speculation.speculator import Emitted, _walk_drawn
from srt_agent.engine.step_graphs import StepGraphs, bucket
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.speed.random_model import save_random_model

needs_core = pytest.mark.skipif(native.core is None, reason="the native core is not built or is disabled")


def test_the_native_core_is_built() -> None:
    if os.environ.get("SRT_NATIVE") == "0":
        pytest.skip("SRT_NATIVE=0: the Python path on purpose")
    assert native.core is not None, (
        "srt_agent._native is missing: reinstall with a C++17 compiler (pip install -e .) to build it"
    )


def _random_tree(rng: random.Random, size: int) -> list[int]:
    """Parents of a tree of ``size`` positions: the root (-1), then parents that precede their child."""
    return [-1] + [rng.randrange(j) for j in range(1, size)]


@needs_core
def test_native_tree_layout_writes_what_the_python_one_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TorchEngine(save_random_model(tmp_path, seed=0), max_batch_size=8, tokenizer=None) as eng:
        cache = KVCache(2, 2, 16, 8, 64, initial_rows=9, initial_positions=64)
        steps = StepGraphs(eng.model, cache, max_width=16, capture=False)
        rng = random.Random(1)
        core = native.core
        for _ in range(100):
            rows = rng.randint(1, 8)
            trees = [_random_tree(rng, rng.randint(1, 16)) for _ in range(rows)]
            ids = [[rng.randrange(50) for _ in t] for t in trees]
            uniforms = rng.choice([[[rng.random() for _ in range(rng.randint(1, 17))] for _ in trees], None])
            prefix = [rng.randrange(40) for _ in trees]
            temperature, top_k = rng.choice([0.0, 0.7, 1.0]), rng.choice([0, 5])
            params = [SamplingParams(temperature=temperature, top_k=top_k)] * rows
            bb, tb = bucket(rows), bucket(max(len(t) for t in trees))
            if tb == 1:
                continue
            got = []
            for backend in (core, None):
                monkeypatch.setattr(native, "core", backend)
                steps._ints_np[:] = -7
                steps._floats_np[:] = -7.0
                steps._fill(ids, prefix, trees, uniforms, params, bb, tb)
                got.append((steps._ints_np.tolist(), steps._floats_np.tolist()))
            assert got[0] == got[1]


def _random_draft(rng: random.Random) -> DraftTree:
    n = rng.randint(1, 12)
    parents = [-1] + [rng.randrange(-1, j) for j in range(1, n)]
    tokens: list[int] = []
    for j, p in enumerate(parents):  # distinct tokens under one parent
        taken = {tokens[i] for i in range(j) if parents[i] == p}
        tokens.append(min(set(range(20)) - taken))
    # Ties, values past [0, 1] and repeated probabilities exercise the clipping and the sort.
    probs = [rng.choice([0.5, 0.25, 1.0, 1.5, -0.1, 0.0, rng.random()]) for _ in range(n)]
    return DraftTree(tuple(tokens), tuple(parents), tuple(probs))


@needs_core
def test_native_ranking_and_depth_sums_equal_the_python_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(2)
    acceptance = Acceptance()
    acceptance.observe([("none", d, 3, 1.5, rng.randint(0, 3)) for d in range(1, 13)])
    model = CostModel(SpecConfig())
    model.acceptance = acceptance
    core = native.core
    for _ in range(500):
        draft = _random_draft(rng)
        path = sorted(rng.sample(range(len(draft)), rng.randint(0, len(draft))))
        got = []
        for backend in (core, None):
            monkeypatch.setattr(native, "core", backend)
            got.append((model.rank(draft), _depth_sums(draft, path)))
        (ranked_c, sums_c), (ranked_py, sums_py) = got
        assert ranked_c.order == ranked_py.order and ranked_c.values == ranked_py.values
        assert sums_c == sums_py


def _commit_by_token(seq: SequenceState, em: Emitted) -> tuple[str, int | None] | None:
    """The commit rule token by token: a stop token ends first, then the length limit."""
    for token, logprob in zip(em.tokens, em.logprobs, strict=True):
        seq.tokens.append(token)
        seq.logprobs.append(logprob)
        if token in seq.request.params.stop_token_ids:
            return "stop", token
        if seq.tokens_left() <= 0:
            return "length", None
    return None


def test_committing_emitted_tokens_at_once_follows_the_token_by_token_rule() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        params = SamplingParams(
            max_new_tokens=rng.randint(1, 12), stop_token_ids=tuple(rng.sample(range(6), rng.randint(0, 2)))
        )
        prompt = tuple(range(rng.randint(1, 5)))
        before = [rng.randrange(6) for _ in range(rng.randint(0, params.max_new_tokens - 1))]
        emitted = Emitted(
            [rng.randrange(6) for _ in range(rng.randint(1, 9))], [rng.random() for _ in range(9)]
        )
        emitted.logprobs[:] = emitted.logprobs[: len(emitted.tokens)]
        seqs = [
            SequenceState(
                GenerationRequest("r", prompt, params),
                on_done=lambda _: None,
                cancelled=lambda: False,
                seed=0,
                max_total=len(prompt) + rng.randint(len(before) + 1, 16),
                tokens=list(before),
                logprobs=[0.0] * len(before),
            )
        ]
        seqs.append(dataclasses.replace(seqs[0], tokens=list(before), logprobs=[0.0] * len(before)))
        results: list = []
        ended = _commit_tokens(seqs[0], emitted, results)
        expected = _commit_by_token(seqs[1], emitted)
        assert (seqs[0].tokens, seqs[0].logprobs) == (seqs[1].tokens, seqs[1].logprobs)
        assert ended == (expected is not None)
        assert [(r[1], r[2]) for r in results] == ([expected] if expected else [])


@needs_core
def test_native_acceptance_walks_equal_the_python_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(4)
    core = native.core
    for _ in range(300):
        drafts = [_random_draft(rng) for _ in range(rng.randint(1, 6))]
        width = 1 + max(len(d) for d in drafts)
        # Draws that often follow the drafts (a drafted child of some node) and sometimes not.
        drawn = [[rng.choice([*d.token_ids, 99]) for _ in range(width)] for d in drafts]
        logprobs = [[-rng.random() for _ in range(width)] for _ in drafts]
        got = []
        for backend in (core, None):
            monkeypatch.setattr(native, "core", backend)
            got.append(_walk_drawn(drafts, drawn, logprobs))
        assert got[0] == got[1]


def test_a_subtree_of_the_first_nodes_equals_the_reindexed_one() -> None:
    rng = random.Random(5)
    for _ in range(500):
        draft = _random_draft(rng)
        k = rng.randint(1, len(draft))
        nodes = list(range(k)) if rng.random() < 0.5 else _closed_sample(rng, draft)
        kept = sorted(nodes)
        index = {j: i for i, j in enumerate(kept)}
        expected = (
            tuple(draft.token_ids[j] for j in kept),
            tuple(index[draft.parents[j]] if draft.parents[j] >= 0 else -1 for j in kept),
            tuple(draft.probs[j] for j in kept),
        )
        got = subtree(draft, nodes)
        assert (got.token_ids, got.parents, got.probs) == expected


def _closed_sample(rng: random.Random, draft: DraftTree) -> list[int]:
    """Random nodes of ``draft`` with all their ancestors (a valid subtree's nodes)."""
    chosen: set[int] = set()
    for j in rng.sample(range(len(draft)), rng.randint(1, len(draft))):
        while j >= 0 and j not in chosen:
            chosen.add(j)
            j = draft.parents[j]
    return list(chosen)


@needs_core
def test_native_choice_of_drafts_equals_the_python_one(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(6)
    core = native.core
    for _ in range(100):
        drafts = [_random_draft(rng) for _ in range(rng.randint(1, 8))]
        groups = [rng.choice(["a", "b"]) for _ in drafts]
        got = []
        for backend in (core, None):
            monkeypatch.setattr(native, "core", backend)
            model = CostModel(SpecConfig())
            model.set_prior([(1, 1e-3), (2, 1.2e-3), (5, 1.5e-3), (9, 2e-3), (17, 3e-3)])
            chosen = model.choose(drafts, groups)
            got.append([(d.token_ids, d.parents, d.probs) for d in chosen])
        assert got[0] == got[1]
