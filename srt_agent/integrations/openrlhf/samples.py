"""One OpenRLHF sample as one srt-agent episode, token-in/token-out.

OpenRLHF hands its agent a prompt (a row of the prompt dataset), the policy's tokenizer and its
rollout engine (vLLM, whose ``generate(prompt_token_ids, sampling_params)`` returns a vLLM
``RequestOutput``). Here the prompt names an srt episode (:func:`episode_prompt`: env id, seed,
options), the episode is played by srt-agent's own episode runner (tool parsing, loss masks,
rewards, failure handling) against that engine, and the trajectory becomes the dict OpenRLHF's
experience maker reads: the whole token sequence, the ranges the policy generated, their
sampling logprobs, and the episode's reward.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from srt_agent.chat.template import ChatFormat
from srt_agent.contracts.generation import FinishReason, GenerationOutput, GenerationRequest, check_room
from srt_agent.contracts.speculation import SpecStats
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig
from srt_agent.rollout.episode import EpisodeRunner

__all__ = ["VLLMEngineAdapter", "episode_prompt", "play_episode", "to_openrlhf", "write_prompts"]


def episode_prompt(env_id: str, seed: int, options: Mapping[str, Any] | None = None) -> str:
    """The prompt-dataset text that names one srt episode (what ``srt-agent openrlhf-data`` writes)."""
    return json.dumps({"env_id": env_id, "seed": seed, "options": dict(options or {})}, sort_keys=True)


def write_prompts(
    path: str | Path, env_id: str, seeds: Iterable[int], options: Mapping[str, Any] | None = None
) -> None:
    """Write OpenRLHF's prompt dataset: one ``{"prompt": ..., "label": ""}`` line per env seed.

    Use OpenRLHF's ``--data.input_key prompt --data.label_key label``, without
    ``--data.apply_chat_template`` (the executor renders the env's messages with the chat template).
    """
    with Path(path).open("w") as f:
        for seed in seeds:
            f.write(json.dumps({"prompt": episode_prompt(env_id, seed, options), "label": ""}) + "\n")


def parse_prompt(prompt: str) -> tuple[str, int, dict[str, Any]]:
    """``(env_id, seed, options)`` of a prompt written by :func:`episode_prompt`.

    Raises:
        ValueError: Not such a prompt (e.g. the dataset was chat-templated: drop
            ``--data.apply_chat_template``, srt-agent renders the env's messages itself).
    """
    try:
        row = json.loads(prompt)
        return str(row["env_id"]), int(row["seed"]), dict(row.get("options") or {})
    except (ValueError, TypeError, KeyError):
        raise ValueError(
            f"prompt {prompt[:80]!r} does not name an srt episode (JSON with env_id and seed, as "
            "`srt-agent openrlhf-data` writes); launch OpenRLHF without --data.apply_chat_template"
        ) from None


class VLLMEngineAdapter:
    """srt-agent's engine protocol over OpenRLHF's ``llm_engine`` (vLLM's async ``generate``).

    Args:
        llm_engine: OpenRLHF's rollout actor (``await llm_engine.generate(token_ids, params)``).
        sampling_params: OpenRLHF's vLLM ``SamplingParams`` (copied per request, never changed).
        max_length: OpenRLHF's ``--data.max_len``: the episode's whole token budget.
    """

    def __init__(self, llm_engine: Any, sampling_params: Any, max_length: int) -> None:
        self.llm_engine = llm_engine
        self.sampling_params = sampling_params
        self._max_context = max_length

    @property
    def max_context(self) -> int:
        """The episode's token budget."""
        return self._max_context

    async def agenerate(self, request: GenerationRequest) -> GenerationOutput:
        """One assistant turn: vLLM samples, with logprobs, up to the turn's stop tokens."""
        check_room(request, self._max_context)
        params = copy.deepcopy(self.sampling_params)
        params.max_tokens = min(request.params.max_new_tokens, self._max_context - len(request.prompt_ids))
        params.stop_token_ids = list(request.params.stop_token_ids)
        params.logprobs = max(int(getattr(params, "logprobs", None) or 0), 1)  # the sampled token's
        result = await self.llm_engine.generate(list(request.prompt_ids), params, multi_modal_data=None)
        out = result.outputs[0]
        tokens = tuple(int(t) for t in out.token_ids)
        if out.logprobs is None or len(out.logprobs) != len(tokens):
            raise ValueError(
                "the rollout engine returned no logprob per sampled token; it must honour logprobs=1"
            )
        logprobs = tuple(float(step[t].logprob) for step, t in zip(out.logprobs, tokens, strict=True))
        stopped = bool(tokens) and tokens[-1] in request.params.stop_token_ids
        reason: FinishReason = "length" if out.finish_reason == "length" else "stop"
        return GenerationOutput(
            request.request_id, tokens, logprobs, reason, tokens[-1] if stopped else None, len(tokens)
        )

    def generate(self, requests: Any) -> list[GenerationOutput]:
        """Not used by the episode runner (it awaits :meth:`agenerate`)."""
        raise NotImplementedError("the OpenRLHF adapter serves agenerate only")

    def update_weights(self, state_dict: Any) -> None:
        """OpenRLHF syncs its own vLLM engines' weights."""
        raise NotImplementedError("OpenRLHF updates its vLLM engines' weights itself")

    def spec_stats(self, reset: bool = False) -> SpecStats:
        """All zero: this engine does not speculate."""
        return SpecStats()

    def close(self) -> None:
        """Nothing to release: the engine is OpenRLHF's."""


def to_openrlhf(trajectory: Trajectory, prompt: str, label: str) -> dict[str, Any]:
    """The dict OpenRLHF's experience maker reads, from an srt trajectory.

    ``action_ranges`` are the generated turns' spans (``Trajectory.turn_spans``, half-open); the
    logprobs are per token of ``observation_tokens`` (0.0 outside the actions), as OpenRLHF shifts
    both by one.
    """
    return {
        "prompt": prompt,
        "label": label,
        "observation_tokens": list(trajectory.token_ids),
        "action_ranges": list(trajectory.turn_spans),
        "rollout_log_probs": [
            lp if m else 0.0 for lp, m in zip(trajectory.logprobs, trajectory.loss_mask, strict=True)
        ],
        "reward": float(trajectory.total_reward),
        "scores": float(trajectory.total_reward),
        "truncated": trajectory.truncated,
        "extra_logs": {
            "srt_success": float(trajectory.success),
            "srt_turns": float(len(trajectory.turns)),
            "srt_tool_calls": float(trajectory.tool_calls),
            "srt_failed": float(trajectory.status == "failed"),
        },
    }


async def play_episode(
    prompt: str,
    label: str,
    sampling_params: Any,
    max_length: int,
    hf_tokenizer: Any,
    llm_engine: Any,
    *,
    max_new_tokens: int = 512,
    seed: int | None = None,
) -> dict[str, Any]:
    """Play the srt episode ``prompt`` names against OpenRLHF's engine; OpenRLHF's sample dict.

    One assistant turn is capped at OpenRLHF's ``max_tokens`` (its ``--rollout.max_new_tokens``)
    when set, else at ``max_new_tokens``. ``seed`` fixes every turn's sampling seed; leave it
    ``None`` when a prompt has several samples (OpenRLHF plays them with the same arguments, so
    a fixed seed would make them one sample repeated: a group with no advantage to learn from).

    A failed episode (an env that raises, a malformed tool call the env rejects) is still a
    sample, with the env's reward and ``srt_failed`` in ``extra_logs``: one bad episode never
    costs the batch.
    """
    env_id, env_seed, options = parse_prompt(prompt)
    fmt = ChatFormat(hf_tokenizer)
    config = RolloutConfig(
        max_concurrent=1,
        temperature=float(getattr(sampling_params, "temperature", 1.0)) or 1.0,
        max_new_tokens=int(getattr(sampling_params, "max_tokens", None) or max_new_tokens),
        seed=seed,
    )
    # OpenRLHF plays a prompt's samples at once with the same arguments: each needs its own
    # episode id (its requests' ids derive from it, and an engine refuses two alike in flight).
    # The task is the same for all of them, so SRT still groups their drafts.
    spec = EpisodeRequest(
        env_id, seed=env_seed, env_options=options, episode_id=f"{env_id}/{env_seed}/{uuid.uuid4().hex[:12]}"
    )
    # An srt-agent engine (SGLangRolloutEngine) is played directly: its requests keep their task
    # ids and conversation states, which SRT drafting keys its trees by. vLLM is adapted.
    engine = (
        llm_engine
        if hasattr(llm_engine, "agenerate")
        else VLLMEngineAdapter(llm_engine, sampling_params, max_length)
    )
    trajectory = await EpisodeRunner(spec, engine, fmt, config).run()
    return to_openrlhf(trajectory, prompt, label)
