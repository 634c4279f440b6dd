"""A small, self-contained success-rate check of a model directory on an env.

Plays episodes with HF ``model.generate`` (sampling, stop at the end-of-turn token) and
:class:`~srt_agent.chat.template.ChatFormat`, several episodes per batch in lockstep: each round,
every live episode generates its next turn in one left-padded batch, then steps its env. It exists to
tune and sanity-check the model build before the project's engine and ``srt-agent eval`` take over.
Seeds start at 0, far below the demonstration seeds (see :mod:`srt_agent.recipe.demos`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from srt_agent.chat.template import ChatFormat, TokenTranscript
from srt_agent.env.multi_turn import MultiTurnEnv
from srt_agent.env.registration import make


@dataclass(frozen=True)
class EvalResult:
    """Outcome of :func:`quick_eval`.

    Attributes:
        env_id: The env.
        episodes: Episodes played.
        temperature: Sampling temperature.
        success_rate: Fraction of episodes the env counts as solved.
        mean_reward: Mean total reward.
        mean_turns: Mean assistant turns.
        context_overflows: Episodes stopped because the next turn would not fit the context.
        first_turns: The first assistant turn of each episode (to inspect phrasing and variety).
    """

    env_id: str
    episodes: int
    temperature: float
    success_rate: float
    mean_reward: float
    mean_turns: float
    context_overflows: int
    first_turns: tuple[str, ...] = field(repr=False)


@dataclass
class _Episode:
    env: Any
    tr: TokenTranscript
    reward: float = 0.0
    turns: int = 0
    done: bool = False
    success: bool = False
    overflow: bool = False
    first: str = ""


def _generate(
    model: PreTrainedModel, fmt: ChatFormat, prompts: list[tuple[int, ...]], temperature: float, max_new: int
) -> list[list[int]]:
    pad = fmt.tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # (B, T), left-padded
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    sampling: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    with torch.no_grad():
        # `generate` comes from GenerationMixin, which the stubs do not show on PreTrainedModel.
        out = cast(Any, model).generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=max_new,
            eos_token_id=list(fmt.stop_token_ids),
            pad_token_id=pad,
            **sampling,
        )
    results = []
    for row in out[:, width:].tolist():
        # Keep tokens up to and including the first stop token (the rest is padding).
        stop = next((i for i, t in enumerate(row) if t in fmt.stop_token_ids), None)
        results.append(row if stop is None else row[: stop + 1])
    return results


def quick_eval(
    model_dir: str | Path,
    env_id: str,
    *,
    episodes: int = 50,
    temperature: float = 1.0,
    max_new_tokens: int = 200,
    batch_size: int = 16,
    seed: int = 0,
    first_seed: int = 0,
) -> EvalResult:
    """Play ``episodes`` episodes of ``env_id`` with the model in ``model_dir``.

    Args:
        model_dir: An HF model directory with a tokenizer and chat template.
        env_id: A registered multi-turn env.
        episodes: Episodes to play; env seeds ``first_seed, first_seed + 1, ...``.
        temperature: Sampling temperature; 0 means greedy.
        max_new_tokens: Longest assistant turn.
        batch_size: Episodes generated together.
        seed: Seeds torch's sampling.
        first_seed: Env seed of the first episode.

    Returns:
        Success rate, mean reward and turns, and the first turns.
    """
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model.train(False)
    fmt = ChatFormat.from_pretrained(model_dir)
    context = int(model.config.max_position_embeddings)
    torch.manual_seed(seed)
    done: list[_Episode] = []
    for start in range(0, episodes, batch_size):
        live = []
        for s in range(first_seed + start, first_seed + min(episodes, start + batch_size)):
            env = make(env_id)
            obs, info = env.reset(seed=s)
            live.append(_Episode(env, fmt.start(obs, info.get("tools", ()))))
        while active := [e for e in live if not e.done]:
            fits = [e for e in active if len(e.tr) + max_new_tokens <= context]
            for e in active:
                if e not in fits:
                    e.done = e.overflow = True
                    e.env.close()
            if not fits:
                break
            outs = _generate(model, fmt, [e.tr.token_ids for e in fits], temperature, max_new_tokens)
            for e, ids in zip(fits, outs, strict=True):
                _advance(fmt, e, ids)
        done.extend(live)
    n = len(done)
    return EvalResult(
        env_id=env_id,
        episodes=n,
        temperature=temperature,
        success_rate=sum(e.success for e in done) / n,
        mean_reward=sum(e.reward for e in done) / n,
        mean_turns=sum(e.turns for e in done) / n,
        context_overflows=sum(e.overflow for e in done),
        first_turns=tuple(e.first for e in done),
    )


def _advance(fmt: ChatFormat, e: _Episode, ids: list[int]) -> None:
    """Append one generated turn to the episode and step its env."""
    if not ids:  # max_new_tokens=0 cannot happen, but an empty turn must not crash the loop
        ids = [fmt.stop_token_ids[0]]
    e.tr = fmt.add_generation(e.tr, ids, [0.0] * len(ids))
    text = fmt.assistant_text(ids)
    if e.turns == 0:
        e.first = text
    obs, reward, terminated, truncated, info = e.env.step(text)
    e.turns += 1
    e.reward += float(reward)
    if terminated or truncated:
        inner = e.env.unwrapped
        assert isinstance(inner, MultiTurnEnv)
        e.success = inner.is_success(e.reward, info)
        e.done = True
        e.env.close()
    else:
        e.tr = fmt.add_observation(e.tr, obs)
