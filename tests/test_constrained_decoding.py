"""Constrained tool calls sample exactly the policy restricted to the grammar, and report its logprobs.

A random model over an 8-token vocabulary whose tokens are pieces of tool calls (the tags, ``{"name":
"``, ``a``, ``b``, ``"``, the rest of a call) and an end-of-turn special token, with tools named
``a``, ``b``, ``ab`` and ``ba``. The exact joint distribution of the first tokens generated is
computed from teacher-forced HF forwards over every continuation, each position masked by an
independent reference of the rule (free outside a block; inside one, a token is allowed when the
grammar accepts its text; after a whole call only the closing tag), renormalised, then processed
like the engine's sampling. Thousands of seeded requests, batched, with drafts sampled from the
unconstrained model (so drafts do hold opening tags and what follows them), are compared with it by
a chi-square test; a token of probability 0 fails outright; every reported logprob must be the
masked distribution's.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from spec_drafters import ModelDrafts
from stats_fixtures import chi_square_p
from test_engine_spec_exact import save_exact_model
from transformers import AutoModelForCausalLM

from srt_agent.contracts.generation import GenerationRequest, SamplingParams
from srt_agent.contracts.trajectory import Trajectory, TurnRecord
from srt_agent.engine.constraint import ConstraintError, Vocabulary
from srt_agent.engine.sampling import RowParams, processed_logprobs
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.tooling.grammar import CallState, ToolCallGrammar

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ("<tool_call>", "</tool_call>", '{"name": "', "a", "b", '"', ', "arguments": {}}', "<|im_end|>")
OPEN, CLOSE, END = 0, 1, 7
V = len(TEXTS)
GRAMMAR = ToolCallGrammar.from_schemas(
    [
        {"name": n, "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}
        for n in ("a", "b", "ab", "ba")
    ]
)
WINDOW = 4
MAX_NEW = 6


class PieceTokenizer:
    """The test vocabulary as a tokenizer: one text per id, ``<|im_end|>`` special."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(TEXTS[t] for t in token_ids if not (skip_special_tokens and t == END))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_exact_model(tmp_path_factory.mktemp("constrained"))  # also an 8-token vocabulary


def reference_state(tokens: tuple[int, ...]) -> CallState | str | None:
    """Where ``tokens`` leave a sequence: outside a block (None), inside (a state), or broken."""
    state: CallState | None = None
    for t in tokens:
        if state is None:
            if t == OPEN:
                state = GRAMMAR.start()
        elif t == CLOSE:
            state = None
        else:
            nxt = GRAMMAR.feed(state, TEXTS[t]) if t not in (OPEN, END) else None
            if nxt is None:
                return "broken"
            state = nxt
    return state


def reference_mask(tokens: tuple[int, ...]) -> torch.Tensor:
    state = reference_state(tokens)
    if state is None:
        return torch.ones(V, dtype=torch.bool)
    assert isinstance(state, CallState), f"{tokens} left the grammar"
    if state.ended:
        return torch.tensor([t == CLOSE for t in range(V)])
    return torch.tensor(
        [t not in (OPEN, CLOSE, END) and GRAMMAR.feed(state, TEXTS[t]) is not None for t in range(V)]
    )


def tables(
    model_dir: Path, prompt: tuple[int, ...], params: SamplingParams
) -> tuple[dict[tuple[int, ...], torch.Tensor], dict[tuple[int, ...], torch.Tensor]]:
    """Masked (what the engine must sample) and raw next-token probabilities after each continuation."""
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    grid = torch.cartesian_prod(*[torch.arange(V)] * WINDOW)
    ids = torch.cat([torch.tensor(prompt).expand(len(grid), -1), grid], dim=1)
    with torch.no_grad():
        logits = hf(ids).logits[:, len(prompt) - 1 :]  # (V^W, W + 1, V)
    masked: dict[tuple[int, ...], torch.Tensor] = {}
    raw: dict[tuple[int, ...], torch.Tensor] = {}
    for i, cont in enumerate(grid.tolist()):
        for k in range(WINDOW + 1):
            context = tuple(cont[:k])
            if context in raw:
                continue
            raw[context] = logits[i, k].softmax(-1)
            if reference_state(prompt + context) == "broken":
                continue
            mask = reference_mask(prompt + context)
            row = logits[i, k].masked_fill(~mask, float("-inf"))[None]
            masked[context] = processed_logprobs(row, RowParams.build([params], V, torch.device("cpu")))[
                0
            ].exp()
    return masked, raw


