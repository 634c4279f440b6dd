"""TorchEngine's own forward pass: logit parity with HF, token-tree forwards, cache compaction, loading."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from srt_agent.engine.hf_checkpoint import CheckpointError, read_config, read_state_dict
from srt_agent.engine.kv_cache import KVCache, causal_bias, decode_bias, tree_bias
from srt_agent.engine.llama import CausalLM
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.speed.random_model import save_random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


TOL = 1e-4
F32 = torch.float32


def _load(path: Path) -> tuple[CausalLM, Any]:
    config = read_config(path)
    model = CausalLM(config, read_state_dict(path))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=F32)
    return model, hf


def _cache(model: CausalLM, rows: int = 4, positions: int = 256) -> KVCache:
    c = model.config
    return KVCache(c.num_layers, c.num_kv_heads, c.head_dim, rows, positions, initial_rows=rows)


def _hf_logits(hf: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]  # (T, V)


MODELS = {
    "llama-gqa-tied": {"architecture": "llama", "tie_word_embeddings": True},
    "llama-untied-mha": {"architecture": "llama", "num_key_value_heads": 4},
    "qwen2-qkv-bias": {"architecture": "qwen2", "tie_word_embeddings": False},
    "llama-bias-rope-theta": {
        "architecture": "llama",
        "attention_bias": True,
        "mlp_bias": True,
        "rope_theta": 500.0,
    },
    "llama3-rope-scaling": {
        "architecture": "llama",
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "linear-rope-scaling": {"architecture": "llama", "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[CausalLM, Any]:
    path = save_random_model(tmp_path_factory.mktemp(request.param), seed=1, **MODELS[request.param])
    return _load(path)


def test_prefill_then_decode_match_hf(pair: tuple[CausalLM, Any]) -> None:
    model, hf = pair
    ids = [
        int(t)
        for t in torch.randint(0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
    ]
    prompt, rest = ids[:30], ids[30:]
    ref = _hf_logits(hf, ids)  # (40, V)
    cache = _cache(model)
    pos = torch.arange(30)[None]
    logits = model.forward(torch.tensor([prompt]), pos, cache, 0, pos, causal_bias([0], 30, 30, F32))
    assert (logits[0] - ref[:30]).abs().max().item() < TOL
    for i, tok in enumerate(rest):  # decode one token at a time after the prefill
        n = 30 + i
        p = torch.tensor([[n]])
        out = model.forward(
            torch.tensor([[tok]]), p, cache, 0, p, decode_bias(torch.tensor([n + 1]), n + 1, F32)
        )
        assert (out[0, 0] - ref[n]).abs().max().item() < TOL


def test_ragged_batch_prefill_and_decode_match_hf(pair: tuple[CausalLM, Any]) -> None:
    model, hf = pair
    gen = torch.Generator().manual_seed(4)
    lengths = [5, 17, 11]
    seqs = [torch.randint(0, model.config.vocab_size, (n + 1,), generator=gen).tolist() for n in lengths]
    cache = _cache(model)
    t = max(lengths)
    ids = torch.zeros((3, t), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.tensor(seqs[i][:n])
    pos = torch.arange(t).expand(3, t)
    last = torch.tensor(lengths) - 1
    logits = model.forward(ids, pos, cache, 0, pos, causal_bias([0, 0, 0], t, t, F32), logit_index=last)
    nxt = torch.tensor([[s[-1]] for s in seqs])
    lens = torch.tensor(lengths) + 1
    dec = model.forward(
        nxt, (lens - 1)[:, None], cache, 0, (lens - 1)[:, None], decode_bias(lens, t + 1, F32)
    )
    for i, s in enumerate(seqs):
        ref = _hf_logits(hf, s)
        assert (logits[i] - ref[lengths[i] - 1]).abs().max().item() < TOL
        assert (dec[i, 0] - ref[lengths[i]]).abs().max().item() < TOL


def test_tree_forward_and_keep_path_equal_causal(pair: tuple[CausalLM, Any]) -> None:
    model, hf = pair
    v = model.config.vocab_size
    gen = torch.Generator().manual_seed(5)
    prefixes = [torch.randint(0, v, (n,), generator=gen).tolist() for n in (9, 4)]
    # Row 0: root 0 with children 1, 2; 3 under 1; 4 under 3; a second root 5. Row 1: a 3-chain.
    parents = [[-1, 0, 0, 1, 3, -1], [-1, 0, 1]]
    nodes = [torch.randint(0, v, (len(p),), generator=gen).tolist() for p in parents]
    cache = _cache(model)
    t = max(len(p) for p in prefixes)
    ids = torch.zeros((2, t), dtype=torch.long)
    for i, p in enumerate(prefixes):
        ids[i, : len(p)] = torch.tensor(p)
    pos = torch.arange(t).expand(2, t)
    model.forward(ids, pos, cache, 0, pos, causal_bias([0, 0], t, t, F32))

    plens = [len(p) for p in prefixes]
    width = max(plens) + max(len(p) for p in parents)
    bias, tree_pos = tree_bias(plens, parents, width, F32)
    tree_ids = torch.zeros(tree_pos.shape, dtype=torch.long)
    for i, n in enumerate(nodes):
        tree_ids[i, : len(n)] = torch.tensor(n)
    write = torch.tensor(plens)[:, None] + torch.arange(tree_pos.shape[1])[None]
    logits = model.forward(tree_ids, tree_pos, cache, 0, write, bias)  # (2, T, V)

    def path_to(row: int, j: int) -> list[int]:
        path = []
        while j >= 0:
            path.append(j)
            j = parents[row][j]
        return path[::-1]

    for row in range(2):  # every node's logits equal a causal forward over prefix + its path
        for j in range(len(parents[row])):
            seq = prefixes[row] + [nodes[row][k] for k in path_to(row, j)]
            assert (logits[row, j] - _hf_logits(hf, seq)[-1]).abs().max().item() < TOL

    # Keep the accepted path [0, 1, 3, 4] of row 0 and [0, 1] of row 1, then decode one more token.
    kept = [[0, 1, 3, 4], [0, 1]]
    for row in range(2):
        cache.keep(row, plens[row], kept[row])
    nxt = [7, 11]
    lens = torch.tensor([plens[r] + len(kept[r]) + 1 for r in range(2)])
    p = (lens - 1)[:, None]
    dec = model.forward(
        torch.tensor([[x] for x in nxt]), p, cache, 0, p, decode_bias(lens, int(lens.max()), F32)
    )
    for row in range(2):
        seq = prefixes[row] + [nodes[row][k] for k in kept[row]] + [nxt[row]]
        assert (dec[row, 0] - _hf_logits(hf, seq)[-1]).abs().max().item() < TOL


@pytest.mark.parametrize("most_nodes", [9, 65])  # 65: past the 62 that int64 bitmasks hold
def test_tree_bias_matches_walking_each_nodes_ancestors(most_nodes: int) -> None:
    rng = random.Random(most_nodes)
    parents = [
        [-1] + [rng.randrange(-1, j) for j in range(1, rng.randrange(1, most_nodes + 1))] for _ in range(6)
    ]
    parents[0] = [-1, *range(most_nodes - 1)]  # one chain as long as allowed
    prefix = [rng.randrange(0, 20) for _ in parents]
    width = max(len(p) for p in parents)
    length = max(prefix) + width + 2
    bias, positions = tree_bias(prefix, parents, length, F32)
    assert bias.shape == (6, 1, width, length) and positions.shape == (6, width)
    for b, row in enumerate(parents):
        row = row + list(range(len(row) - 1, width - 1))  # padding: a chain under the last node
        for t in range(width):
            seen, j = set(), t
            while j >= 0:
                seen.add(prefix[b] + j)
                j = row[j]
            visible = {c for c in range(length) if c < prefix[b] or c in seen}
            assert {c for c in range(length) if bias[b, 0, t, c] == 0} == visible
            assert positions[b, t] == prefix[b] + len(seen) - 1


def test_tree_bias_rejects_parent_after_node() -> None:
    with pytest.raises(ValueError, match="parents must precede"):
        tree_bias([3], [[-1, 2, 0]], 8, F32)


def test_keep_rejects_unordered_offsets() -> None:
    cache = KVCache(1, 1, 2, 1, 8)
    with pytest.raises(ValueError, match="strictly increasing"):
        cache.keep(0, 0, [2, 1])


def test_cache_growth_preserves_contents() -> None:
    cache = KVCache(2, 1, 4, max_rows=8, max_positions=64, initial_rows=1, initial_positions=4)
    cache.data.normal_()
    before = cache.data.clone()
    cache.reserve(3, 20)
    assert cache.rows == 4 and cache.positions == 32
    assert torch.equal(cache.data[:, :, :1, :, :4], before)
    assert cache.data[:, :, 1:].abs().sum().item() == 0  # new memory is zero, never garbage/NaN
    with pytest.raises(ValueError, match="exceeds its maximum"):
        cache.reserve(9, 4)


# --- loading errors -----------------------------------------------------------------------------


def test_missing_dir_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        TorchEngine(tmp_path / "nope")


def test_dir_without_config_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        TorchEngine(tmp_path)


def _edit_config(path: Path, **changes: Any) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    return save_random_model(tmp_path / "m")


def test_not_a_causal_lm_error(tiny_dir: Path) -> None:
    _edit_config(tiny_dir, architectures=["LlamaModel"])
    with pytest.raises(CheckpointError, match="not a causal LM"):
        TorchEngine(tiny_dir)


def test_unsupported_architecture_error(tiny_dir: Path) -> None:
    _edit_config(tiny_dir, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(CheckpointError, match=r"unsupported architecture.*GPT2LMHeadModel"):
        TorchEngine(tiny_dir)


def test_unsupported_rope_type_error(tiny_dir: Path) -> None:
    _edit_config(tiny_dir, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
    with pytest.raises(CheckpointError, match="unsupported rope scaling type 'yarn'"):
        TorchEngine(tiny_dir)


def test_legacy_rope_scaling_field_is_read(tiny_dir: Path) -> None:
    cfg = json.loads((tiny_dir / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(rope_theta=123.0, rope_scaling={"type": "dynamic", "factor": 2.0})
    (tiny_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'dynamic'"):
        read_config(tiny_dir)
    cfg["rope_scaling"] = None
    (tiny_dir / "config.json").write_text(json.dumps(cfg))
    assert read_config(tiny_dir).rope.theta == 123.0


def test_missing_weights_error(tiny_dir: Path) -> None:
    (tiny_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no weights"):
        TorchEngine(tiny_dir)


def test_weights_not_matching_config_error(tiny_dir: Path) -> None:
    _edit_config(tiny_dir, intermediate_size=64)
    with pytest.raises(CheckpointError, match="has shape"):
        TorchEngine(tiny_dir)


def test_tied_update_moves_embedding_and_head_together(tmp_path: Path) -> None:
    path = save_random_model(tmp_path / "tied", tie_word_embeddings=True)
    model = CausalLM(read_config(path), read_state_dict(path))
    new = torch.randn(model.config.vocab_size, model.config.hidden_size)
    model.load({"lm_head.weight": new})
    assert torch.equal(model.embed, new) and torch.equal(model.lm_head_t.t(), new)
