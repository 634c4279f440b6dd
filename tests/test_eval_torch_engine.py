"""run_eval on a model directory through the real TorchEngine (a tiny random Llama, no download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from chat_fixtures import tiny_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from srt_agent.evaluation import EvalReport, run_eval


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), bos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def evaluate(model_dir: Path, seed: int) -> EvalReport:
    return run_eval(
        "srt/GuessNumber-v0", model_dir, episodes=2, k=2, max_new_tokens=6, seed=seed,
        env_options={"max_turns": 2}, max_concurrent=4,
    )  # fmt: skip


def test_model_directory_is_evaluated_reproducibly_with_the_torch_engine(model_dir: Path) -> None:
    first = evaluate(model_dir, seed=5)
    # A random model never wins, but every episode runs to the env's turn limit without errors.
    assert (first.failed, first.truncated, first.episodes) == (0, 4, 4) and first.mean_turns == 2
    assert first.model == str(model_dir) and first.tokens_generated > 0 and first.forward_passes > 0
    for t in first.trajectories:
        assert all(turn.finish_reason in ("stop", "length") for turn in t.turns)
        assert sum(t.loss_mask) == t.generated_tokens and all(lp <= 0 for lp in t.logprobs)
    # Per-request seeds are derived from the base seed, episode and turn: same seed, same tokens.
    again = evaluate(model_dir, seed=5)
    assert [t.token_ids for t in again.trajectories] == [t.token_ids for t in first.trajectories]
    other = evaluate(model_dir, seed=6)
    assert [t.token_ids for t in other.trajectories] != [t.token_ids for t in first.trajectories]
