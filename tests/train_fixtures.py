"""A tiny policy (random Llama + tiny ChatML tokenizer) and run configs for the trainer's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from chat_fixtures import save_tiny_llama

from srt_agent.config import RunConfig, load_config


def save_tiny_policy(path: Path, seed: int = 0) -> Path:
    """The tiny Llama with untied embeddings (the learner then updates head and embedding apart)."""
    return save_tiny_llama(path, seed=seed, tie_word_embeddings=False)


def save_peaked_policy(path: Path, sharpness: float = 100.0, seed: int = 0) -> Path:
    """:func:`save_tiny_policy` with its LM head scaled by ``sharpness``: a less uniform policy.

    A random tiny policy's logits are near zero (every token ~equally likely), so a draft from an
    earlier sample is almost never the token sampled next. Scaled by 100, a prompt's samples still
    differ (8 of 8 distinct over 24 tokens) while about a third of the drafts from a sibling sample
    are accepted (measured: 65 of 212 drafted tokens).
    """
    import torch
    from transformers import AutoModelForCausalLM

    save_tiny_policy(path, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    model.save_pretrained(path)
    return path


def tiny_settings(model_dir: Path, out_dir: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A run config that takes well under a second per step with the tiny policy."""
    data: dict[str, Any] = {
        "model": {"dir": str(model_dir), "build_if_missing": False},
        "env": {"id": "srt/Calculator-v0", "max_turns": 2, "eval_seeds": {"start": 0, "stop": 100}},
        "rollout": {"prompts_per_step": 2, "n": 2, "max_new_tokens": 8, "max_concurrent": 8},
        "spec": {"max_draft_tokens": 4, "cache": {"byte_budget": 4_000_000}, "run_ahead": {"enabled": True}},
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
