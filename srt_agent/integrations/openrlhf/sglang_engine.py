"""OpenRLHF's rollout engine, backed by an SGLang server that drafts with SRT.

OpenRLHF 0.11.2 creates its rollout engines with ``create_vllm_engines`` and calls, on each
``RolloutRayActor``: ``init_process_group``, ``update_weight``, ``update_weight_cuda_ipc``,
``reset_prefix_cache``, ``pause_generation`` / ``resume_generation``, ``sleep`` / ``wake_up``,
``get_num_unfinished_requests`` and ``generate_responses``; its agent executors call ``generate``
in the actor's own process. :class:`SGLangRolloutEngine` has exactly that surface. Each engine owns
a server process (``srt-agent sglang-serve``: SGLang with SRT; or ``srt-agent serve`` where SGLang
cannot run) and maps each call onto SGLang's HTTP API, keeping SGLang's rules:

* weight updates only inside a ``/begin_weight_update`` ... ``/end_weight_update`` session: a sync
  opens one at its first parameter and closes it at the last (OpenRLHF marks it ``empty_cache``);
* the receiving process group is SGLang's (a torch group over a ``tcp://`` rendezvous), not vLLM's:
  the learner joins it with :func:`srt_agent.serving.weight_sync.init_custom_process_group`;
* a pause retracts running requests (SGLang's default pause would abort them);
* memory release and resume by tag, each tag resumed only if released (SGLang's scheduler dies
  otherwise), weights kept on the CPU while released (the first rollout runs on them).

Samples of one prompt and every turn of an episode go to the same engine (OpenRLHF's generator
sends a prompt's ``n`` samples to one engine, and an episode's turns run in one ``execute``), so
the server's tree cache sees the task's earlier rollouts and drafts from them.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import itertools
import json
import logging
import os
import pickle
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams
from srt_agent.engine.hf_checkpoint import read_config
from srt_agent.errors import SrtAgentError
from srt_agent.integrations.openrlhf.server_process import ServerProcess, free_port, server_args
from srt_agent.serving.client import EngineConnectionError, SGLangEngine
from srt_agent.serving.server import MEMORY_TAGS

__all__ = [
    "CompletionOutput",
    "EngineServerLost",
    "RequestOutput",
    "SGLangRolloutEngine",
    "create_sglang_engines",
    "engine_placements",
]

log = logging.getLogger(__name__)


class EngineServerLost(SrtAgentError, RuntimeError):
    """The engine's server died and could not be restarted; the message has the end of its log."""


@dataclass
class Logprob:
    """vLLM's per-token logprob object (OpenRLHF reads ``.logprob``)."""

    logprob: float


@dataclass
class CompletionOutput:
    """The fields of vLLM's ``CompletionOutput`` that OpenRLHF's executors read."""

    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict[int, Logprob]] | None


@dataclass
class RequestOutput:
    """vLLM's ``RequestOutput`` as OpenRLHF's executors read it (``outputs[0]``)."""

    outputs: list[CompletionOutput] = field(default_factory=list)


def _eos_token_ids(model: str) -> tuple[int, ...]:
    """The model's end tokens, from its ``config.json`` (one id, a list, or none)."""
    eos = json.loads((Path(model) / "config.json").read_text()).get("eos_token_id")
    return tuple(int(t) for t in eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))


def _sampling(params: Any, prompt_len: int, max_context: int, eos: tuple[int, ...]) -> SamplingParams:
    """srt-agent's sampling parameters from vLLM's ``SamplingParams`` (OpenRLHF builds those)."""
    top_k = int(getattr(params, "top_k", 0) or 0)
    max_tokens = getattr(params, "max_tokens", None) or max_context - prompt_len
    stop = tuple(int(t) for t in (getattr(params, "stop_token_ids", None) or ()))
    if not getattr(params, "ignore_eos", False):
        stop += tuple(t for t in eos if t not in stop)
    seed = getattr(params, "seed", None)
    return SamplingParams(
        temperature=float(getattr(params, "temperature", 1.0)),
        top_p=float(getattr(params, "top_p", 1.0)),
        top_k=max(top_k, 0),  # vLLM's -1 (off) is srt-agent's 0
        max_new_tokens=max(1, min(int(max_tokens), max_context - prompt_len)),
        stop_token_ids=stop,
        seed=None if seed is None else int(seed),
    )


