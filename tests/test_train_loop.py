"""End-to-end training runs of a tiny random policy on srt/Calculator-v0 (GRPO, PPO with GAE, RLOO).

The policy cannot learn in two steps; these tests check that the loop runs, every metric is
finite, the weights move, the engine samples from the new weights after each step, and that only
the tokens the policy sampled carry loss, and that speculative rollouts (drafts accepted, with a
peaked policy) train exactly as plain decoding does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from train_fixtures import save_peaked_policy, save_tiny_policy, tiny_config

from srt_agent.algo import Aggregation
from srt_agent.config import RunConfig
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.engine import GenerationRequest, SamplingParams
from srt_agent.env.registration import register_env, registered_envs
from srt_agent.env.testing import GenericTestEnv
from srt_agent.train import Trainer
from srt_agent.train.learner import PreparedBatch, micro_batches
from srt_agent.train.objective import micro_loss
from srt_agent.train.optim import lr_factor
from srt_agent.train.policy_model import PolicyModel
from srt_agent.train.tasks import step_episodes, step_seeds

# Rewards of a random policy are all 0, so GRPO/RLOO advantages vanish: a small entropy bonus gives
# every run a gradient. PPO also gets DAPO's overlong penalty (turns hit max_new_tokens), which
# gives the critic nonzero returns to fit.
LONG = {"enabled": True, "buffer_tokens": 4}  # DAPO overlong penalty
ESTIMATORS: dict[str, dict[str, Any]] = {
    "grpo": {"algo": {"estimator": "grpo", "entropy_coef": 0.01}},
    "gae": {
        "algo": {"estimator": "gae", "entropy_coef": 0.01, "epochs": 2, "mini_batches": 2, "overlong": LONG},
        "optim": {"critic_lr": 1e-2},
    },
    "rloo": {"algo": {"estimator": "rloo", "entropy_coef": 0.01, "kl": {"coef": 0.05, "mode": "reward"}}},
}


def flaky_reward(reply: str) -> tuple[float, bool]:
    """Rewards that vary with the reply (so GRPO has a signal), and an env that crashes now and then."""
    if len(reply) % 4 == 0:
        raise RuntimeError("the tool server crashed")
    return (len(reply) % 3) / 2, False


if "test/Flaky-v0" not in registered_envs():
    register_env("test/Flaky-v0", GenericTestEnv, reward_fn=flaky_reward)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


def _one_step(cfg: RunConfig) -> dict[str, Any]:
    """Train ``cfg`` (one step) and return that step's metrics record."""
    trainer = Trainer(cfg)
    try:
        (step,) = [r for r in trainer.run() if r["kind"] == "step"]
    finally:
        trainer.close()
    return step


def _first_step_episodes(trainer: Trainer, cfg: RunConfig) -> list[Trajectory]:
    """The episodes of step 1, rolled out by ``trainer``, failed ones left out."""
    return [t for t in trainer.rollouts.rollout(step_episodes(cfg, 1)).trajectories if t.status != "failed"]


def _with_advantages(prep: PreparedBatch, per_row: list[float]) -> PreparedBatch:
    """``prep`` with each row's advantage set to ``per_row[row]`` on every sampled token."""
    advantages = torch.tensor([[a] for a in per_row]) * prep.batch.loss_mask.float()
    return type(prep)(**{**prep.__dict__, "advantages": advantages})


