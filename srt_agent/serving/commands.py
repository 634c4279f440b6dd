"""``srt-agent serve``: the embedded engine, with its tree cache, behind SGLang's native API."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from srt_agent.serving.server import MAX_BODY_BYTES, MAX_CONNECTIONS, REQUEST_TIMEOUT_S, EngineServer

if TYPE_CHECKING:
    from srt_agent.engine.speculation.spec_config import SpecConfig
    from srt_agent.tree_cache import TreeCacheConfig

__all__ = ["serve"]


def serve(
    model_dir: Path,
    *,
    host: str,
    port: int,
    spec: bool,
    max_batch: int,
    device: str,
    seed: int | None,
    threads: int | None,
    console: Console,
    cache: TreeCacheConfig | None = None,
    spec_config: SpecConfig | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_connections: int = MAX_CONNECTIONS,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> None:
    """Load the model and answer requests until Ctrl-C (what ``srt-agent serve`` runs).

    Args:
        model_dir: The HF model directory.
        host: Interface to listen on.
        port: TCP port (0: any free one; the URL is printed).
        spec: Draft from a tree cache of everything this server generates (SRT).
        max_batch: Sequences decoding at once.
        device: ``cpu`` or ``cuda``.
        seed: The engine's seed for requests without ``sampling_seed``.
        threads: Torch CPU threads.
        console: Where the banner goes.
        cache: The tree cache's settings (a run config's ``spec.cache``; default: the defaults).
        spec_config: The engine's speculation settings (a run config's ``spec``).
        max_body_bytes: Largest request body read (a longer one is answered 413 unread).
        max_connections: Connections open at once (requests on more are answered 503).
        request_timeout_s: How long a request may take to arrive whole (then 408).
    """
    from srt_agent.devices import resolve_device
    from srt_agent.engine.torch_engine import TorchEngine
    from srt_agent.tree_cache import TreeCache

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # With `spec.enabled: false` nothing would ever be drafted: no tree cache, and the server says
    # "SRT off" (in its banner and /get_server_info) rather than claiming speculation.
    spec = spec and (spec_config is None or spec_config.enabled)
    engine = TorchEngine(
        model_dir,
        max_batch_size=max_batch,
        draft_source=TreeCache(cache) if spec else None,
        spec=spec_config,
        device=resolve_device(device),
        seed=seed,
        num_threads=threads,
    )
    server = EngineServer(
        engine,
        model_dir,
        host=host,
        port=port,
        speculative=spec,
        max_body_bytes=max_body_bytes,
        max_connections=max_connections,
        request_timeout_s=request_timeout_s,
    )
    console.print(
        f"serving {model_dir} at [bold]{server.url}[/bold] (SGLang native API: POST /generate; "
        f"SRT {'on' if spec else 'off'}, batch {max_batch}, {device}); Ctrl-C stops"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        server.close()
