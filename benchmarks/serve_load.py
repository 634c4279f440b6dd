"""Load benchmark of ``srt-agent serve``: requests per second and latency at 1, 16 and 256 clients.

Starts ``srt-agent serve`` as a child process (so the clients do not share its interpreter), waits
for ``/health``, then for each client count runs that many concurrent clients, each sending
``/generate`` requests back to back (a short prompt, a few greedy tokens, no speculation: the
server stack's cost, not the model's, is what varies) for ``--seconds``. A request counts when it
answered 200; anything else is an error (a 503 above the server's connection limit included).

Reported per client count ``c``: ``rps_c{c}`` (answered requests per second), ``p50_ms_c{c}`` and
``p99_ms_c{c}`` (latency of answered requests), ``errors_c{c}``, and the settings. The model is a
random one of the embedded model's shape unless ``--model`` is given; ``--url`` measures a
running server instead of starting one.

Run: ``python benchmarks/serve_load.py [--clients 1 16 256] [--seconds 10] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from srt_agent.integrations.openrlhf.server_process import free_port
from srt_agent.speed.random_model import SHAPES, save_random_model


async def _client(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], until: float, latencies: list[float]
) -> int:
    """Send requests back to back until ``until``; record answered ones' latency; return errors."""
    errors = 0
    while time.perf_counter() < until:
        start = time.perf_counter()
        try:
            answer = await http.post(f"{url}/generate", json=body)
        except httpx.HTTPError:
            errors += 1
            await asyncio.sleep(0.01)  # a refused connection: do not spin
            continue
        if answer.status_code == 200:
            latencies.append(time.perf_counter() - start)
        else:
            errors += 1
    return errors


async def _load(url: str, clients: int, seconds: float, new_tokens: int) -> dict[str, float]:
    """One measurement: ``clients`` concurrent clients for ``seconds``."""
    body = {
        "input_ids": [5, 6, 7, 8],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens},
    }
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as http:
        start = time.perf_counter()
        until = start + seconds
        errors = await asyncio.gather(*(_client(http, url, body, until, latencies) for _ in range(clients)))
        elapsed = time.perf_counter() - start
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else 0.0
    return {
        f"rps_c{clients}": round(len(ms) / elapsed, 1),
        f"p50_ms_c{clients}": round(statistics.median(ms), 2) if ms else 0.0,
        f"p99_ms_c{clients}": round(p99, 2),
        f"errors_c{clients}": float(sum(errors)),
    }


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"srt-agent serve exited with {process.returncode} before answering")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"srt-agent serve did not answer {url}/health in {timeout_s:.0f} s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server (unless ``--url``), measure every client count, stop it."""
    record: dict[str, Any] = {"seconds": args.seconds, "new_tokens": args.new_tokens}
    process: subprocess.Popen[bytes] | None = None
    url = args.url
    with tempfile.TemporaryDirectory() as tmp:
        if url is None:
            model = args.model or save_random_model(Path(tmp) / "model", **SHAPES["embedded"])
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, "-m", "srt_agent.cli", "serve", "--model", str(model), "--port", str(port)]
            cmd += ["--no-spec", "--threads", "1", "--max-batch", str(args.max_batch)]
            log = open(Path(tmp) / "serve.log", "wb")  # noqa: SIM115 (closed with the process)
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            if process is not None:
                _wait_healthy(url, process)
            asyncio.run(_load(url, 1, min(args.seconds, 2.0), args.new_tokens))  # warm-up, untimed
            for clients in args.clients:
                figures = asyncio.run(_load(url, clients, args.seconds, args.new_tokens))
                record.update(figures)
                rps, p50, p99 = (figures[f"{k}_c{clients}"] for k in ("rps", "p50_ms", "p99_ms"))
                errors = int(figures[f"errors_c{clients}"])
                line = f"{clients:>4} clients: {rps:8.1f} req/s  p50 {p50:8.2f} ms  p99 {p99:8.2f} ms"
                print(f"{line}  errors {errors}")
        finally:
            if process is not None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                log.close()
    return record


def main() -> None:
    """Parse arguments, run, print and write the JSON record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 256], help="Concurrent clients.")
    parser.add_argument("--seconds", type=float, default=10.0, help="Duration of each measurement.")
    parser.add_argument("--new-tokens", type=int, default=4, help="Tokens generated per request.")
    parser.add_argument("--max-batch", type=int, default=32, help="The server's --max-batch.")
    parser.add_argument(
        "--model", type=Path, default=None, help="HF model dir (default: random, embedded shape)."
    )
    parser.add_argument("--url", default=None, help="Measure this running server instead of starting one.")
    parser.add_argument("--json", type=Path, default=None, help="Write the figures here (one flat object).")
    args = parser.parse_args()
    record = run(args)
    print(json.dumps(record, sort_keys=True))
    if args.json is not None:
        args.json.write_text(json.dumps(record, sort_keys=True, indent=1) + "\n")


if __name__ == "__main__":
    main()
