"""srt-agent's AgentExecutor through OpenRLHF's own classes (``openrlhf==0.11.2``, on CPU).

Runs in the ``openrlhf`` tier (``pytest -m openrlhf``) after ``.ci/openrlhf-install``: OpenRLHF's
loader loads ``examples/openrlhf/agent_func.py``, its rollout actor's ``generate_responses`` runs
the executor for a group of samples with an ``llm_engine`` backed by TorchEngine, and its
experience maker's ``_process_response_into_experience`` builds each ``Experience``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytestmark = pytest.mark.openrlhf
vllm_engine = pytest.importorskip("openrlhf.trainer.ray.vllm_engine", reason="needs openrlhf")

from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402
from openrlhf.utils.agent import AgentExecutorBase  # noqa: E402
from train_fixtures import save_tiny_policy  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm_standin import TorchLLM  # noqa: E402

from srt_agent.integrations.openrlhf.samples import episode_prompt  # noqa: E402
from srt_agent.runtime import build_engine  # noqa: E402

AGENT = Path(__file__).resolve().parents[1] / "examples" / "openrlhf" / "agent_func.py"
MAX_LEN = 2048


def test_openrlhf_runs_the_srt_executor_and_builds_experiences(tmp_path: Path) -> None:
    executor = vllm_engine._load_agent_executor(str(AGENT))
    assert isinstance(executor, AgentExecutorBase)
    model_dir = save_tiny_policy(tmp_path / "policy")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    actor_class = vllm_engine.RolloutRayActor.__ray_metadata__.modified_class
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1, logprobs=1)
    prompt = episode_prompt("srt/Calculator-v0", seed=3, options={"max_turns": 2})
    with build_engine(model_dir, max_batch_size=4) as engine:
        rollout_actor = TorchLLM(engine)  # OpenRLHF passes its actor as llm_engine=self
        rollout_actor.executor = executor  # type: ignore[attr-defined]
        samples = asyncio.run(
            actor_class.generate_responses(
                rollout_actor, prompt=prompt, label="", sampling_params=params,
                max_length=MAX_LEN, hf_tokenizer=tokenizer, num_samples=2,
            )
        )  # fmt: skip
    assert len(samples) == 2
    for sample in samples:
        experience = SamplesGenerator._process_response_into_experience(None, sample, max_len=MAX_LEN)
        generated = sum(end - start for start, end in sample["action_ranges"] if end <= MAX_LEN)
        assert int(experience.action_mask.sum()) == generated > 0
        assert experience.rollout_log_probs.shape == experience.action_mask.shape
        assert float(experience.rewards[0]) == sample["reward"]
        assert "srt_success" in experience.info
