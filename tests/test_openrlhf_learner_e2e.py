"""OpenRLHF 0.11.2's own RL step, end to end, with SGLang rollout engines on ``srt-agent serve``.

``pytest -m openrlhf`` after ``.ci/openrlhf-install``. One GRPO step on a CPU, every stage run by
OpenRLHF's own code except DeepSpeed's:

1. ``create_sglang_engines`` starts a Ray actor of :class:`SGLangRolloutEngine` with its server (the
   embedded engine behind SGLang's API, drafting from its tree cache);
2. OpenRLHF's ``SamplesGenerator`` wakes it, dispatches the prompts (srt episodes of a test env
   whose shaped reward a random policy spreads out) to its ``generate_responses`` with the srt
   agent executor, puts it back to sleep and builds ``Experience`` objects;
3. OpenRLHF's ``RemoteExperienceMaker.make_experience_batch`` gets the learner's log-probs from
   OpenRLHF's ``Actor`` and computes GRPO advantages;
4. OpenRLHF's ``ActorPPOTrainer.ppo_train`` (its replay buffer, ``training_step`` and
   ``PolicyLoss``, with rollout importance correction on) takes an optimizer step;
5. OpenRLHF's ``ActorPPOTrainer.broadcast_to_vllm`` sends the new weights one parameter at a time
   over the group the learner patch builds, into the server; the next rollout samples from them.

What stands in for DeepSpeed (not runnable on a CPU): the strategy's ``backward`` /
``optimizer_step`` (plain torch), a one-process gloo world for ``torch.distributed``, and no-op
CUDA stream/sync calls. The learner's model is OpenRLHF's ``Actor`` over the policy in fp32.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

# Ray waits in C++, where pytest's signal timeout cannot interrupt it: a hung run is killed
# (with every thread's stack printed) instead of holding CI to its own limit.
pytestmark = [pytest.mark.openrlhf, pytest.mark.timeout(300, method="thread")]
pytest.importorskip("openrlhf", reason="needs openrlhf")
pytest.importorskip("deepspeed", reason="OpenRLHF's trainer module imports deepspeed")
ray = pytest.importorskip("ray")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from openrlhf.models import Actor, PolicyLoss  # noqa: E402
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: E402
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController  # noqa: E402
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer  # noqa: E402
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer  # noqa: E402
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call  # noqa: E402
from train_fixtures import save_peaked_policy  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from srt_agent.integrations.openrlhf.learner_patch import sglang_sync_group  # noqa: E402
from srt_agent.integrations.openrlhf.samples import episode_prompt  # noqa: E402
from srt_agent.integrations.openrlhf.server_process import free_port  # noqa: E402
from srt_agent.integrations.openrlhf.sglang_engine import create_sglang_engines  # noqa: E402

TESTS = Path(__file__).resolve().parent
AGENT = TESTS.parent / "examples" / "openrlhf" / "agent_func.py"
ENV = "shaped_reply_env:test/ShapedReply-v0"  # a reward a random policy spreads out: GRPO has signal
N_PROMPTS, N_SAMPLES, MAX_LEN, TURN_TOKENS = 2, 4, 512, 24


def _args() -> NS:
    """The parts of OpenRLHF's parsed arguments these stages read (GRPO, importance correction on)."""
    return NS(
        vllm=NS(enable_sleep=True, sync_with_ray=False, tensor_parallel_size=1, num_engines=1,
                enable_prefix_caching=True),
        rollout=NS(batch_size=N_PROMPTS, n_samples_per_prompt=N_SAMPLES, vllm_generate_batch_size=None,
                   micro_batch_size=N_SAMPLES, max_new_tokens=TURN_TOKENS),
        algo=NS(dynamic_filtering_enable=False,
                advantage=NS(estimator="group_norm", gamma=1.0, lambd=1.0, no_std_norm=False,
                             is_correction_level="token", is_correction_mode="mask",
                             is_correction_gating="ratio", is_correction_threshold=(0.5, 5.0)),
                kl=NS(use_loss=False, estimator="k1", init_coef=0.0)),
        train=NS(dynamic_batch_enable=False, colocate_all=False, colocate_actor_ref=False,
                 colocate_critic_reward=False),
        ds=NS(ring_attn_size=1, tensor_parallel_size=1, zero_stage=0),
        reward=NS(clip_range=(-10.0, 10.0), overlong_buffer_len=None, stop_properly_penalty_coef=None),
        data=NS(max_len=MAX_LEN),
        actor=NS(eps_clip_low_high=(0.2, 0.2), dual_clip=None, loss_agg_mode="token-mean",
                 policy_loss_type="ppo", aux_loss_coef=0.0, entropy_coef=None),
    )  # fmt: skip


