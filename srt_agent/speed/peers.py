"""The rollout benchmark's peers and props: an HF ``generate()`` engine, useless drafts, tool latency.

* :class:`HFEngine` runs the same episodes through HF transformers' ``model.generate()`` (the
  :class:`~srt_agent.contracts.generation.Engine` protocol): requests that arrive while a ``generate`` call
  runs wait and go together into the next one (static batching, left padding), which is how
  ``generate()`` is used in simple rollout loops. With ``prompt_lookup`` it uses HF's prompt lookup
  decoding, which HF supports only at batch size 1, so requests then run one at a time.
* :class:`UselessDrafts`: a draft source whose drafts are random tokens (the cache's content
  disabled), to check that speculation costs little when drafts never match.
* :func:`register_latency_env`: an env id whose tool-calling steps take ``latency_s`` longer (a
  gymnasium wrapper that sleeps in the step's worker thread), to simulate slow tools.
* :func:`drift_weights`: the benchmark's stand-in for a policy update (small Gaussian noise).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from srt_agent.contracts.draft import EMPTY_DRAFT, DraftTree, StaticDraftSource
from srt_agent.contracts.generation import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    PromptTooLongError,
)
from srt_agent.contracts.speculation import SpecStats
from srt_agent.tooling.parser import parse_tool_calls

log = logging.getLogger(__name__)


class HFEngine:
    """An :class:`~srt_agent.contracts.generation.Engine` over HF ``model.generate()`` (a benchmark peer).

    Sampling follows the requests' temperature and top-p (top-k when set); stop tokens are passed as
    ``eos_token_id``. Per-request seeds cannot be honoured inside a batch (``generate`` draws from
    the global generator, seeded per call from the first request's seed), so trajectories differ
    from TorchEngine's: the workload matches in episodes and sampling settings, not token for token.

    Args:
        model_dir: HF checkpoint directory.
        max_batch_size: Most requests per ``generate`` call.
        prompt_lookup: ``prompt_lookup_num_tokens`` for HF prompt lookup decoding (forces batch 1).
        device: Torch device of the model.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_batch_size: int = 32,
        prompt_lookup: int | None = None,
        device: str = "cpu",
    ):
        from transformers import AutoModelForCausalLM

        # from_pretrained returns the model in eval mode (no dropout).
        self.device = torch.device(device)
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model: Any = model.to(self.device)
        self.prompt_lookup = prompt_lookup
        self.max_batch_size = 1 if prompt_lookup else max_batch_size
        self._max_context = int(self.model.config.max_position_embeddings)
        self._lock = threading.Lock()  # one generate() at a time
        self._pending: list[tuple[GenerationRequest, Future[GenerationOutput]]] = []
        self._pending_lock = threading.Lock()
        self.calls = 0  # generate() calls made (for the report)

    @property
    def max_context(self) -> int:
        """Longest prompt + generation (the checkpoint's ``max_position_embeddings``)."""
        return self._max_context

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Run requests in batches of ``max_batch_size`` and return outputs in request order."""
        outs: list[GenerationOutput] = []
        for i in range(0, len(requests), self.max_batch_size):
            outs += self._run(list(requests[i : i + self.max_batch_size]))
        return outs

    async def agenerate(self, request: GenerationRequest) -> GenerationOutput:
        """Queue the request; the next ``generate`` call (in a worker thread) takes every queued one."""
        if len(request.prompt_ids) >= self._max_context:
            raise PromptTooLongError(f"prompt of {len(request.prompt_ids)} tokens leaves no room")
        future: Future[GenerationOutput] = Future()
        with self._pending_lock:
            self._pending.append((request, future))
        asyncio.get_running_loop().run_in_executor(None, self._drain)
        return await asyncio.wrap_future(future)

    def _drain(self) -> None:
        """Serve queued requests in batches until none is left (one drainer at a time)."""
        if not self._lock.acquire(blocking=False):
            return  # the running drainer will take them
        try:
            while True:
                with self._pending_lock:
                    batch, self._pending = (
                        self._pending[: self.max_batch_size],
                        self._pending[self.max_batch_size :],
                    )
                if not batch:
                    return
                try:
                    outs = self._run([r for r, _ in batch])
                except Exception as exc:  # a failed call fails its requests, not the drainer
                    log.exception("HF generate() failed")
                    outs = [GenerationOutput(r.request_id, (), (), "abort", error=str(exc)) for r, _ in batch]
                for (_, future), out in zip(batch, outs, strict=True):
                    if not future.cancelled():
                        future.set_result(out)
        finally:
            self._lock.release()
            with self._pending_lock:
                again = bool(self._pending)
            if again:  # arrived after the last check: drain them too
                self._drain()

    @torch.inference_mode()
    def _run(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        self.calls += 1
        p = requests[0].params
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.zeros((len(requests), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(requests):  # left padding: generation continues every row at the end
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        new = min(max(r.params.max_new_tokens for r in requests), self._max_context - width)
        stops = sorted({t for r in requests for t in r.params.stop_token_ids})
        torch.manual_seed(p.seed if p.seed is not None else random.randrange(2**63))
        sampling: dict[str, Any] = (
            {"do_sample": True, "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k or None}
            if p.temperature > 0
            else {"do_sample": False}
        )
        if self.prompt_lookup:
            sampling["prompt_lookup_num_tokens"] = self.prompt_lookup
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max(new, 1),
            eos_token_id=stops or None,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
            **sampling,
        )
        scores = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        return [
            _trim(r, out.sequences[i, width:].tolist(), scores[i].tolist()) for i, r in enumerate(requests)
        ]

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new weights (HF names, any subset)."""
        with self._lock, torch.no_grad():
            self.model.load_state_dict(dict(state_dict), strict=False)

    def spec_stats(self, reset: bool = False) -> SpecStats:
        """All zero: this engine does not speculate."""
        return SpecStats()

    def close(self) -> None:
        """Nothing to stop (no background thread of its own)."""