def joint(masked: dict[tuple[int, ...], torch.Tensor]) -> dict[tuple[int, ...], float]:
    out = {(): 1.0}
    for _ in range(WINDOW):
        out = {(*c, t): p * float(masked[c][t]) for c, p in out.items() for t in range(V) if masked[c][t] > 0}
    return out


def generate(
    model_dir: Path,
    prompt: tuple[int, ...],
    params: SamplingParams,
    n: int,
    drafts: str = "raw",
    **engine: Any,
) -> tuple[list[tuple[int, ...]], list[tuple[float, ...]], dict[tuple[int, ...], torch.Tensor], float]:
    masked, raw = tables(model_dir, prompt, params)

    def dist(context: tuple[int, ...]) -> list[float] | None:
        probs = (raw if drafts == "raw" else masked).get(context)
        return probs.tolist() if probs is not None else None

    spec = SpecConfig(adaptive=False, max_draft_tokens=5, max_batch_tokens=512 * 6)
    requests = [
        GenerationRequest(
            f"r{i}",
            prompt,
            SamplingParams(
                temperature=params.temperature, top_p=params.top_p, max_new_tokens=MAX_NEW, seed=100 + i
            ),
            tool_grammar=GRAMMAR,
        )
        for i in range(n)
    ]
    with TorchEngine(
        model_dir,
        max_batch_size=512,
        draft_source=ModelDrafts(dist, V, seed=3),
        spec=spec,
        tokenizer=PieceTokenizer(),
        **engine,
    ) as eng:
        outs = eng.generate(requests)
        tokens_per_forward = eng.spec_stats().tokens_per_forward
    assert all(o.finish_reason in ("length", "stop") and not o.error for o in outs), outs[0]
    return [o.token_ids for o in outs], [o.logprobs for o in outs], masked, tokens_per_forward


SAMPLES = 3_000