class SGLangRolloutEngine:
    """One rollout engine for OpenRLHF: its server process and the calls OpenRLHF makes.

    Args:
        model: The policy's HF directory (the server loads it).
        server: ``"sglang"`` (``srt-agent sglang-serve``: SGLang with SRT, GPUs) or ``"srt"``
            (``srt-agent serve``: CPU and tests).
        url: Use a running server at this URL instead of starting one.
        tensor_parallel_size: GPUs of this engine.
        seed: The server's seed.
        max_model_len: The longest sequence (OpenRLHF's ``--data.max_len``).
        enforce_eager: No CUDA graphs.
        gpu_memory_utilization: SGLang's static memory fraction.
        enable_sleep: Start with memory release on, so :meth:`sleep` and :meth:`wake_up` work.
        agent_func_path: OpenRLHF's ``--train.agent_func_path`` (its ``AgentExecutor`` class).
        remote_rm_url: OpenRLHF's single-turn executor's reward server.
        extra_server_args: More server flags.
        log_dir: Where the server's log goes (default: a temporary folder).
        start_timeout_s: How long the server may take to come up.
    """

    def __init__(
        self,
        model: str,
        *,
        server: str = "sglang",
        url: str | None = None,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        gpu_memory_utilization: float | None = None,
        enable_sleep: bool = False,
        agent_func_path: str | None = None,
        remote_rm_url: str | None = None,
        extra_server_args: tuple[str, ...] = (),
        log_dir: str | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        self.model = str(model)
        self.max_context = max_model_len or read_config(model).max_position_embeddings
        self.tp_size = tensor_parallel_size
        self.agent_func_path, self.remote_rm_url = agent_func_path, remote_rm_url
        self._executor: Any = None
        self.process: ServerProcess | None = None
        self.start_timeout_s = start_timeout_s
        if url is None:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            command = server_args(
                server, self.model, host="127.0.0.1", port=port, tensor_parallel_size=tensor_parallel_size,
                seed=seed, max_model_len=max_model_len, enforce_eager=enforce_eager,
                gpu_memory_utilization=gpu_memory_utilization, enable_sleep=enable_sleep,
                extra=extra_server_args,
            )  # fmt: skip
            logs = Path(log_dir or tempfile.mkdtemp(prefix="srt-rollout-engine-"))
            self.process = ServerProcess(command, url, logs / f"server-{port}.log", name="the rollout server")
            self.process.start(start_timeout_s)
        self.url = url
        self.client = SGLangEngine(
            url, max_context=self.max_context, model_dir=self.model, tp_size=tensor_parallel_size
        )
        self.released: set[str] = set()
        self.session_open = False
        self.group_name: str | None = None
        self.unfinished = 0
        self.eos_token_ids = _eos_token_ids(self.model)  # vLLM stops on them unless ``ignore_eos``
        self._tokenizer: Any = None
        self._restarting = asyncio.Lock()
        self._request_ids = itertools.count()

    # ------------------------------------------------------------------ weight sync
    async def init_process_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
        use_ray: bool = False,
    ) -> None:
        """Join the learner's weight-sync group (SGLang's ``/init_weights_update_group``).

        Returns once the learner's rank 0 has joined too (it joins after firing this call).

        Raises:
            ValueError: ``use_ray``: SGLang cannot join a ``ray.util.collective`` group (drop
                ``--vllm.sync_with_ray``).
        """
        if use_ray:
            raise ValueError(
                "SGLang engines cannot join a ray.util.collective group; drop --vllm.sync_with_ray"
            )
        await asyncio.to_thread(
            self.client.init_weights_update_group,
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )
        self.group_name = group_name

    async def _open_session(self) -> None:
        if not self.session_open:
            await asyncio.to_thread(self.client.begin_weight_update)
            self.session_open = True

    async def _close_session(self) -> None:
        if self.session_open:
            self.session_open = False
            await asyncio.to_thread(self.client.end_weight_update)

    async def update_weight(self, name: str, dtype: Any, shape: Any, empty_cache: bool = False) -> None:
        """Receive one parameter the learner broadcasts over the group, and load it.

        OpenRLHF calls this for every parameter in turn and sets ``empty_cache`` on the last, so
        the first call opens SGLang's update session and the last one closes it (and flushes).
        """
        if self.group_name is None:
            raise RuntimeError("update_weight before init_process_group: the engine has no weight-sync group")
        await self._open_session()
        try:
            await asyncio.to_thread(
                self.client.update_weights_from_distributed,
                names=[name],
                dtypes=[str(dtype).removeprefix("torch.")],
                shapes=[list(shape)],
                group_name=self.group_name,
                flush_cache=bool(empty_cache),
            )
        except BaseException:
            await self._close_session()  # SGLang refuses a new session while one is open
            raise
        if empty_cache:
            await self._close_session()

    async def update_weight_cuda_ipc(
        self, name: str, dtype: Any, shape: Any, ipc_handles: dict[str, Any], empty_cache: bool = False
    ) -> None:
        """A colocated learner's parameter, by CUDA IPC handle (``/update_weights_from_tensor``).

        ``ipc_handles`` maps a GPU's UUID to torch's ``(rebuild_cuda_tensor, args)``; each tensor
        parallel rank gets the handle of its own GPU, passed unopened (SGLang opens it on the GPU
        it names), so the engine's GPUs must be the learner's, in the same order.
        """
        await self._open_session()
        try:
            payloads = [_ipc_payload(name, handle) for handle in _ordered_handles(ipc_handles, self.tp_size)]
            await asyncio.to_thread(
                self.client.update_weights_from_serialized, payloads, flush_cache=bool(empty_cache)
            )
        except BaseException:
            await self._close_session()
            raise
        if empty_cache:
            await self._close_session()

    async def reset_prefix_cache(self) -> None:
        """Flush the server's cache (SGLang refuses while requests run; OpenRLHF flushes between them)."""
        await asyncio.to_thread(self.client.flush_cache)

    # ------------------------------------------------------------------ pause, sleep
    async def pause_generation(self) -> None:
        """Hold generation for a weight sync; running requests are retracted, not aborted."""
        await asyncio.to_thread(self.client.pause_generation, mode="retract")

    async def resume_generation(self) -> None:
        """Let held requests go on (with the new weights)."""
        await asyncio.to_thread(self.client.continue_generation)

    async def sleep(self, level: int = 1) -> None:
        """Release the GPU memory still held (weights are kept on the CPU)."""
        tags = [t for t in MEMORY_TAGS if t not in self.released]
        if tags:
            await asyncio.to_thread(self.client.release_memory_occupation, tags)
            self.released.update(tags)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back released memory: ``None`` all of it, ``["weights"]`` or ``["kv_cache"]``.

        Only released tags are resumed (SGLang's scheduler dies on resuming one that is not); the
        KV cache comes back with its CUDA graphs, as vLLM's does.
        """
        wanted = set(MEMORY_TAGS) if tags is None else set(tags)
        if "kv_cache" in wanted:
            wanted.add("cuda_graph")
        resume = [t for t in MEMORY_TAGS if t in wanted and t in self.released]
        if resume:
            await asyncio.to_thread(self.client.resume_memory_occupation, resume)
            self.released.difference_update(resume)

    async def server_info(self) -> dict[str, Any]:
        """The rollout server's ``/server_info`` (srt-agent's: tokens, forwards, drafted, accepted)."""
        return await asyncio.to_thread(self.client.server_info)

    # ------------------------------------------------------------------ generation
    def get_num_unfinished_requests(self) -> int:
        """Requests in flight (OpenRLHF balances prompts over engines by this)."""
        return self.unfinished

    async def generate(
        self,
        prompt_token_ids: list[int],
        sampling_params: Any,
        multi_modal_data: Any = None,
        *,
        task_id: str = "",
    ) -> RequestOutput:
        """One completion, as vLLM's ``RequestOutput`` (OpenRLHF's executors call this in-process).

        Raises:
            ValueError: ``multi_modal_data`` (images are not supported by this engine).
            EngineServerLost: The server died and could not be restarted.
        """
        if multi_modal_data:
            raise ValueError("SGLangRolloutEngine serves text models; images are not supported")
        request = GenerationRequest(
            request_id=f"openrlhf-{next(self._request_ids)}",  # unique while in flight, as SGLang needs
            prompt_ids=tuple(int(t) for t in prompt_token_ids),
            params=_sampling(sampling_params, len(prompt_token_ids), self.max_context, self.eos_token_ids),
            task_id=task_id,
        )
        out = await self.agenerate(request)
        wants_logprobs = getattr(sampling_params, "logprobs", None) is not None
        tokens = list(out.token_ids)
        skip_special = bool(getattr(sampling_params, "skip_special_tokens", True))
        return RequestOutput(
            [
                CompletionOutput(
                    token_ids=tokens,
                    text=self._decode(tokens, skip_special),
                    finish_reason=out.finish_reason,
                    logprobs=[{t: Logprob(lp)} for t, lp in zip(tokens, out.logprobs, strict=True)]
                    if wants_logprobs
                    else None,
                )
            ]
        )

    def _decode(self, tokens: list[int], skip_special: bool) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model)
        return str(self._tokenizer.decode(tokens, skip_special_tokens=skip_special))

    async def agenerate(self, request: GenerationRequest) -> GenerationOutput:
        """srt-agent's engine protocol (the srt executor plays episodes through it, with task ids).

        A server that died is restarted once and the request sent again (it carries its seed): a
        finished sample is never lost to a later crash, and the rollout goes on.
        """
        self.unfinished += 1
        try:
            try:
                return await self.client.agenerate(request)
            except EngineConnectionError:
                if self.process is None:  # not our server: nothing to restart
                    raise
                async with self._restarting:  # one restart, however many requests saw the death
                    await asyncio.to_thread(self._restart)
                return await self.client.agenerate(request)
        finally:
            self.unfinished -= 1

    def _restart(self) -> None:
        """Restart the server this engine started, if it is dead.

        Raises:
            EngineServerLost: It could not be restarted.
        """
        if self.process is None or self.process.alive():
            return
        log.warning("rollout server at %s died; restarting it: %s", self.url, self.process.tail(500))
        try:
            self.process.start(self.start_timeout_s)
        except SrtAgentError as exc:
            raise EngineServerLost(
                f"the rollout server at {self.url} died and did not restart: {exc}"
            ) from exc
        self.released.clear()  # a fresh server holds all its memory
        self.session_open = False

    async def generate_responses(
        self,
        prompt: str,
        label: str,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        num_samples: int = 1,
        images: Any = None,
    ) -> list[dict[str, Any]]:
        """``num_samples`` samples of one prompt through OpenRLHF's agent executor (as vLLM's engine does)."""
        executor = self._agent_executor()
        return list(
            await asyncio.gather(
                *(
                    executor.execute(
                        prompt=prompt,
                        label=label,
                        sampling_params=sampling_params,
                        max_length=max_length,
                        hf_tokenizer=hf_tokenizer,
                        llm_engine=self,
                        images=images,
                    )
                    for _ in range(num_samples)
                )
            )
        )

    def _agent_executor(self) -> Any:
        """OpenRLHF's executor: the ``AgentExecutor`` of ``agent_func_path``, or its single-turn one."""
        if self._executor is None:
            if self.agent_func_path:
                spec = importlib.util.spec_from_file_location("srt_openrlhf_agent", self.agent_func_path)
                if spec is None or spec.loader is None:
                    raise ValueError(f"cannot load the agent file {self.agent_func_path!r}")
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                self._executor = module.AgentExecutor()
            else:
                from openrlhf.utils.agent import SingleTurnAgentExecutor

                self._executor = SingleTurnAgentExecutor(self.remote_rm_url)
        return self._executor

    def close(self) -> None:
        """Close the client and stop the server this engine started."""
        self.client.close()
        if self.process is not None:
            self.process.stop()