def _trim(request: GenerationRequest, tokens: list[int], logprobs: list[float]) -> GenerationOutput:
    """One row of a batched ``generate``: cut at its first stop token and its own token limit."""
    params = request.params
    limit = min(params.max_new_tokens, len(tokens))
    reason: FinishReason = "length"
    for i, t in enumerate(tokens[:limit]):
        if t in params.stop_token_ids:
            limit, reason = i + 1, "stop"
            break
    kept = tokens[:limit]
    return GenerationOutput(
        request.request_id,
        tuple(kept),
        tuple(float(x) for x in logprobs[:limit]),
        reason,
        stop=kept[-1] if reason == "stop" else None,
        forward_passes=len(kept),
    )


class UselessDrafts(StaticDraftSource):
    """A draft source with its content disabled: every draft is a chain of random tokens.

    The drafts claim a high probability (0.9 per node), so the cost model first trusts and verifies
    them and must learn from rejections that they never pay. Committed tokens are ignored.

    Args:
        vocab_size: Tokens are drawn from ``[0, vocab_size)``.
        seed: Seed of the random tokens.
    """

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self._rng = random.Random(seed)

    def draft(
        self, state_key: str, task_id: str, prompt_ids: Sequence[int], generated: Sequence[int], budget: int
    ) -> DraftTree:
        """A random chain of ``budget`` tokens."""
        if budget <= 0:
            return EMPTY_DRAFT
        tokens = tuple(self._rng.randrange(self.vocab_size) for _ in range(budget))
        return DraftTree(
            tokens, tuple(range(-1, budget - 1)), tuple(0.9 ** (i + 1) for i in range(budget)), "global"
        )


class ToolLatency(gym.Wrapper[Any, str, Any, str]):
    """Adds ``latency_s`` seconds to every step whose action calls a tool (a slow tool server).

    A non-passive wrapper, so the rollout runs the wrapped ``step`` in a worker thread, where the
    sleep blocks only that thread (other episodes keep generating).
    """

    def __init__(self, env: gym.Env[Any, str], latency_s: float) -> None:
        super().__init__(env)
        self.latency_s = latency_s

    def step(self, action: str) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Sleep if ``action`` calls a tool, then step."""
        if parse_tool_calls(action).has_calls:
            time.sleep(self.latency_s)
        return self.env.step(action)


def _latency_env(base: str, latency_s: float, **options: Any) -> gym.Env[Any, str]:
    from srt_agent.env.registration import make

    return ToolLatency(make(base, **options), latency_s)


def register_latency_env(base: str, latency_s: float) -> str:
    """Register (once) and return an env id: ``base`` with ``latency_s`` added to tool-calling steps."""
    env_id = f"srt-bench/{base.replace('/', '-')}-tool{round(latency_s * 1000)}ms-v0"
    if env_id not in gym.registry:
        gym.register(
            id=env_id,
            entry_point=f"{__name__}:_latency_env",
            kwargs={"base": base, "latency_s": latency_s},
            disable_env_checker=True,
        )
    return env_id


def drift_weights(state: Mapping[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """A small policy update: each float tensor plus Gaussian noise of ``scale`` times its std.

    Deterministic in ``seed``, so every benchmark configuration gets the same weights each round.
    Tied tensors (the same storage under two names) get the same noise.
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}
    for name in sorted(state):
        t = state[name]
        if not t.is_floating_point():
            out[name] = t
            continue
        key = t.data_ptr()
        if key not in seen:
            std = float(t.float().std()) if t.numel() > 1 else 0.0
            seen[key] = t + torch.randn(t.shape, generator=gen, dtype=t.dtype) * (scale * std)
        out[name] = seen[key]
    return out