class _LocalGroup:
    """OpenRLHF's ``RayActorGroup`` surface over one in-process model: one "rank" does every batch."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor

    def async_run_method_batch(self, method_name: str, **batches: list[Any]) -> list[Any]:
        assert method_name == "forward"
        n = len(next(iter(batches.values())))
        with torch.no_grad():
            outs = [self.actor(b["sequences"], b["action_mask"], b["attention_mask"])
                    for b in ({k: v[i] for k, v in batches.items()} for i in range(n))]  # fmt: skip
        return [ray.put(outs)]


class _Strategy:
    """What ``ppo_train`` asks of DeepSpeed's strategy, for one process in fp32."""

    def __init__(self, args: NS) -> None:
        self.args, self.ring_attn_group, self.accumulated_gradient, self.ds_device_mesh = args, None, 1, None

    def is_rank_0(self) -> bool:
        return True

    def backward(self, loss: torch.Tensor, model: Any, optimizer: Any) -> None:
        loss.backward()

    def optimizer_step(self, optimizer: Any, model: Any, scheduler: Any, name: str) -> None:
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()

    def get_grad_norm(self, model: Any) -> float:
        return 0.0  # gradients are cleared by the step above (DeepSpeed reports the pre-step norm)

    def all_reduce(self, data: dict[str, Any]) -> dict[str, Any]:
        return data


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    """Ray with the engine's per-turn budget, and a one-process gloo world for ``torch.distributed``."""
    # The engine actor's executor makes the test env by "module:id": tests/ goes on its path.
    env = {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": env})  # fmt: skip
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=120))  # fmt: skip
    try:
        yield
    finally:
        dist.destroy_process_group()
        ray.shutdown()


def _samples(generator: SamplesGenerator) -> list[Any]:
    experiences, _, consumed, _ = generator.generate_samples(
        temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=TURN_TOKENS, max_len=MAX_LEN,
        n_samples_per_prompt=N_SAMPLES,
    )  # fmt: skip
    assert consumed == N_PROMPTS
    return list(experiences)


