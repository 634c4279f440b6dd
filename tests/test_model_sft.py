import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from srt_agent.devices import resolve_device
from srt_agent.recipe.sft import (
    IGNORE_INDEX,
    Example,
    SFTConfig,
    batch_loss,
    batches,
    collate,
    lr_at,
    shared_prefix,
    train,
)


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models gain nothing from threads, and on a busy 2-core machine OpenMP threads that wait
    # on each other make them many times slower.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _examples(n: int, seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(5, 40))
        # A learnable pattern: the "assistant" half counts on from the prompt's last token.
        prompt = [int(t) for t in rng.integers(3, 30, size=length)]
        answer = [3 + (prompt[-1] - 3 + i) % 27 for i in range(1, length + 1)]
        out.append(Example(tuple(prompt + answer), (0,) * length + (1,) * length))
    return out


def _tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg)


def test_example_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="loss-mask"):
        Example((1, 2, 3), (0, 1))


def test_batches_respect_the_token_budget_and_cover_each_epoch_once() -> None:
    exs = _examples(100)
    stream = batches(exs, 200, np.random.default_rng(0))
    seen: list[Example] = []
    while len(seen) < len(exs):
        batch = next(stream)
        assert len(batch) * max(len(e.token_ids) for e in batch) <= 200
        seen.extend(batch)
    assert len(seen) == len(exs) and {id(e) for e in seen} == {id(e) for e in exs}
    # Examples longer than the budget are not dropped: each is a batch of its own.
    tiny = batches(exs, 10, np.random.default_rng(0))
    assert all(len(next(tiny)) == 1 for _ in range(len(exs)))
    with pytest.raises(ValueError, match="batch_tokens"):
        next(batches(exs, 0, np.random.default_rng(0)))


def test_collate_pads_right_and_labels_only_the_loss_mask() -> None:
    a, b = Example((5, 6, 7), (0, 1, 1), weights=(0.0, 1.0, 4.0)), Example((8, 9), (0, 1))
    out = collate([a, b], pad_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["labels"].tolist() == [[IGNORE_INDEX, 6, 7], [IGNORE_INDEX, 9, IGNORE_INDEX]]
    assert out["weights"].tolist() == [[0.0, 1.0, 4.0], [0.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="off the loss mask"):
        Example((5, 6), (0, 1), weights=(1.0, 1.0))


def test_weights_scale_each_tokens_share_of_the_loss() -> None:
    model = _tiny_model().eval()
    plain_ex = Example((5, 6, 7, 8), (0, 1, 1, 1))
    heavy_ex = Example((5, 6, 7, 8), (0, 1, 1, 1), weights=(0.0, 1.0, 1.0, 10.0))
    only_last = Example((5, 6, 7, 8), (0, 0, 0, 1))
    with torch.no_grad():
        w_plain, p_plain = batch_loss(model, collate([plain_ex], 0))
        w_heavy, p_heavy = batch_loss(model, collate([heavy_ex], 0))
        last, _ = batch_loss(model, collate([only_last], 0))
    assert w_plain.item() == pytest.approx(p_plain.item()) and p_heavy.item() == pytest.approx(p_plain.item())
    # (l6 + l7 + 10 l8) / 12 == (3 plain + 9 l8) / 12
    assert w_heavy.item() == pytest.approx((3 * p_plain.item() + 9 * last.item()) / 12, rel=1e-5)


def test_padding_never_leaks_into_a_sequence() -> None:
    model = _tiny_model().eval()
    short, long = Example((5, 6, 7, 8), (0, 0, 1, 1)), Example(tuple(range(3, 20)), (1,) * 17)
    one, two = collate([short], pad_id=0), collate([short, long], pad_id=0)
    alone = model(input_ids=one["input_ids"], attention_mask=one["attention_mask"]).logits[0]
    batched = model(input_ids=two["input_ids"], attention_mask=two["attention_mask"]).logits[0, :4]
    torch.testing.assert_close(alone, batched, atol=1e-5, rtol=1e-4)


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    cfg = SFTConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0) and lr_at(100, cfg) == pytest.approx(0.1)
    assert lr_at(30, cfg) > lr_at(60, cfg) > lr_at(90, cfg)


def test_loss_decreases_and_counts_are_reported() -> None:
    model = _tiny_model()
    exs = _examples(64)
    stats = train(
        model,
        exs,
        SFTConfig(steps=30, batch_tokens=400, lr=1e-2, warmup_steps=3),
        pad_id=0,
        show_progress=False,
    )
    assert stats.steps == 30 and len(stats.losses) == 30
    assert stats.final_loss < 0.5 * stats.losses[0]
    assert 0 < stats.loss_tokens < stats.tokens
    assert not model.training


def test_shared_prefix_stops_before_any_loss_token_and_needs_two_rows() -> None:
    common = tuple(range(3, 23))  # 20 shared prompt tokens
    a = Example((*common, 5, 6, 7), (0,) * 21 + (1, 1))
    b = Example((*common, 8, 9), (0,) * 20 + (1, 1))
    assert shared_prefix([a, b]) == 19  # the token after the prefix must carry no loss
    assert shared_prefix([a]) == 0
    c = Example((1, *common[1:], 5, 6), (0,) * 20 + (1, 1))
    assert shared_prefix([a, c]) == 0  # differs at the first token
    short = Example((*common[:10], 4), (0,) * 11)
    assert shared_prefix([a, short]) == 0  # under MIN_SHARED_PREFIX


def test_shared_prefix_forward_is_exact_in_loss_and_gradients() -> None:
    prompt = tuple(range(3, 23))
    batch = [
        Example((*prompt, 5, 6, 7, 8), (0,) * 21 + (1,) * 3),
        Example((*prompt, 9, 10), (0,) * 21 + (1,)),
        Example((*prompt, 11, 12, 13, 14, 15, 16), (0,) * 22 + (1,) * 4),
    ]
    prefix = shared_prefix(batch)
    assert prefix == 20
    inputs = collate(batch, pad_id=0)
    grads = []
    losses = []
    for p in (0, prefix):
        model = _tiny_model()
        loss, plain = batch_loss(model, inputs, p)
        assert loss.item() == pytest.approx(plain.item())  # no weights given: both are the plain mean
        loss.backward()
        losses.append(loss.item())
        grads.append([q.grad.clone() for q in model.parameters()])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for g0, g1 in zip(*grads, strict=True):
        torch.testing.assert_close(g0, g1, atol=1e-6, rtol=1e-4)


def test_batches_never_mix_groups() -> None:
    exs = [Example(e.token_ids, e.loss_mask, group="ab"[i % 2]) for i, e in enumerate(_examples(60))]
    stream = batches(exs, 300, np.random.default_rng(1))
    for _ in range(30):
        assert len({e.group for e in next(stream)}) == 1


@pytest.mark.parametrize("name", ["gpu", "cuda:x"])
def test_unknown_device_is_a_clear_error(name: str) -> None:
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda")