def _ordered_handles(ipc_handles: dict[str, Any], tp_size: int) -> list[Any]:
    """One handle per tensor-parallel rank, in the order of the GPUs the learner listed."""
    handles = list(ipc_handles.items())
    if len(handles) < tp_size:
        raise ValueError(f"{len(handles)} CUDA IPC handles for {tp_size} tensor-parallel ranks")
    return [(uuid, handle) for uuid, handle in handles[:tp_size]]


class _Rebuild:
    """Pickles as torch's ``rebuild_cuda_tensor`` call, the device given by GPU UUID (SGLang's rule)."""

    def __init__(self, uuid: str, handle: Any) -> None:
        self.fn, args = handle
        self.args = list(args)
        self.args[6] = uuid  # SGLang maps a UUID string to its local device index

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, tuple(self.args)


def _ipc_payload(name: str, rank_handle: tuple[str, Any]) -> str:
    """``/update_weights_from_tensor``'s per-rank payload: ``[(name, tensor)]`` pickled, in base64."""
    from multiprocessing.reduction import ForkingPickler

    uuid, handle = rank_handle
    data = ForkingPickler.dumps([(name, _Rebuild(uuid, handle))], protocol=pickle.HIGHEST_PROTOCOL)
    return base64.b64encode(bytes(data)).decode()