def _learner_logprobs(actor: Actor, experiences: list[Any]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [actor(e.sequences, e.action_mask, e.attention_mask) for e in experiences]


def test_one_grpo_step_of_openrlhf_against_serve(
    world: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: None)  # CUDA's, absent on a CPU
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    model_dir = save_peaked_policy(tmp_path / "policy")  # drafts from sibling samples get accepted
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = _args()
    strategy = _Strategy(args)
    # The server drafts whatever its tree cache holds (the cost model would, on 2 cores, judge a
    # near-uniform tiny policy's drafts not worth verifying and decode plainly).
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("adaptive: false\n")
    engines = create_sglang_engines(
        1, 1, str(model_dir), 0, False, True, True, MAX_LEN,
        vllm_enable_sleep=True, agent_func_path=str(AGENT), server="srt", num_gpus_per_engine=0,
        extra_server_args=["--config", str(spec_file)],
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    actor = Actor(model)  # given a model (fp32 here; by path it loads bf16 or fp16 only)
    actor.packing_samples = False  # set only on the by-path branch of Actor.__init__
    prompts = [episode_prompt(ENV, seed=s, options={"max_turns": 1}) for s in range(N_PROMPTS)]
    loader = [(list(range(N_PROMPTS)), prompts, [""] * N_PROMPTS, [None] * N_PROMPTS)]
    generator = SamplesGenerator(strategy, loader, None, tokenizer, engines)
    try:
        # 2. Rollouts through OpenRLHF's samples generator (wake, dispatch, sleep).
        samples = _samples(generator)
        assert len(samples) == N_PROMPTS * N_SAMPLES
        assert len({tuple(e.sequences[0].tolist()) for e in samples}) == len(samples)  # sampled apart
        assert all(e.rollout_log_probs is not None and e.rewards is not None for e in samples)
        # The rollout server drafted from its tree cache (a prompt's samples draft from each other),
        # verified the drafts and accepted some: fewer forwards than tokens.
        info = ray.get(engines[0].server_info.remote())
        assert info["speculative_algorithm"] == "SRT", info
        assert info["verify_forwards"] > 0 and info["nodes_accepted"] > 0, info
        assert info["row_steps"] < info["tokens"], info

        # 3. The experience maker: learner log-probs, GRPO advantages.
        maker = RemoteExperienceMaker(
            _LocalGroup(actor), None, None, None, FixedKLController(0.0), strategy, tokenizer
        )
        experiences = maker.make_experience_batch(samples)
        for e in experiences:
            mask = e.action_mask.bool()
            # The engine's recorded log-probs are the learner's own (fp32 both sides; SRT drafted).
            assert torch.allclose(e.action_log_probs[mask], e.rollout_log_probs[mask], atol=2e-4)
            assert torch.isfinite(e.advantages).all() and e.advantages.shape == e.action_mask.shape

        # 4. OpenRLHF's PPO step: replay buffer, training_step, PolicyLoss with importance correction.
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        monkeypatch.setattr(
            torch.cuda, "current_device", lambda: 0
        )  # the buffer names cuda:N (unused offloaded)
        buffer = NaiveReplayBuffer(N_SAMPLES, cpu_offload=True, packing_samples=False)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # ppo_train moves batches there
        trainer = NS(args=args, strategy=strategy, actor=actor, max_epochs=1, dataloader_pin_memory=False,
                     replay_buffer=buffer, aux_loss=False,
                     ema_model=None, actor_loss_fn=PolicyLoss(**_loss_kwargs(args)))  # fmt: skip
        trainer.actor_optim = torch.optim.Adam(model.parameters(), lr=1e-2)
        trainer.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.actor_optim, lambda _: 1.0)
        trainer.training_step = types.MethodType(ActorPPOTrainer.training_step, trainer)
        for e in experiences:
            trainer.replay_buffer.append(e)
        status = ActorPPOTrainer.ppo_train(trainer, 0.0)
        assert torch.isfinite(torch.tensor(status["policy_loss"]))
        assert status["vllm_kl"] == pytest.approx(0.0, abs=1e-5)  # rollout and learner policies agree
        assert status["is_filter_ratio"] == 0.0
        assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())

        # 5. OpenRLHF's broadcast into the server over the patched group; the next rollout uses it.
        trainer.vllm_engines, trainer.use_cuda_ipc = engines, False
        trainer.actor = NS(model=NS(module=model), is_vlm=False)
        sglang_sync_group(trainer, "gloo")
        batch_vllm_engine_call(engines, "wake_up", tags=["weights"])  # as PPOTrainer.broadcast_to_vllm
        ActorPPOTrainer.broadcast_to_vllm(trainer)  # the KV cache wakes with the next rollout
        generator.prompts_dataloader = loader
        generator._dataloader_iter = None
        after = _samples(generator)
        old = Actor(
            AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
        )
        old.packing_samples = False
        stale = 0
        for e, learner, before_step in zip(
            after, _learner_logprobs(actor, after), _learner_logprobs(old, after), strict=True
        ):
            mask = e.action_mask.bool()
            assert torch.allclose(learner[mask], e.rollout_log_probs[mask], atol=2e-4)
            stale += torch.allclose(before_step[mask], e.rollout_log_probs[mask], atol=2e-4)
        assert stale == 0  # the server no longer samples from the weights it started with
    finally:
        group = getattr(trainer, "_model_update_group", None) if "trainer" in locals() else None
        if group is not None:
            group.sender.close()
        for engine in engines:
            ray.get(engine.close.remote())
            ray.kill(engine)


def _loss_kwargs(args: NS) -> dict[str, Any]:
    """``PolicyLoss``'s arguments as ``ActorPPOTrainer.__init__`` builds them from ``args``."""
    return dict(
        clip_eps_low=args.actor.eps_clip_low_high[0], clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip, token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=args.algo.advantage.is_correction_level,
        is_correction_mode=args.algo.advantage.is_correction_mode,
        is_correction_gating=args.algo.advantage.is_correction_gating,
        is_correction_threshold=args.algo.advantage.is_correction_threshold,
    )  # fmt: skip
