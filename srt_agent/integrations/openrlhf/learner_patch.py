"""OpenRLHF's PPO/GRPO trainer, run with SGLang rollout engines: what changes, and where.

OpenRLHF 0.11.2 has no SGLang backend, so ``srt-agent openrlhf-train`` runs OpenRLHF's own
``openrlhf.cli.train_ppo_ray`` with three changes, applied in the driver and (by Ray's worker
set-up hook) in every Ray worker before OpenRLHF's code runs:

1. **Engines**: ``openrlhf.trainer.ray.create_vllm_engines`` is replaced by
   :func:`~srt_agent.integrations.openrlhf.sglang_engine.create_sglang_engines` (same arguments).
2. **Weight-sync group**: OpenRLHF's learner joins its engines through vLLM's ``StatelessProcessGroup``
   and PyNccl, which SGLang's receiver cannot join. ``ActorPPOTrainer._init_vllm_sync_group`` is
   replaced by one that builds the group as SGLang does (a torch process group over a ``tcp://``
   rendezvous, :func:`~srt_agent.serving.weight_sync.init_custom_process_group`); its
   ``broadcast(tensor, src, stream)`` is a ``torch.distributed.broadcast`` on that group, so
   OpenRLHF's per-parameter loop runs unchanged. The colocated CUDA-IPC path needs no change.
3. **vLLM imports**: OpenRLHF imports vLLM at module load; where vLLM is not installed (a machine
   with SGLang), a stand-in module provides the names it imports (``SamplingParams`` and friends);
   its engines refuse to start.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import types
import uuid
from typing import Any

from srt_agent.errors import SrtAgentError
from srt_agent.integrations.openrlhf.server_process import free_port
from srt_agent.serving.weight_sync import WeightSender

__all__ = [
    "SETUP_HOOK",
    "OpenRLHFSetupError",
    "apply",
    "install_vllm_stand_in",
    "run_openrlhf_train",
    "sglang_sync_group",
]

SETUP_HOOK = "srt_agent.integrations.openrlhf.learner_patch.apply"
"""Ray's ``worker_process_setup_hook``: applies the patch in every worker process."""


class _SamplingParams:
    """vLLM's ``SamplingParams`` as OpenRLHF builds and its executors read it."""

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, **kwargs: Any) -> None:
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_tokens = kwargs.pop("max_tokens", None)
        self.min_tokens = kwargs.pop("min_tokens", 0)
        self.logprobs = kwargs.pop("logprobs", None)
        self.stop_token_ids: list[int] = list(kwargs.pop("stop_token_ids", None) or [])
        self.seed = kwargs.pop("seed", None)
        for key, value in kwargs.items():
            setattr(self, key, value)


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("vLLM is not installed: srt-agent's OpenRLHF run uses SGLang engines")


def install_vllm_stand_in() -> bool:
    """Register a stand-in ``vllm`` module if vLLM is not installed; whether one was registered."""
    if "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None:
        return False
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.0.0+srt-agent-stand-in"  # type: ignore[attr-defined]
    vllm.SamplingParams = _SamplingParams  # type: ignore[attr-defined]
    vllm.AsyncEngineArgs = _refuse  # type: ignore[attr-defined]
    vllm.AsyncLLMEngine = types.SimpleNamespace(from_engine_args=_refuse)  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    utils = types.ModuleType("vllm.utils")
    utils.random_uuid = lambda: uuid.uuid4().hex  # type: ignore[attr-defined]
    vllm.inputs, vllm.utils = inputs, utils  # type: ignore[attr-defined]
    sys.modules.update({"vllm": vllm, "vllm.inputs": inputs, "vllm.utils": utils})
    return True


class _TorchGroup:
    """The object OpenRLHF keeps as ``_model_update_group``: ``broadcast`` on the sender's torch group."""

    def __init__(self, sender: WeightSender) -> None:
        self.sender = sender

    def broadcast(self, tensor: Any, src: int = 0, stream: Any = None) -> None:
        import torch.distributed as dist

        dist.broadcast(tensor, src, group=self.sender.group)  # in place, as OpenRLHF's PyNccl group does


def sglang_sync_group(trainer: Any, backend: str) -> None:
    """``ActorPPOTrainer._init_vllm_sync_group`` for SGLang engines (the learner's rank 0 only).

    The same rank layout as OpenRLHF's (rank 0 the learner, engine ``i`` from ``i * tp + 1``) and
    group name, but the group SGLang's receiver builds, so the engines' ``init_process_group``
    (SGLang's ``/init_weights_update_group``) and this rank meet.
    """
    import ray

    args = trainer.strategy.args.vllm
    if getattr(args, "sync_with_ray", False):
        raise ValueError("SGLang engines cannot join a ray.util.collective group; drop --vllm.sync_with_ray")
    address = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    port = free_port("")
    tp = int(args.tensor_parallel_size)
    world_size = int(args.num_engines) * tp + 1
    refs = [
        engine.init_process_group.remote(address, port, i * tp + 1, world_size, "openrlhf", backend=backend)
        for i, engine in enumerate(trainer.vllm_engines)
    ]
    sender = WeightSender.connect(address, port, world_size, group_name="openrlhf", backend=backend)
    trainer._model_update_group = _TorchGroup(sender)
    ray.get(refs)


def apply() -> None:
    """Apply the patch in this process (the driver, or a Ray worker through :data:`SETUP_HOOK`)."""
    install_vllm_stand_in()
    if importlib.util.find_spec("openrlhf") is None:
        return
    import openrlhf.trainer.ray as ray_pkg

    from srt_agent.integrations.openrlhf.sglang_engine import create_sglang_engines

    ray_pkg.create_vllm_engines = create_sglang_engines
    if importlib.util.find_spec("deepspeed") is not None:  # the learner's processes (engines need not)
        from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

        ActorPPOTrainer._init_vllm_sync_group = sglang_sync_group


class OpenRLHFSetupError(SrtAgentError, RuntimeError):
    """``srt-agent openrlhf-train`` cannot start (the message says what to install or change)."""


SERVER_VARIABLE = "SRT_ROLLOUT_SERVER"
"""Which server each engine starts (``sglang`` or ``srt``); set by :func:`run_openrlhf_train`."""


def run_openrlhf_train(args: list[str], *, server: str = "sglang") -> None:
    """Run ``openrlhf.cli.train_ppo_ray`` with ``args`` (OpenRLHF's own flags) on SGLang engines.

    Raises:
        OpenRLHFSetupError: OpenRLHF is not installed, or ``server`` is unknown.
    """
    if server not in ("sglang", "srt"):
        raise OpenRLHFSetupError(f"--server {server!r}: use sglang (GPUs) or srt (the embedded engine, CPU)")
    if importlib.util.find_spec("openrlhf") is None:
        raise OpenRLHFSetupError(
            "OpenRLHF is not installed: pip install openrlhf==0.11.2 (see examples/openrlhf)"
        )
    import ray

    os.environ[SERVER_VARIABLE] = server
    apply()
    if not ray.is_initialized():  # OpenRLHF's own defaults, plus the patch in every worker
        env_vars = {
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
            "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
            "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
            SERVER_VARIABLE: server,
        }
        ray.init(runtime_env={"env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK})
    sys.argv = ["openrlhf.cli.train_ppo_ray", *args]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)