def teacher_forced(policy: PolicyModel, prompt: tuple[int, ...], tokens: tuple[int, ...]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    mask = torch.zeros_like(ids, dtype=torch.float32)
    mask[0, len(prompt) :] = 1.0
    with torch.no_grad():
        logits = policy(ids, torch.ones_like(mask), mask).logits
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
def test_training_runs_end_to_end(model_dir: Path, tmp_path: Path, estimator: str) -> None:
    cfg = tiny_config(model_dir, tmp_path / "run", **ESTIMATORS[estimator])
    trainer = Trainer(cfg)
    try:
        start = {k: v.clone() for k, v in trainer.policy.lm_state_dict().items()}
        records = trainer.run()
        steps = [r for r in records if r["kind"] == "step"]
        assert [r["step"] for r in steps] == [1, 2]
        assert [(r["kind"], r["step"]) for r in records if r["kind"] == "eval"] == [("eval", 0), ("eval", 2)]
        assert {r["temperature"] for r in records if r["kind"] == "eval"} == {cfg.rollout.temperature}
        for r in steps:
            numbers = {k: v for k, v in r.items() if isinstance(v, int | float)}
            assert all(math.isfinite(v) for v in numbers.values()), numbers
            assert (
                r["episodes"] == 4
                and r["failed"] == 0
                and r["updates"] == cfg.algo.epochs * cfg.algo.mini_batches
            )
            # Every sampled token is trained on, and nothing else (prompt and tool tokens are masked).
            assert r["learner_tokens"] == r["gen_tokens"] * cfg.algo.epochs
            # The trainer's forward reproduces the rollout's logprobs: the engine had the weights
            # of the step before (they change every step).
            assert r["logprob_mismatch"] < 1e-4
            # A random policy's rewards are all 0: no group carries a signal (PPO has no groups).
            assert r.get("informative_group_share") == (None if estimator == "gae" else 0.0)
        if estimator == "rloo":
            assert all(r["kl"] >= 0 for r in steps) and steps[-1]["kl"] > 0
        if estimator == "gae":
            assert all(r["vf_loss"] > 0 for r in steps) and "explained_variance" in steps[0]
            head = trainer.policy.value_head
            assert head is not None and float(head.weight.detach().abs().sum()) > 0
        now = trainer.policy.lm_state_dict()
        assert any(not torch.equal(start[k], now[k]) for k in start), "the weights did not change"

        # The engine samples from the trained weights: its logprobs equal the policy's, not the start's.
        prompt = tuple(trainer.fmt.encode("hello world"))
        params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)
        (out,) = trainer.rollouts.engine.generate([GenerationRequest("probe", prompt, params)])
        engine_lp = torch.tensor(out.logprobs)
        torch.testing.assert_close(
            engine_lp, teacher_forced(trainer.policy, prompt, out.token_ids), atol=1e-4, rtol=0
        )
        initial = PolicyModel.load(model_dir, torch.device("cpu"))
        assert (engine_lp - teacher_forced(initial, prompt, out.token_ids)).abs().max() > 1e-3
    finally:
        trainer.close()


def test_a_time_limit_stops_after_the_current_step_and_still_evaluates_and_checkpoints(
    model_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(model_dir, tmp_path / "run", trainer={"steps": 5, "time_limit_s": 1e-6})
    trainer = Trainer(cfg)
    try:
        records = trainer.run()
    finally:
        trainer.close()
    # The limit is checked after each step: the first one always runs.
    assert [r["step"] for r in records if r["kind"] == "step"] == [1]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 1]
    assert (tmp_path / "run" / "checkpoints" / "step-000001").is_dir()


