"""A tiny policy (random Llama + tiny ChatML tokenizer) and run configs for the trainer's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml
from chat_fixtures import tiny_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from srt_agent.config import RunConfig, load_config


def save_tiny_policy(path: Path, seed: int = 0) -> Path:
    """A random 1-layer Llama over a ~400-token BPE vocabulary, with a ChatML template (no download)."""
    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), bos_token_id=None, pad_token_id=0,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_settings(model_dir: Path, out_dir: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A run config that takes well under a second per step with the tiny policy."""
    data: dict[str, Any] = {
        "model": {"dir": str(model_dir), "build_if_missing": False},
        "env": {"id": "srt/Calculator-v0", "max_turns": 2, "eval_seeds": {"start": 0, "stop": 100}},
        "rollout": {"prompts_per_step": 2, "n": 2, "max_new_tokens": 8, "max_concurrent": 8},
        "spec": {"max_draft_tokens": 4, "cache": {"byte_budget": 4_000_000}},
        "algo": {"estimator": "grpo"},
        "optim": {"lr": 1e-2, "micro_batch_tokens": 1024},
        "trainer": {
            "steps": 2, "eval_every": 0, "eval_episodes": 2, "checkpoint_every": 1,
            "out_dir": str(out_dir), "seed": 0, "threads": 1,
        },
    }  # fmt: skip
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def tiny_config(model_dir: Path, out_dir: Path, **sections: dict[str, Any]) -> RunConfig:
    return RunConfig.model_validate(tiny_settings(model_dir, out_dir, **sections))


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    load_config(path)  # fail here, not in a subprocess, if it is invalid
    return path