def create_sglang_engines(
    num_engines: int,
    tensor_parallel_size: int,
    pretrain: str,
    seed: int,
    full_determinism: bool,
    enable_prefix_caching: bool,
    enforce_eager: bool,
    max_model_len: int,
    shared_pg: Any = None,
    gpu_memory_utilization: float | None = None,
    vllm_enable_sleep: bool = False,
    logprobs_mode: str | None = None,
    agent_func_path: str | None = None,
    remote_rm_url: str | None = None,
    max_images_per_prompt: int = 0,
    *,
    server: str | None = None,
    num_gpus_per_engine: float | None = None,
    extra_server_args: Sequence[str] = (),
) -> list[Any]:
    """OpenRLHF's ``create_vllm_engines``, with SGLang engines: the same arguments, Ray actor handles.

    Placement: without ``shared_pg``, a placement group of one bundle per engine holding all its
    GPUs, the engine's actor taking them, so Ray's ``CUDA_VISIBLE_DEVICES`` for the actor (which
    its server inherits) names exactly the engine's ``tensor_parallel_size`` GPUs. (OpenRLHF's vLLM
    engines use one bundle per GPU instead and let vLLM's Ray executor spread the ranks; an SGLang
    server is one process tree that needs its GPUs visible at launch.) With the learner's
    ``shared_pg`` (colocated), each engine shares a bundle's GPU (``num_gpus_per_engine``,
    default 0.2) and must have ``tensor_parallel_size`` 1. ``extra_server_args`` go to every
    engine's server command (e.g. ``["--config", spec_file]`` for srt-agent's server). With
    ``vllm_enable_sleep`` the engines are asleep when this returns (as OpenRLHF's are), so the
    learner's models can load.

    Raises:
        ValueError: Images (``max_images_per_prompt``), which these engines do not serve, or
            tensor-parallel engines in a shared placement group.
    """
    import ray

    if max_images_per_prompt:
        raise ValueError("SGLang rollout engines serve text models; max_images_per_prompt must be 0")
    server = server or os.environ.get("SRT_ROLLOUT_SERVER", "sglang")
    del full_determinism, enable_prefix_caching, logprobs_mode  # SGLang's radix cache is always on
    placements = engine_placements(num_engines, tensor_parallel_size, shared_pg, num_gpus_per_engine)
    actor: Any = ray.remote(SGLangRolloutEngine)
    engines = []
    for i, options in enumerate(placements):
        engines.append(
            actor.options(**options).remote(
                pretrain,
                server=server,
                tensor_parallel_size=tensor_parallel_size,
                seed=seed + i,
                max_model_len=max_model_len,
                enforce_eager=enforce_eager,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep=vllm_enable_sleep,
                agent_func_path=agent_func_path,
                remote_rm_url=remote_rm_url,
                extra_server_args=tuple(extra_server_args),
            )
        )
    if vllm_enable_sleep:
        ray.get([e.sleep.remote() for e in engines])
    return engines