@pytest.mark.parametrize(
    ("prompt", "engine"),
    [
        # free until the model opens a block; drafts from the unconstrained model (opening tags
        # drafted, and tokens under them the grammar refuses)
        ((END, 5, 3), {}),
        # the static steps (what CUDA graphs capture; eager on CPU), masked ones inside blocks
        ((END, 5, 3), {"cuda_graphs": True}),
        # a prompt that ends inside an open block; drafts from the masked distribution (accepted)
        ((END, OPEN), {"drafts": "masked"}),
        ((END, OPEN), {"drafts": "masked", "cuda_graphs": True}),
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_constrained_samples_follow_the_masked_distribution(
    model_dir: Path, prompt: tuple[int, ...], engine: dict[str, Any], temperature: float
) -> None:
    check_masked_sampling(model_dir, prompt, temperature, **engine)


def check_masked_sampling(
    model_dir: Path, prompt: tuple[int, ...], temperature: float, **engine: Any
) -> None:
    """Chi-square of constrained samples against the exact masked distribution; logprobs against it."""
    params = SamplingParams(temperature=temperature)
    seqs, logprobs, masked, tokens_per_forward = generate(model_dir, prompt, params, SAMPLES, **engine)
    counts = Counter(s[:WINDOW] for s in seqs)
    expected = joint(masked)
    assert all(cell in expected for cell in counts), "sampled a token the grammar refuses"
    p_value = chi_square_p(counts, expected, SAMPLES)
    print(f"{prompt} T={temperature}: p = {p_value:.3f}, {len(counts)} cells, {tokens_per_forward:.2f}/fwd")
    assert p_value > 0.01
    assert tokens_per_forward > 1.1  # drafts, inside blocks too, were verified under the masks
    inside = sum(1 for s in seqs if isinstance(reference_state(prompt + s[:WINDOW]), CallState))
    assert inside > SAMPLES // 20  # blocks were opened and written under the mask
    for seq, lps in zip(seqs, logprobs, strict=True):
        for k in range(WINDOW):
            want = float(masked[seq[:k]][seq[k]].log())
            assert abs(lps[k] - want) < 1e-4, (seq, k, lps[k], want)


def test_constrained_steps_replay_graphs_and_equal_the_eager_path(model_dir: Path) -> None:
    # With "capture" on (a stand-in graph on a CPU) and the masked shapes warmed, every decode and
    # verify step of constrained requests is a replay, and each row gets what the eager path gives.
    from test_engine_static_steps import capture_with_stand_ins

    params = SamplingParams(temperature=1.0)
    _, raw = tables(model_dir, (END, 5, 3), params)

    def dist(context: tuple[int, ...]) -> list[float] | None:
        probs = raw.get(context)
        return probs.tolist() if probs is not None else None

    requests = [
        GenerationRequest(
            f"r{i}", prompt, SamplingParams(max_new_tokens=MAX_NEW, seed=i), tool_grammar=GRAMMAR
        )
        for i, prompt in enumerate([(END, 5, 3), (END, OPEN)] * 24)
    ]
    outs, stats = [], []
    for static in (False, True):
        with TorchEngine(
            model_dir,
            max_batch_size=16,
            draft_source=ModelDrafts(dist, V, seed=3),
            spec=SpecConfig(adaptive=False, max_draft_tokens=5, max_batch_tokens=16 * 6),
            tokenizer=PieceTokenizer(),
            cuda_graphs=static,
        ) as eng:
            if static:
                graphs = eng.graphs
                assert graphs is not None
                capture_with_stand_ins(graphs)
                eng.warm_up([params], masked=True)
                assert any(key[0] == "masked" for key in graphs._graphs)
            outs.append(eng.generate(requests))
            stats.append(eng.stats())
    for eager, static_out in zip(*outs, strict=True):
        assert eager.token_ids == static_out.token_ids
        assert max(abs(a - b) for a, b in zip(eager.logprobs, static_out.logprobs, strict=True)) < 1e-4
    inside = sum(
        isinstance(reference_state(r.prompt_ids + o.token_ids[:2]), CallState)
        for r, o in zip(requests, outs[1], strict=True)
    )
    assert inside >= len(requests) // 2  # half start inside a block, others open one
    assert stats[1].graph_replays == stats[1].decode_steps > 0  # masked steps too: none eager
    assert stats[1].unwarmed_shapes == 0


def test_greedy_takes_the_masked_argmax(model_dir: Path) -> None:
    prompt = (END, OPEN)
    params = SamplingParams(temperature=0.0)
    seqs, _, masked, _ = generate(model_dir, prompt, params, 4)
    context: tuple[int, ...] = ()
    for _ in range(WINDOW):
        context = (*context, int(masked[context].argmax()))
    assert {s[:WINDOW] for s in seqs} == {context}
    assert isinstance(reference_state(prompt + context), CallState)


def test_a_tokenizer_without_single_token_tags_is_refused_with_the_fix(model_dir: Path) -> None:
    class Plain(PieceTokenizer):
        def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
            return "".join("x" if TEXTS[t].endswith("tool_call>") else TEXTS[t] for t in token_ids)

    with pytest.raises(ConstraintError, match="single tokens"):
        Vocabulary(Plain(), V)
    request = GenerationRequest("r", (END, 3), SamplingParams(max_new_tokens=2), tool_grammar=GRAMMAR)
    with TorchEngine(model_dir, tokenizer=Plain()) as eng:
        out = eng.generate([request])[0]
    assert out.finish_reason == "abort" and out.error is not None and "tokenizer.add_tokens" in out.error


def test_rollouts_ask_for_the_grammar_of_the_env_tools_only_when_configured() -> None:
    from scripted_engine import ScriptedEngine
    from test_rollout_support import tiny_format

    from srt_agent.rollout import EpisodeRequest, run_rollouts

    fmt = tiny_format()
    seen: dict[bool, list[GenerationRequest]] = {}
    for constrain in (False, True):
        engine = ScriptedEngine(fmt, lambda req: "<answer>1</answer>")
        [traj] = run_rollouts(
            engine, fmt, [EpisodeRequest("srt/Calculator-v0", seed=0)], constrain_tool_calls=constrain
        )
        assert traj.status == "ok"
        seen[constrain] = [c.request for c in engine.calls]
    assert all(r.tool_grammar is None for r in seen[False])
    grammars = {r.tool_grammar for r in seen[True]}
    assert len(grammars) == 1
    [grammar] = grammars
    assert grammar is not None and [name for name, _ in grammar.tools] == ["calculator"]


def test_a_server_engine_refuses_constrained_requests_with_the_fix() -> None:
    from srt_agent.evaluation import run_eval
    from srt_agent.serving.engine_config import EngineConfig

    with pytest.raises(ValueError, match="in-process engine"):
        run_eval(
            "srt/Calculator-v0",
            "unused-model-dir",
            engine=EngineConfig(kind="sglang", url="http://127.0.0.1:1"),
            constrain_tool_calls=True,
        )


def one_turn_trajectory(
    i: int, prompt: tuple[int, ...], seq: tuple[int, ...], lps: tuple[float, ...], grammar: ToolCallGrammar
) -> Trajectory:
    """A one-turn episode of the engine's sample ``seq`` after ``prompt`` (odd ``i`` solved)."""
    n = len(prompt) + len(seq)
    return Trajectory(
        episode_id=f"e{i}",
        env_id="test",
        task_id="t",
        seed=0,
        trial=i,
        token_ids=prompt + seq,
        loss_mask=(0,) * len(prompt) + (1,) * len(seq),
        logprobs=(0.0,) * len(prompt) + lps,
        turns=(TurnRecord(0, len(prompt), n, "", "length", 0.0, 1, None, 0.0),),
        total_reward=float(i % 2),
        success=bool(i % 2),
        terminated=True,
        truncated=False,
        status="ok",
        reason="",
        tool_calls=0,
        tool_errors=0,
        messages=(),
        tool_grammar=grammar,
    )


@pytest.mark.parametrize("constrained", [True, False])
def test_the_learner_scores_constrained_tokens_under_the_masked_distribution(
    model_dir: Path, constrained: bool
) -> None:
    """The trainer's logprobs of constrained rollouts equal the engine's (the first PPO ratio is 1).

    Without the masks (the learner scoring the unconstrained policy) they differ: the check can fail.
    """
    from srt_agent.algo import entropy_of, logprobs_of
    from srt_agent.config import RunConfig
    from srt_agent.engine.constraint import CallMasks
    from srt_agent.train.learner import Learner
    from srt_agent.train.optim import build_optimizer
    from srt_agent.train.policy_model import PolicyModel, unpack

    prompt = (END, 5, 3)
    seqs, logprobs, _, _ = generate(model_dir, prompt, SamplingParams(temperature=1.0), 64)
    trajectories = [
        one_turn_trajectory(i, prompt, seq, lps, GRAMMAR)
        for i, (seq, lps) in enumerate(zip(seqs, logprobs, strict=True))
    ]
    cpu = torch.device("cpu")
    policy = PolicyModel.load(model_dir, cpu)
    cfg = RunConfig()
    optimizer, scheduler = build_optimizer(policy, cfg)
    masks = CallMasks(Vocabulary(PieceTokenizer(), V), cpu) if constrained else None
    learner = Learner(policy, optimizer, scheduler, cfg, cpu, call_masks=masks)
    prep = learner.prepare(trajectories)
    mb = prep.micro(list(range(len(trajectories))), cpu)
    with torch.no_grad():
        out = policy(mb.token_ids, mb.attention_mask, mb.loss_mask)
        sampled = mb.token_ids[mb.loss_mask.bool()]
        trainer_lps = unpack(logprobs_of(mb.logits(out), sampled, cfg.rollout.temperature), mb.loss_mask)
    gap = float(((trainer_lps - mb.old_logprobs).abs() * mb.loss_mask).max())
    if constrained:
        assert mb.allowed_index is not None and mb.allowed_index.numel() > 20  # tokens inside calls
        assert gap < 1e-4
        # The entropy is that of the masked distribution (finite, with a finite gradient).
        rows = mb.allowed_index
        masked = mb.logits(out)[rows].detach().requires_grad_(True)
        entropy = entropy_of(masked)
        probs = masked.softmax(-1).detach()
        want = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
        assert torch.allclose(entropy.detach(), want, atol=1e-5)
        entropy.sum().backward()
        assert masked.grad is not None and bool(torch.isfinite(masked.grad).all())
    else:
        assert mb.allowed_index is None and gap > 0.05
