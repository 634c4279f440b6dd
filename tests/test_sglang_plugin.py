"""The SRT plugin against stand-ins of the SGLang classes it uses (tests/sglang_stub/, sglang 0.5.23).

Registration goes through the installed ``sglang.srt.plugins`` entry point, SGLang's algorithm
object gets what SGLang's scheduler calls, and the worker's corpus drafts from the tree cache in
SGLang's layout, exactly under SGLang's rule, keeping its trees across flushes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from srt_agent.integrations.sglang import plugin
from srt_agent.integrations.sglang.rule import emitted_distribution

STUB = Path(__file__).parent / "sglang_stub"
D = 6  # --speculative-num-draft-tokens
VOCAB = 50


@pytest.fixture()
def sglang() -> Iterator[Any]:
    """The stand-in ``sglang`` package, imported fresh (and removed afterwards)."""
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(STUB))
    try:
        yield importlib.import_module("sglang.srt.speculative.spec_registry")
    finally:
        sys.path.remove(str(STUB))
        for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[name]
        sys.modules.update(saved)


@dataclass
class Req:
    rid: str
    origin_input_ids_unpadded: list[int]
    output_ids: list[int] = field(default_factory=list)
    priority: int | None = None


def _server_args(**kw: Any) -> SimpleNamespace:
    args = {
        "speculative_num_draft_tokens": D, "speculative_ngram_max_trie_depth": 18,
        "speculative_ngram_max_bfs_breadth": 10, "speculative_accept_threshold_single": 1.0,
        "speculative_accept_threshold_acc": 1.0, "disable_overlap_schedule": False, "device": "cuda",
        "max_running_requests": None, "speculative_num_steps": None, "enable_mixed_chunk": True,
    }  # fmt: skip
    return SimpleNamespace(**{**args, **kw})


def _worker(spec_registry: Any) -> Any:
    plugin.register()
    algo = spec_registry.get_spec("srt")
    runner = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))
    cls = algo.create_worker(_server_args())
    return cls(_server_args(), gpu_id=0, nccl_port=0, target_worker=SimpleNamespace(model_runner=runner))


def _parents(mask: np.ndarray) -> list[int]:
    """Each slot's parent from SGLang's ancestor-or-self mask (the largest strict ancestor)."""
    return [-1] + [int(max(np.flatnonzero(mask[i, :i]))) for i in range(1, len(mask))]


def _chain(tokens: np.ndarray, mask: np.ndarray) -> list[int]:
    """The tokens on the deepest root-to-leaf path (the pads are one-node branches)."""
    depth = mask.sum(axis=1)
    node, parents, out = int(np.argmax(depth)), _parents(mask), []
    while node > 0:
        out.append(int(tokens[node]))
        node = parents[node]
    return out[::-1]


def test_the_entry_point_registers_srt_with_what_sglangs_scheduler_calls(sglang: Any) -> None:
    (ep,) = [e for e in importlib.metadata.entry_points(group="sglang.srt.plugins") if e.name == "srt"]
    ep.load()()  # what sglang.srt.plugins.load_plugins does, in every SGLang process
    ep.load()()  # a second load is a no-op, not a duplicate-name error
    algo = sglang.get_spec("SRT")
    assert isinstance(algo, sglang.CustomSpecAlgo) and algo.supports_overlap
    assert algo.is_ngram() and not algo.has_draft_kv() and not algo.carries_draft_hidden_states()
    assert not algo.need_topk() and algo.get_platform_worker_cls() is None
    future = algo.create_future_map("cuda", "pool", needs_cpu_seq_lens=False)
    assert future.spec_algorithm is algo and future.needs_cpu_seq_lens is False
    args = _server_args()
    algo.validate_server_args(args)
    algo.handle_server_args(args)
    assert (args.max_running_requests, args.enable_mixed_chunk, args.speculative_eagle_topk) == (
        48,
        False,
        10,
    )
    assert args.speculative_num_steps == D // 10  # as SGLang sets it for NGRAM (unused by n-gram trees)
    with pytest.raises(ValueError, match=r"--speculative-accept-threshold-acc 0\.5"):
        algo.validate_server_args(_server_args(speculative_accept_threshold_acc=0.5))


def test_the_worker_drafts_a_groups_earlier_samples_in_sglangs_layout(sglang: Any) -> None:
    worker = _worker(sglang)
    prompt = [3, 4, 5, 6]
    first = Req("a", prompt, [7])
    for t in (8, 9, 10, 11):  # sample a decodes (the drafts do not matter to what it emits)
        worker._prepare_draft_tokens(SimpleNamespace(reqs=[first]))
        first.output_ids.append(t)
    second = Req("b", prompt, [7])  # the same prompt: the same conversation state
    tokens, mask = worker._prepare_draft_tokens(SimpleNamespace(reqs=[first, second]))
    tokens, mask = tokens.reshape(2, D), mask.reshape(2, D, D)
    assert tokens.dtype == np.int64 and tokens[1, 0] == 7  # the root: b's last context token
    assert _chain(tokens[1], mask[1]) == [8, 9, 10, 11]  # a's continuation after 7
    for row in range(2):
        parents = _parents(mask[row])
        pairs = [(p, int(t)) for p, t in zip(parents[1:], tokens[row, 1:], strict=True)]
        assert len(set(pairs)) == len(pairs)  # distinct candidates under every node
        assert all(mask[row, i, i] and mask[row, i, 0] for i in range(D))

    # A flush (weight update) keeps the trees; only the requests' streams go.
    worker.clear_cache_pool()
    third = Req("c", prompt, [7])
    tokens, mask = worker._prepare_draft_tokens(SimpleNamespace(reqs=[third]))
    assert _chain(tokens, mask.reshape(D, D)) == [8, 9, 10, 11]
    worker.ngram_corpus.erase_match_state(["c"])
    with pytest.raises(ValueError, match="external n-gram corpora"):
        worker.add_external_corpus("x", [[1, 2]])


def test_the_workers_trees_are_exact_under_sglangs_rule(sglang: Any) -> None:
    worker = _worker(sglang)
    rng = np.random.default_rng(0)
    prompt = [1, 2]
    for k in range(6):  # several samples from one state, so the tree branches
        req = Req(f"s{k}", prompt, [3])
        for t in rng.integers(0, 4, size=3):
            worker._prepare_draft_tokens(SimpleNamespace(reqs=[req]))
            req.output_ids.append(int(t))
        worker.ngram_corpus.erase_match_state([req.rid])
    tokens, mask = worker._prepare_draft_tokens(SimpleNamespace(reqs=[Req("probe", prompt, [3])]))
    parents = _parents(mask.reshape(D, D))

    def target(emitted: tuple[int, ...]) -> np.ndarray:
        q = np.random.default_rng([9, *emitted]).dirichlet(np.ones(VOCAB))
        return q

    dist = emitted_distribution(list(tokens), parents, target, D)
    assert abs(sum(dist.values()) - 1.0) < 1e-12
    first = np.zeros(VOCAB)
    for seq, w in dist.items():
        first[seq[0]] += w
    assert np.allclose(first, target(()), atol=1e-12)
    # The joint, not only the first token: a step emits one to D tokens, so continue each emitted
    # tuple with the target itself; every prefix must then have the target's own probability. The
    # prefixes are the tree's paths (where acceptance happens, down to its deepest level), one
    # token off each, and random ones.
    paths = {()}
    for node in range(1, D):
        path, at = [], node
        while at > 0:
            path.append(int(tokens[at]))
            at = parents[at]
        paths.add(tuple(path[::-1]))
    prefixes = {p for p in paths if p}
    prefixes |= {(*p, int(t)) for p in paths for t in rng.integers(0, VOCAB, size=3)}
    prefixes |= {tuple(int(t) for t in rng.integers(0, VOCAB, size=k)) for k in (2, 3) for _ in range(20)}

    def joint(prefix: tuple[int, ...]) -> float:
        return float(np.prod([target(prefix[:i])[prefix[i]] for i in range(len(prefix))]))

    def emitted_then_target(prefix: tuple[int, ...]) -> float:
        total = 0.0
        for seq, w in dist.items():
            n = min(len(seq), len(prefix))
            if seq[:n] == prefix[:n]:
                total += w * float(np.prod([target(prefix[:i])[prefix[i]] for i in range(n, len(prefix))]))
        return total

    assert max(len(p) for p in prefixes) >= 3
    for prefix in prefixes:
        assert emitted_then_target(prefix) == pytest.approx(joint(prefix), rel=1e-9, abs=1e-15), prefix


def test_sglang_serve_builds_the_launch_command_and_keeps_the_plugin_allowed() -> None:
    from srt_agent.integrations.sglang.launch import server_command, server_env

    cmd = server_command(
        "Qwen/Qwen2.5-0.5B-Instruct", host="0.0.0.0", port=30001, draft_tokens=8, extra=["--tp", "2"]
    )
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and cmd[-2:] == ["--tp", "2"]
    flags = dict(zip(cmd[3:-2:2], cmd[4:-2:2], strict=True))
    assert flags["--speculative-algorithm"] == "SRT" and flags["--speculative-num-draft-tokens"] == "8"
    assert (
        flags["--speculative-accept-threshold-acc"] == flags["--speculative-accept-threshold-single"] == "1.0"
    )
    with pytest.raises(ValueError, match="set by srt-agent sglang-serve"):
        server_command("m", host="h", port=1, draft_tokens=8, extra=["--speculative-algorithm=NGRAM"])
    assert server_env({"SGLANG_PLUGINS": "other"})["SGLANG_PLUGINS"] == "other,srt"
    assert "SGLANG_PLUGINS" not in server_env({})  # no allow-list: every plugin loads
