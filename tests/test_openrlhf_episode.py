"""OpenRLHF samples played as srt episodes, against a vLLM-shaped stand-in backed by TorchEngine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from train_fixtures import save_tiny_policy
from transformers import AutoTokenizer
from vllm_standin import TorchLLM

from srt_agent.integrations.openrlhf.samples import episode_prompt, play_episode, write_prompts
from srt_agent.runtime import build_engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


def _params() -> SimpleNamespace:  # what OpenRLHF builds (vllm.SamplingParams' fields it sets)
    return SimpleNamespace(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1, logprobs=None)


def test_a_sample_is_an_srt_episode_in_openrlhfs_shape(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = episode_prompt("srt/Calculator-v0", seed=7, options={"max_turns": 2})
    with build_engine(model_dir, max_batch_size=4) as engine:
        llm = TorchLLM(engine)
        params = _params()
        sample = asyncio.run(play_episode(prompt, "", params, 2048, tokenizer, llm, max_new_tokens=12))
    assert params.max_tokens is None and params.logprobs is None  # OpenRLHF's shared params untouched
    tokens, ranges, logprobs = (
        sample["observation_tokens"],
        sample["action_ranges"],
        sample["rollout_log_probs"],
    )
    # Generation stays within --data.max_len (a last tool result may pass it: OpenRLHF cuts there).
    assert len(logprobs) == len(tokens) and ranges[-1][1] <= 2048 and sample["prompt"] == prompt
    # Every generated turn is one action range holding exactly what the engine sampled, with its logprobs.
    assert len(ranges) == len(llm.outputs) >= 1
    for (start, end), out in zip(ranges, llm.outputs, strict=True):
        assert tuple(tokens[start:end]) == out.token_ids
        assert logprobs[start:end] == pytest.approx(list(out.logprobs))
    outside = [lp for i, lp in enumerate(logprobs) if not any(s <= i < e for s, e in ranges)]
    assert set(outside) == {0.0}
    assert isinstance(sample["reward"], float) and set(sample["extra_logs"]) >= {"srt_success", "srt_turns"}
    assert sample["extra_logs"]["srt_turns"] == len(ranges)


def test_prompts_are_written_and_bad_ones_are_clear_errors(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    write_prompts(path, "srt/Retail-v0", range(3, 6))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [json.loads(r["prompt"])["seed"] for r in rows] == [3, 4, 5] and rows[0]["label"] == ""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="apply_chat_template"):
        asyncio.run(play_episode("<|im_start|>user\nhi", "", _params(), 64, tokenizer, None))


def test_the_samples_of_one_prompt_are_sampled_apart(model_dir: Path) -> None:
    """OpenRLHF plays a prompt's samples with the same arguments: they must not share seeds (a
    GRPO group of one sample repeated has no advantage to learn from). An srt-agent engine (as
    SGLangRolloutEngine is) is played directly, with the episode's own sampling seeds."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = episode_prompt("srt/Calculator-v0", seed=7, options={"max_turns": 1})
    with build_engine(model_dir, max_batch_size=4) as engine:

        async def group() -> list[dict[str, Any]]:
            plays = (
                play_episode(prompt, "", _params(), 2048, tokenizer, engine, max_new_tokens=12)
                for _ in range(4)
            )
            return list(await asyncio.gather(*plays))

        samples = asyncio.run(group())
    assert len({tuple(s["observation_tokens"]) for s in samples}) == 4


def test_openrlhfs_max_tokens_caps_a_turn(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = episode_prompt("srt/Calculator-v0", seed=7, options={"max_turns": 1})
    params = _params()
    params.max_tokens = 5  # OpenRLHF's --rollout.max_new_tokens
    with build_engine(model_dir, max_batch_size=4) as engine:
        llm = TorchLLM(engine)
        asyncio.run(play_episode(prompt, "", params, 2048, tokenizer, llm, max_new_tokens=12))
    assert [len(o.token_ids) for o in llm.outputs] == [5]
