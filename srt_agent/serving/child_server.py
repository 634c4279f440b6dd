"""A local HTTP server in a child process: started, waited for (``/health``), watched and stopped.

Used for the rollout servers of OpenRLHF's engines (``srt-agent serve``, SGLang) and for the
OpenEnv servers srt-agent starts; the command is the caller's, this module only runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import tenacity

from srt_agent.errors import SrtAgentError

__all__ = ["ServerProcess", "ServerStartError", "free_port"]


class ServerStartError(SrtAgentError, RuntimeError):
    """A server did not come up (the message has the end of its log)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server process and its log file.

    Args:
        command: What starts it.
        url: Where it answers once up (``http://host:port``).
        log_path: Its stdout and stderr (kept for the error message when it dies).
        env: Extra environment variables.
        name: What error messages call it (``"the rollout server"``).
    """

    def __init__(
        self,
        command: Sequence[str],
        url: str,
        log_path: str | Path,
        env: Mapping[str, str] | None = None,
        *,
        name: str = "the server",
    ) -> None:
        self.command, self.url, self.log_path = list(command), url, Path(log_path)
        self.env = {**os.environ, **dict(env or {})}
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 600.0) -> None:
        """Start the process and wait until ``/health`` answers.

        Raises:
            ServerStartError: It exited, or did not answer within ``timeout_s`` (then it is stopped).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            proc = self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )

        def healthy() -> bool:
            if proc.poll() is not None:  # not retried: a dead server does not come up
                raise ServerStartError(f"{self.name} exited with code {proc.returncode}: {self.tail()}")
            try:
                return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        polling = tenacity.Retrying(
            stop=tenacity.stop_after_delay(timeout_s),
            wait=tenacity.wait_fixed(0.25),
            retry=tenacity.retry_if_result(lambda ok: not ok),
        )
        try:
            polling(healthy)
        except tenacity.RetryError:
            self.stop()
            raise ServerStartError(
                f"{self.name} did not answer within {timeout_s:g} s: {self.tail()}"
            ) from None

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def tail(self, chars: int = 2000) -> str:
        """The end of the server's log on one line (its lines joined by `` | ``), for error messages."""
        try:
            text = self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        return " | ".join(lines[-12:]) or "(empty log)"

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