def engine_placements(
    num_engines: int,
    tensor_parallel_size: int,
    shared_pg: Any = None,
    num_gpus_per_engine: float | None = None,
) -> list[dict[str, Any]]:
    """The Ray actor options of each engine (see :func:`create_sglang_engines` for the layout).

    ``num_gpus_per_engine`` 0 places CPU engines (``srt-agent serve``) with no placement group.

    Raises:
        ValueError: ``tensor_parallel_size`` > 1 with a shared placement group, or sizes below 1.
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if num_engines < 1 or tensor_parallel_size < 1:
        raise ValueError(
            f"num_engines and tensor_parallel_size must be >= 1, got {num_engines}, {tensor_parallel_size}"
        )
    if shared_pg is not None:
        if tensor_parallel_size != 1:
            raise ValueError(
                "colocated SGLang engines (a shared placement group) take one GPU each: "
                f"tensor_parallel_size is {tensor_parallel_size}; use 1, or drop --train.colocate_all"
            )
        share = 0.2 if num_gpus_per_engine is None else num_gpus_per_engine
        return [
            {
                "num_cpus": share,
                "num_gpus": share,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=shared_pg,
                    placement_group_capture_child_tasks=True,
                    placement_group_bundle_index=i,
                ),
            }
            for i in range(num_engines)
        ]
    per_gpu = 1.0 if num_gpus_per_engine is None else num_gpus_per_engine
    if per_gpu <= 0:
        return [{"num_cpus": 0, "num_gpus": 0} for _ in range(num_engines)]
    gpus = per_gpu * tensor_parallel_size
    pg = placement_group([{"GPU": gpus, "CPU": 1}] * num_engines, strategy="PACK")
    ray.get(pg.ready())
    return [
        {
            "num_cpus": 1,
            "num_gpus": gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_capture_child_tasks=True, placement_group_bundle_index=i
            ),
        }
        for i in range(num_engines)
    ]
