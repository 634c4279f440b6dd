"""Shared helpers for the model-build tests: a few oracle demos and a tokenizer trained on them."""

from functools import cache

from transformers import PreTrainedTokenizerFast

from srt_agent.recipe.build import BuildConfig
from srt_agent.recipe.demos import Demo, collect_demos, demo_texts
from srt_agent.recipe.sft import SFTConfig
from srt_agent.recipe.tokenizer import train_tokenizer

ENV_IDS = ("srt/Calculator-v0", "srt/GuessNumber-v0", "srt/Retail-v0")

TINY = BuildConfig(
    demos=(("srt/Calculator-v0", 12), ("srt/GuessNumber-v0", 4), ("srt/Retail-v0", 2)),
    vocab_size=600,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    context=4096,
    sft=SFTConfig(steps=3, batch_tokens=4096, warmup_steps=1),
    threads=1,  # a tiny model gains nothing from threads, and they thrash on a busy machine
)
"""A build that takes a few seconds: for file-format, determinism and error-handling tests."""


@cache
def demos() -> dict[str, list[Demo]]:
    import srt_agent.envs  # noqa: F401 - registers the envs

    return {env_id: collect_demos(env_id, 6) for env_id in ENV_IDS}


@cache
def tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(demo_texts([d for ds in demos().values() for d in ds]), vocab_size=700)
