"""Static-shape decode and verify steps (what CUDA graphs capture), checked on CPU against the eager path.

``TorchEngine(cuda_graphs=True)`` on a CPU runs the very steps a GPU captures (padded rows and tree
positions, power-of-two spans, device-built masks and positions, draws at every position, one read
back), only without the capture. So everything but the capture itself is tested here: same tokens,
same logprobs, same cache contents, and exact sampling (the chi-square test in
``test_engine_spec_exact.py`` runs this path too).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from spec_drafters import NoisyReplay
from test_engine_spec import ALWAYS, REQUESTS, VOCAB, _book, _spec_engine

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams
from srt_agent.engine.hf_checkpoint import read_state_dict
from srt_agent.engine.kv_cache import KVCache, mask_bias, tree_bias
from srt_agent.engine.step_graphs import StepGraphs, bucket
from srt_agent.engine.torch_engine import TorchEngine, default_dtype
from srt_agent.speed.random_model import char_tokenizer, save_random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_model(tmp_path_factory.mktemp("static"), seed=2, init_std=0.15)


def _same(a: Sequence[GenerationOutput], b: Sequence[GenerationOutput], tol: float = 1e-4) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids, x.request_id
        assert x.finish_reason == y.finish_reason
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0.0) <= tol


def _engine(model_dir: Path, **kw: object) -> TorchEngine:
    return TorchEngine(model_dir, tokenizer=char_tokenizer(VOCAB), max_batch_size=8, **kw)  # type: ignore[arg-type]


def test_bucket_is_the_next_power_of_two() -> None:
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 5, 9, 16, 17)] == [1, 1, 2, 4, 4, 8, 16, 16, 32]
    assert bucket(3, floor=256) == 256


def test_default_dtype_is_bf16_on_cuda_only() -> None:
    assert default_dtype("cpu") == torch.float32
    assert default_dtype("cuda") == torch.bfloat16


def test_plain_decoding_equals_the_eager_path(model_dir: Path) -> None:
    with _engine(model_dir) as eager:
        ref = eager.generate(REQUESTS)
        assert eager.graphs is None  # off by default on a CPU
    with _engine(model_dir, cuda_graphs=True) as static:
        out = static.generate(REQUESTS)
        stats = static.stats()
    _same(ref, out)
    assert stats.static_eager_steps == stats.decode_steps > 0
    assert stats.graph_shapes == stats.graph_replays == 0  # nothing is captured on a CPU


@pytest.mark.parametrize("corrupt", [0.0, 0.3, 1.0])
def test_verified_drafts_equal_the_eager_path(model_dir: Path, corrupt: float) -> None:
    with _engine(model_dir) as plain:
        ref = plain.generate(REQUESTS)
    outs, forwards = [], []
    for static in (False, True):
        source = NoisyReplay(_book(ref), VOCAB, seed=5, corrupt=corrupt)
        with _spec_engine(model_dir, source, cuda_graphs=static) as eng:
            outs.append(eng.generate(REQUESTS))
            forwards.append(eng.spec_stats())
    _same(outs[0], outs[1])
    _same(ref, outs[1])  # and both equal plain decoding (seeded: exact verification)
    assert forwards[0].nodes_accepted == forwards[1].nodes_accepted
    assert forwards[1].verify_forwards > 0


def test_continuous_batching_and_the_prefix_store_on_static_steps(model_dir: Path) -> None:
    # More requests than rows: rows leave and join between steps (row moves, padding rows, spans).
    prompts = [tuple(random.Random(i).choices(range(VOCAB), k=5 + 7 * i)) for i in range(12)]
    reqs = [
        GenerationRequest(f"q{i}", p, SamplingParams(temperature=1.0, seed=i, max_new_tokens=10 + 3 * i))
        for i, p in enumerate(prompts)
    ]
    # A second turn that extends the first: its prefix comes back from the parked row.
    follow = [  # longer than the store's block (32 tokens): its prefix is looked up and reused
        GenerationRequest("f0", (*prompts[5], 7, 8), SamplingParams(temperature=0.0, max_new_tokens=12))
    ]
    results = []
    for static in (False, True):
        with _engine(model_dir, cuda_graphs=static) as eng:
            first = eng.generate(reqs)
            results.append((first, eng.generate(follow), eng.stats()))
    _same(results[0][0], results[1][0])
    _same(results[0][1], results[1][1])
    assert results[1][2].joined_running > 0
    assert all(r[2].prefix_hits == 1 and r[2].prefix_tokens_reused == len(prompts[5]) for r in results)


def test_weight_updates_reach_static_steps(model_dir: Path, tmp_path: Path) -> None:
    other = save_random_model(tmp_path / "other", seed=9, init_std=0.15)
    with _engine(other) as fresh:
        want = fresh.generate(REQUESTS)
    with _engine(model_dir, cuda_graphs=True) as eng:
        eng.generate(REQUESTS)  # steps of the old weights first
        eng.update_weights(read_state_dict(other))
        got = eng.generate(REQUESTS)
    _same(want, got)


@pytest.mark.parametrize("seed", range(5))
def test_mask_bias_equals_tree_bias(seed: int) -> None:
    rng = random.Random(seed)
    rows = rng.randint(1, 6)
    parents = []
    for _ in range(rows):
        n = rng.randint(1, 9)
        parents.append([-1] + [rng.randrange(j) for j in range(1, n)])
    width = max(len(p) for p in parents)
    prefix = [rng.randint(0, 20) for _ in range(rows)]
    length = max(prefix) + width + rng.randint(0, 5)
    bias, _ = tree_bias(prefix, parents, length, torch.float32)
    masks = torch.zeros((rows, width), dtype=torch.long)
    for b, row in enumerate(parents):
        row_masks: list[int] = []
        for j in range(width):
            up = row[j] if j < len(row) else j - 1  # padding chains onto the previous node
            row_masks.append((row_masks[up] if up >= 0 else 0) | (1 << j))
        masks[b] = torch.tensor(row_masks)
    assert torch.equal(mask_bias(torch.tensor(prefix), masks, length, torch.float32), bias)


def test_keep_many_equals_keep_row_by_row() -> None:
    torch.manual_seed(0)
    a = KVCache(2, 2, 4, 4, 32, initial_rows=4, initial_positions=32)
    a.data.normal_()
    b = KVCache(2, 2, 4, 4, 32, initial_rows=4, initial_positions=32)
    b.data.copy_(a.data)
    keeps = [(0, 5, [0, 2, 3]), (2, 9, [0, 1, 4, 6]), (3, 1, [0, 1])]
    for row, start, offsets in keeps:
        a.keep(row, start, offsets)
    b.keep_many(keeps)
    assert torch.equal(a.data, b.data)
    with pytest.raises(ValueError, match="strictly increasing"):
        b.keep_many([(1, 0, [0, 3, 2])])


def test_static_steps_need_a_full_size_cache(model_dir: Path) -> None:
    with _engine(model_dir) as eng:
        grown = KVCache(2, 2, 32, 8, 64)  # starts small: would move when grown
        with pytest.raises(ValueError, match="full size"):
            StepGraphs(eng.model, grown, max_width=1, capture=False)
        full = KVCache(2, 2, 32, 8, 64, initial_rows=8, initial_positions=64)
        with pytest.raises(ValueError, match="CUDA device"):
            StepGraphs(eng.model, full, max_width=1, capture=True)
        steps = StepGraphs(eng.model, full, max_width=9, capture=False)
        # One row is kept spare (prefills' padding rows write there): 7 rows of steps. Every
        # verify step is padded to the one verify width (9 positions), not a power of two.
        assert steps.max_width == 9 and steps.fits(7, 9) and steps.fits(7, 2)
        assert not steps.fits(8, 1) and not steps.fits(1, 10)
        assert steps.fits_prefill(7, 16, 48) and not steps.fits_prefill(7, 17, 48)  # 48 + 32 > 64


def test_wide_trees_fall_back_to_the_eager_verifier(model_dir: Path) -> None:
    # max_draft_tokens=40: trees wider than a static step verify on the eager path; same outputs.
    wide = ALWAYS.model_copy(update={"max_draft_tokens": 40})
    with _engine(model_dir) as plain:
        ref = plain.generate(REQUESTS)
    source = NoisyReplay(_book(ref), VOCAB, seed=5, corrupt=0.0)
    with _spec_engine(model_dir, source, spec=wide, cuda_graphs=True) as eng:
        out = eng.generate(REQUESTS)
    _same(ref, out)


def test_prefills_run_as_static_steps_and_long_ones_eagerly(model_dir: Path, tmp_path: Path) -> None:
    long_model = save_random_model(tmp_path / "long", seed=2, init_std=0.15, max_position_embeddings=2048)
    reqs = [
        GenerationRequest(
            "short", tuple(range(1, 30)), SamplingParams(temperature=1.0, seed=1, max_new_tokens=5)
        ),
        GenerationRequest(
            "long", tuple(i % 90 + 1 for i in range(1100)), SamplingParams(seed=2, max_new_tokens=5)
        ),
        GenerationRequest("greedy", tuple(range(5, 60)), SamplingParams(temperature=0.0, max_new_tokens=5)),
    ]
    outs = []
    for static in (False, True):
        with TorchEngine(long_model, max_batch_size=4, cuda_graphs=static) as eng:
            outs.append([eng.generate([r])[0] for r in reqs])  # one prefill each
            if static:
                assert eng.graphs is not None
                assert eng.graphs.prefills == 2  # the 1100-token prompt (> MAX_PREFILL) ran eagerly
    _same(outs[0], outs[1])


def test_warm_up_builds_every_shape_a_rollout_meets(model_dir: Path) -> None:
    # An RL batch: every request samples at temperature 1 (one set of sampling flags), more
    # requests than rows (rows join and leave), drafts verified, then a second turn whose prefix
    # comes back from the prefix store (a prefill after a reused prefix).
    prompts = [tuple(random.Random(i).choices(range(VOCAB), k=5 + 7 * i)) for i in range(12)]
    reqs = [
        GenerationRequest(
            f"w{i}", p, SamplingParams(temperature=1.0, seed=i, max_new_tokens=10 + 3 * i), task_id=f"w{i}"
        )
        for i, p in enumerate(prompts)
    ]
    with _engine(model_dir) as plain:
        ref = plain.generate(reqs)
    turn = (*prompts[3], *ref[3].token_ids, 7, 8)  # the episode's next turn: its prefix is parked
    follow = [GenerationRequest("f0", turn, SamplingParams(seed=3, max_new_tokens=12))]
    results = []
    for warm in (False, True):
        source = NoisyReplay(_book(ref), VOCAB, seed=5, corrupt=0.3)
        with _spec_engine(model_dir, source, cuda_graphs=True) as eng:
            assert eng.graphs is not None
            seconds = eng.warm_up([SamplingParams()]) if warm else 0.0
            before = eng.graphs.shapes
            outs = eng.generate(reqs), eng.generate(follow)
            results.append((outs, eng.stats(), eng.spec_stats(), eng.graphs.shapes - before, seconds))
            listed = len(eng.graphs.warm_shape_list())
    (cold, _, _, cold_new, _), (warm_out, stats, spec, new, seconds) = results
    _same(cold[0], warm_out[0])  # warm-up's placeholder writes change nothing
    _same(cold[1], warm_out[1])
    _same(ref, warm_out[0])
    assert spec.verify_forwards > 0 and stats.prefix_hits > 0
    assert stats.warm_shapes == listed > 0 and seconds > 0
    assert cold_new > 0  # without warm-up the run builds its shapes as it meets them
    assert new == 0 and stats.unwarmed_shapes == 0  # with it, none is built mid-run


def test_warm_up_covers_its_flags_only_and_never_captures_mid_run(model_dir: Path) -> None:
    # Near the end of the context (256 here), a verify step's 9 positions reach past the last
    # power-of-two span: a shape warm-up leaves to the eager path (counted, never captured).
    long = GenerationRequest(
        "long",
        tuple(i % 90 + 1 for i in range(236)),
        SamplingParams(seed=1, max_new_tokens=20),
        task_id="long",
    )
    with _engine(model_dir) as plain:
        ref = plain.generate([long])
    with _spec_engine(
        model_dir, NoisyReplay(_book(ref), VOCAB, seed=1, corrupt=0.0), cuda_graphs=True
    ) as eng:
        graphs = eng.graphs
        assert graphs is not None
        eng.warm_up([SamplingParams()])
        warmed = graphs.shapes
        eng.warm_up([SamplingParams(temperature=1.0, seed=4)])
        assert graphs.shapes == warmed  # the same sampling flags: nothing new
        # Greedy requests have other flags: their shapes are built as met (captured, on a GPU).
        eng.generate([GenerationRequest("g", (1, 2, 3), SamplingParams(temperature=0.0, max_new_tokens=4))])
        assert graphs.shapes > warmed and graphs.unwarmed_shapes == 0
        out = eng.generate([long])
        assert eng.spec_stats().verify_forwards > 0
        assert graphs.unwarmed_shapes > 0 and graphs.unwarmed_runs >= graphs.unwarmed_shapes
    _same(ref, out)
    shapes = graphs.warm_shape_list()
    assert all(rows * width <= 2048 for kind, rows, width, _ in shapes if kind == "prefill")
    sizes = [rows * width * span for _, rows, width, span in shapes]
    assert sizes == sorted(sizes, reverse=True)  # largest first


class _FakeGraph:
    """Stands in for a captured CUDA graph on a CPU: a replay reruns the step into the same output."""

    def __init__(self, run: Callable[[], torch.Tensor]) -> None:
        self.run = run
        self.out = run().clone()

    def replay(self) -> None:
        self.out.copy_(self.run())


def capture_with_stand_ins(graphs: StepGraphs) -> None:
    """Turn "capture" on for ``graphs`` on a CPU: each shape is "captured" as a :class:`_FakeGraph`."""
    graphs.capture = True
    graphs._capture = lambda run: (lambda g: (g, g.out))(_FakeGraph(run))  # type: ignore[method-assign]


def test_replayed_and_eager_prefills_are_counted_apart(model_dir: Path) -> None:
    # With "capture" on (a stand-in graph on a CPU), every short prefill after warm-up is a replay;
    # a shape warm-up did not build runs eagerly and is counted as an unwarmed run each time.
    reqs = [
        GenerationRequest(f"p{i}", tuple(range(1, 9 + 5 * i)), SamplingParams(seed=i, max_new_tokens=6))
        for i in range(5)
    ]
    with _engine(model_dir) as plain:
        ref = plain.generate(reqs)
    with _engine(model_dir, cuda_graphs=True) as eng:
        graphs = eng.graphs
        assert graphs is not None
        capture_with_stand_ins(graphs)
        eng.warm_up([SamplingParams()])
        out = eng.generate(reqs)
        stats = eng.stats()
        assert stats.static_prefills == stats.prefill_forwards > 0
        assert stats.static_prefill_replays == stats.static_prefills and stats.unwarmed_runs == 0
        assert stats.graph_replays == stats.decode_steps
        # Greedy flags were never warmed, so their shapes are captured when met (replays too).
        eng.generate([GenerationRequest("g", (1, 2, 3), SamplingParams(temperature=0.0, max_new_tokens=4))])
        assert eng.stats().static_prefill_replays == stats.static_prefill_replays + 1
        # A warmed flag's prefill at a span warm-up did not build: run eagerly, never captured.
        graphs._graphs = {k: v for k, v in graphs._graphs.items() if k[0] != "prefill"}
        eng.generate([GenerationRequest("e", (4, 5, 6), SamplingParams(seed=9, max_new_tokens=3))])
        after = eng.stats()
        assert after.static_prefills == stats.static_prefills + 2
        assert after.static_prefill_replays == stats.static_prefill_replays + 1  # the greedy one only
        assert after.unwarmed_runs >= 1 and after.unwarmed_shapes >= 1
    _same(ref, out)
