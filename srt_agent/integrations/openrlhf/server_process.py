"""A rollout server in a child process: started, waited for, watched and stopped.

OpenRLHF's rollout engines are long-lived actors; each one here owns a server process: SGLang with
SRT drafting (``srt-agent sglang-serve``) on GPUs, or ``srt-agent serve`` (the embedded engine
behind SGLang's API) where SGLang cannot run. The command is the caller's; this module only runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from srt_agent.errors import SrtAgentError

__all__ = ["ServerProcess", "ServerStartError", "free_port", "server_args"]


class ServerStartError(SrtAgentError, RuntimeError):
    """The rollout server did not come up (the message has the end of its log)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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


class ServerProcess:
    """A server process and its log file.

    Args:
        command: What starts it (see :func:`server_args`).
        url: Where it answers once up (``http://host:port``).
        log_path: Its stdout and stderr (kept for the error message when it dies).
        env: Extra environment variables.
    """

    def __init__(
        self, command: Sequence[str], url: str, log_path: str | Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.command, self.url, self.log_path = list(command), url, Path(log_path)
        self.env = {**os.environ, **dict(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 600.0) -> None:
        """Start the process and wait until ``/health`` answers.

        Raises:
            ServerStartError: It exited, or did not answer within ``timeout_s`` (then it is stopped).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"the rollout server exited with code {self.proc.returncode}: {self.tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise ServerStartError(f"the rollout server did not answer within {timeout_s:g} s: {self.tail()}")

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def tail(self, chars: int = 2000) -> str:
        """The end of the server's log, for error messages."""
        try:
            text = self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return text.strip() or "(empty log)"

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
