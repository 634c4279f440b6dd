"""The command of a rollout server, run in a child process (:class:`ServerProcess`).

OpenRLHF's rollout engines are long-lived actors; each one here owns a server process: SGLang with
SRT drafting (``srt-agent sglang-serve``) on GPUs, or ``srt-agent serve`` (the embedded engine
behind SGLang's API) where SGLang cannot run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from srt_agent.serving.child_server import ServerProcess, ServerStartError, free_port

__all__ = ["ServerProcess", "ServerStartError", "free_port", "server_args"]


def server_args(
    kind: str,
    model: str,
    *,
    host: str,
    port: int,
    tensor_parallel_size: int = 1,
    seed: int = 0,
    max_model_len: int | None = None,
    enforce_eager: bool = False,
    gpu_memory_utilization: float | None = None,
    enable_sleep: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command that starts one rollout server.

    Args:
        kind: ``"sglang"`` (SGLang with SRT: ``srt-agent sglang-serve``, GPUs) or ``"srt"``
            (``srt-agent serve``: the embedded engine with SGLang's API; CPU, tests).
        model: The model directory.
        host: Interface to listen on.
        port: TCP port.
        tensor_parallel_size: SGLang's ``--tp-size``.
        seed: SGLang's ``--random-seed`` (``srt``: the seed of requests without one).
        max_model_len: SGLang's ``--context-length``.
        enforce_eager: SGLang's ``--disable-cuda-graph``.
        gpu_memory_utilization: SGLang's ``--mem-fraction-static``.
        enable_sleep: SGLang's ``--enable-memory-saver --enable-weights-cpu-backup``: OpenRLHF puts
            engines to sleep before the first rollout, which runs on the initial weights, so they
            must survive a release.
        extra: More flags, passed through.

    Raises:
        ValueError: An unknown ``kind``, or ``srt`` with ``tensor_parallel_size`` > 1.
    """
    cli = [sys.executable, "-m", "srt_agent.cli"]
    if kind == "srt":
        if tensor_parallel_size != 1:
            raise ValueError(f"the srt server runs one process; tensor_parallel_size {tensor_parallel_size}")
        return [
            *cli,
            "serve",
            "--model",
            model,
            "--host",
            host,
            "--port",
            str(port),
            "--seed",
            str(seed),
            *extra,
        ]
    if kind != "sglang":
        raise ValueError(f"server kind {kind!r}: use 'sglang' (GPUs) or 'srt' (CPU)")
    cmd = [*cli, "sglang-serve", "--model", model, "--host", host, "--port", str(port), "--"]
    cmd += ["--tp-size", str(tensor_parallel_size), "--random-seed", str(seed), "--dtype", "bfloat16"]
    cmd += ["--trust-remote-code"]
    if max_model_len:
        cmd += ["--context-length", str(max_model_len)]
    if enforce_eager:
        cmd += ["--disable-cuda-graph"]
    if gpu_memory_utilization:
        cmd += ["--mem-fraction-static", str(gpu_memory_utilization)]
    if enable_sleep:
        cmd += ["--enable-memory-saver", "--enable-weights-cpu-backup"]
    return [*cmd, *extra]