def test_crashing_episodes_are_counted_and_left_out_while_the_step_goes_on(
    model_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(
        model_dir, tmp_path / "run", env={"id": "test/Flaky-v0"}, rollout={"prompts_per_step": 3, "n": 4},
        trainer={"steps": 1},
    )  # fmt: skip
    step = _one_step(cfg)
    assert 0 < step["failed"] < step["episodes"]
    assert step["trained_episodes"] == step["episodes"] - step["failed"]
    assert step["updates"] == 1 and step["grad_norm"] > 0 and math.isfinite(step["pg_loss"])


def test_dynamic_sampling_refills_and_trains_on_informative_groups_only(
    model_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(
        model_dir, tmp_path / "run", env={"id": "test/Flaky-v0"}, rollout={"prompts_per_step": 3, "n": 4},
        algo={"estimator": "grpo", "dynamic_sampling": {"enabled": True, "max_rounds": 3}},
        trainer={"steps": 1},
    )  # fmt: skip
    step = _one_step(cfg)
    # The first round leaves too few informative groups: it refills; groups whose rewards are all
    # equal (no signal) are dropped from training.
    assert step["rounds"] >= 2 and step["episodes"] == 12 * step["rounds"]
    # Too few: the first round's share of informative groups is what made it refill.
    assert 0.0 <= step["informative_group_share"] < 1.0
    assert 0 < step["trained_episodes"] < step["episodes"] - step["failed"] and step["grad_norm"] > 0


def test_negative_weight_scales_only_the_negative_advantages(model_dir: Path, tmp_path: Path) -> None:
    settings: dict[str, Any] = {"env": {"id": "test/Flaky-v0"}, "rollout": {"prompts_per_step": 3, "n": 4}}
    cfg = tiny_config(model_dir, tmp_path / "run", **settings)
    positive_only = tiny_config(model_dir, tmp_path / "run2", algo={"negative_weight": 0.0}, **settings)
    trainer = Trainer(cfg)
    try:
        trajectories = _first_step_episodes(trainer, cfg)
        full = trainer.learner.prepare(trajectories).advantages
        trainer.learner.cfg = positive_only
        kept = trainer.learner.prepare(trajectories).advantages
    finally:
        trainer.close()
    assert bool((full < 0).any()) and bool((full > 0).any())  # the flaky rewards differ within groups
    torch.testing.assert_close(kept, full.clamp(min=0.0))


def test_loss_ignores_every_token_the_policy_did_not_sample(model_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(model_dir, tmp_path / "run", algo={"estimator": "grpo", "entropy_coef": 0.01})
    trainer = Trainer(cfg)
    try:
        batch = trainer.rollouts.rollout(step_episodes(cfg, 1))
        prep = trainer.learner.prepare(batch.trajectories)
        mb = prep.micro(range(len(prep.lengths)), torch.device("cpu"))
        sampled = mb.loss_mask.bool()
        assert 0 < int(sampled.sum()) < sampled.numel() // 4  # most tokens are prompt and tool results
        # Give the sampled tokens a learning signal, and poison every other position.
        garbage = torch.full_like(mb.advantages, float("nan"))
        signal = torch.linspace(-1.0, 1.0, mb.advantages.numel()).view_as(mb.advantages)
        clean = type(mb)(**{**mb.__dict__, "advantages": torch.where(sampled, signal, 0.0)})
        poisoned = type(mb)(
            **{
                **mb.__dict__,
                "advantages": torch.where(sampled, signal, garbage),
                "old_logprobs": torch.where(sampled, mb.old_logprobs, garbage),
                "returns": torch.where(sampled, mb.returns, garbage),
            }
        )
        agg = Aggregation(total_tokens=float(sampled.sum()))
        losses = []
        for micro in (clean, poisoned):
            trainer.policy.zero_grad()
            out = trainer.policy(micro.token_ids, micro.attention_mask, micro.loss_mask)
            assert out.logits.shape[0] == int(sampled.sum())  # outputs only where the policy sampled
            result = micro_loss(out, micro, cfg, agg)
            result.loss.backward()
            grads = [p.grad.clone() for p in trainer.policy.parameters() if p.grad is not None]
            losses.append((float(result.loss.detach()), grads))
        (loss_a, grads_a), (loss_b, grads_b) = losses
        assert math.isfinite(loss_a) and loss_a == loss_b
        assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
        assert any(float(g.abs().sum()) > 0 for g in grads_a)
    finally:
        trainer.close()


def test_padding_changes_no_real_tokens_logits_and_left_padding_is_refused(model_dir: Path) -> None:
    """The policy drops the padding mask (causal attention alone): exact only under right padding."""
    policy = PolicyModel.load(model_dir, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    lengths = [23, 9, 16]
    width = max(lengths)
    ids = torch.randint(1, 30, (len(lengths), width), generator=gen)
    attention = torch.zeros(len(lengths), width, dtype=torch.long)
    loss = torch.zeros(len(lengths), width)
    for row, n in enumerate(lengths):
        attention[row, :n] = 1
        loss[row, 3:n] = 1.0
        ids[row, n:] = 0
    with torch.no_grad():
        batched = policy(ids, attention, loss).logits
        alone = torch.cat(
            [
                policy(ids[r : r + 1, :n], attention[r : r + 1, :n], loss[r : r + 1, :n]).logits
                for r, n in enumerate(lengths)
            ]
        )
    assert batched.shape == alone.shape == (sum(n - 3 for n in lengths), batched.shape[1])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="right-padded"):
        policy(ids, attention.flip(1), torch.zeros_like(loss))


def test_micro_batches_pack_by_padded_tokens() -> None:
    lengths = [10, 300, 50, 120, 100, 40]
    packed = micro_batches(lengths, range(6), budget=300)
    assert sorted(r for mb in packed for r in mb) == list(range(6))
    assert packed[0] == [1]  # longest first, alone at its budget
    for mb in packed:
        assert len(mb) == 1 or len(mb) * max(lengths[r] for r in mb) <= 300
    assert micro_batches([500], [0], budget=100) == [[0]]  # too long for the budget: alone


def test_lr_schedule_warms_up_then_decays_to_the_floor(model_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(
        model_dir, tmp_path, optim={"warmup_steps": 2, "schedule": "cosine", "min_lr_ratio": 0.1},
        trainer={"steps": 5}, algo={"epochs": 2},
    )  # fmt: skip
    factor = lr_factor(cfg)
    assert [factor(0), factor(1)] == [0.5, 1.0]
    assert (
        factor(2) == pytest.approx(1.0)
        and factor(9) == pytest.approx(0.1)
        and factor(50) == pytest.approx(0.1)
    )
    assert all(factor(u) >= factor(u + 1) for u in range(2, 12))


def test_prompts_are_a_pure_function_of_seed_and_step(model_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(model_dir, tmp_path, env={"train_seeds": {"start": 1000, "stop": 2000}})
    seeds = step_seeds(cfg, 3)
    assert seeds == step_seeds(cfg, 3) and len(set(seeds)) == 2 and all(1000 <= s < 2000 for s in seeds)
    assert seeds != step_seeds(cfg, 4) and seeds != step_seeds(cfg, 3, round_=1)
    ids = [e.episode_id for e in step_episodes(cfg, 3)]
    assert len(ids) == 4 and len(set(ids)) == 4 and all(i.startswith("train/3/0/") for i in ids)


def test_next_steps_prompts_are_announced_to_a_scheduler_that_takes_them(
    model_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(model_dir, tmp_path / "run", trainer={"steps": 3})
    trainer = Trainer(cfg)
    heard: list[list[str]] = []

    def announce(episodes: list[Any]) -> int:  # RolloutScheduler.announce: the jobs it queued
        heard.append([e.episode_id for e in episodes])
        if len(heard) == 2:
            raise RuntimeError("run-ahead queue full")  # costs speed only: the step goes on
        return len(episodes)

    trainer.rollouts.scheduler.announce = announce  # type: ignore[attr-defined]
    try:
        steps = [r for r in trainer.run() if r["kind"] == "step"]
    finally:
        trainer.close()
    assert len(steps) == 3
    # During step s the scheduler hears step s + 1's episodes; nothing after the last step.
    assert heard == [[e.episode_id for e in step_episodes(cfg, s)] for s in (2, 3)]
    assert trainer.state.announced


def test_an_update_raises_rewarded_episodes_and_lowers_punished_ones(model_dir: Path, tmp_path: Path) -> None:
    """The sign of the whole learning path (collate, loss, optimizer): one update with advantage +1
    on one episode and -1 on another must make the first more likely and the second less."""
    cfg = tiny_config(model_dir, tmp_path / "run", optim={"lr": 1e-2, "warmup_steps": 0})
    trainer = Trainer(cfg)
    try:
        trajectories = _first_step_episodes(trainer, cfg)
        up, down = trajectories[0], trajectories[1]

        def score(t: Any) -> float:
            prompt_len = t.loss_mask.index(1)
            lp = teacher_forced(
                trainer.policy, tuple(t.token_ids[:prompt_len]), tuple(t.token_ids[prompt_len:])
            )
            mask = torch.tensor(t.loss_mask[prompt_len:], dtype=torch.float32)
            return float((lp * mask).sum())

        before = score(up), score(down)
        prep = _with_advantages(trainer.learner.prepare([up, down]), [1.0, -1.0])
        trainer.learner.update(prep)
        after = score(up), score(down)
        assert after[0] > before[0] + 1e-3, (before, after)
        assert after[1] < before[1] - 1e-3, (before, after)
    finally:
        trainer.close()


def test_backward_leaves_one_batchs_gradient_and_eps_reaches_adamw(model_dir: Path, tmp_path: Path) -> None:
    """``Learner.backward`` (what an update applies, and what benchmarks/gradient_snr.py compares)
    replaces the gradients rather than adding to them; ``optim.eps`` is AdamW's epsilon."""
    cfg = tiny_config(model_dir, tmp_path / "run", optim={"eps": 1e-5})
    trainer = Trainer(cfg)
    try:
        assert all(g["eps"] == 1e-5 for g in trainer.learner.optimizer.param_groups)
        trajectories = _first_step_episodes(trainer, cfg)
        signs = [(-1.0) ** i for i in range(len(trajectories))]  # the tiny env's rewards tie
        prep = _with_advantages(trainer.learner.prepare(trajectories), signs)

        def grads() -> torch.Tensor:
            return torch.cat(list(trainer.learner.gradients().values()))

        trainer.learner.backward(prep, range(len(trajectories)))
        first = grads()
        trainer.learner.backward(prep, range(len(trajectories)))
        assert torch.isfinite(first).all() and float(first.norm()) > 0
        torch.testing.assert_close(grads(), first)  # not 2x: each call starts from zero
    finally:
        trainer.close()


def test_an_in_process_learner_scores_with_the_engines_own_masks(tmp_path: Path) -> None:
    """Constrained rollouts on a CPU engine: the learner reads the masks the engine walked (one cache)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from srt_agent.engine.torch_engine import TorchEngine
    from srt_agent.recipe.tokenizer import train_tokenizer

    tok = train_tokenizer(
        ['What is 12 + 30? <tool_call>{"name": "calculator"}</tool_call> 42'] * 4, vocab_size=300
    )
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, eos_token_id=tok.eos_token_id, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = tiny_config(
        tmp_path / "model", tmp_path / "run", rollout={"constrain_tool_calls": True}, trainer={"steps": 1}
    )
    trainer = Trainer(cfg)
    try:
        engine = trainer.rollouts.engine
        assert isinstance(engine, TorchEngine)
        assert trainer.learner.call_masks is engine.call_masks()
        engine.device = torch.device("meta")  # an accelerator's masks would stay in its memory all step
        own = trainer._call_masks()
        assert own is not None and own is not engine.call_masks() and own.device.type == "cpu"
        engine.device = torch.device("cpu")
        (step,) = [r for r in trainer.run() if r["kind"] == "step"]
        assert step["logprob_mismatch"] < 1e-4
    finally:
        trainer.close()


def test_the_reverse_curriculum_starts_episodes_after_the_oracles_turns(
    model_dir: Path, tmp_path: Path
) -> None:
    settings: dict[str, Any] = {"env": {"oracle_prefix": 1.0}, "rollout": {"prompts_per_step": 6, "n": 2}}
    cfg = tiny_config(model_dir, tmp_path / "run", trainer={"steps": 1}, **settings)
    trainer = Trainer(cfg)
    try:
        trajectories = _first_step_episodes(trainer, cfg)
    finally:
        trainer.close()
    played = [t.final_info["oracle_turns"] for t in trajectories]
    assert len(played) == 12 and len(set(played)) > 1 and min(played) == 0  # a share of 0..1 per task
    for t, k in zip(trajectories, played, strict=True):
        assert sum(m.role == "assistant" for m in t.messages) == k + t.num_turns  # its turns are prompt,
        first = t.turns[0].start if t.turns else len(t.token_ids)
        assert not any(t.loss_mask[:first])  # and carry no loss: only the policy's tokens do
    step = _one_step(tiny_config(model_dir, tmp_path / "run2", trainer={"steps": 1}, **settings))
    assert step["oracle_turns_mean"] == pytest.approx(sum(played) / len(played))  # same tasks, same shares


def test_speculation_changes_nothing_in_a_training_run_but_its_forward_passes(tmp_path: Path) -> None:
    # A peaked policy, so that samples of one prompt share stretches a sibling's draft predicts:
    # drafts are accepted here, where the random tiny policy's never are.
    peaked = save_peaked_policy(tmp_path / "peaked")
    runs: dict[bool, tuple[list[Trajectory], list[dict[str, Any]], dict[str, torch.Tensor]]] = {}
    for enabled in (True, False):
        cfg = tiny_config(
            peaked,
            tmp_path / f"spec-{enabled}",
            rollout={"n": 4, "max_new_tokens": 24},
            # Not adaptive: the cost model sizes drafts by measured forward times, which would
            # make whether a step drafts at all depend on the machine's speed.
            spec={"enabled": enabled, "adaptive": False, "run_ahead": {"enabled": False}},
            trainer={"checkpoint_every": 0},
        )
        trainer = Trainer(cfg)
        try:
            episodes = _first_step_episodes(trainer, cfg)  # what step 1 samples, seen from outside
            steps = [r for r in trainer.run() if r["kind"] == "step"]
            runs[enabled] = episodes, steps, {k: v.clone() for k, v in trainer.policy.lm_state_dict().items()}
        finally:
            trainer.close()
    (episodes_on, on, weights_on), (episodes_off, off, weights_off) = runs[True], runs[False]
    assert sum(r["mean_accepted"] for r in on) > 0 and all(r["mean_accepted"] == 0 for r in off)
    assert all(a["tokens_per_forward"] > 1 for a in on) and all(b["tokens_per_forward"] == 1 for b in off)
    # The same episodes: drafts verified exactly sample the tokens plain decoding samples, and
    # record the policy's own logprobs (the learner's forward reproduces them at every step).
    assert len(episodes_on) == len(episodes_off) == 8
    for a, b in zip(episodes_on, episodes_off, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    assert all(r["logprob_mismatch"] < 1e-4 for r in on + off)
    for name, tensor in weights_on.items():  # so the same updates, up to the logprobs' float rounding
        torch.testing.assert_close(tensor, weights_off[name], atol=1e-4, rtol=0, msg=name)
