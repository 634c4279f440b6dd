"""``srt-agent serve``: an srt-agent engine behind SGLang's native HTTP API.

The embedded :class:`~srt_agent.engine.torch_engine.TorchEngine` (with its tree cache, so SRT
drafts for every client) answers the endpoints a rollout client needs, with SGLang's paths and
JSON (:mod:`srt_agent.serving.wire`): ``POST /generate`` (one request or a batch; concurrent
requests join the engine's running batch), ``GET /health``, ``GET /health_generate``,
``GET /model_info``, ``GET /server_info`` (and their older ``/get_*`` names),
``POST /update_weights_from_disk``, ``GET|POST /flush_cache``. Memory release and tensor weight
updates are SGLang features this engine lacks; they answer 501 with the alternative. Errors are
``{"error": {"message": ...}}`` with status 400 (a bad request), 404, 501 or 500, as SGLang's are.

It is a threaded standard-library server, for one machine: a rollout client, tests of the
SGLang client without a GPU, or the embedded engine as a service. It streams (``"stream": true``)
one event with the whole answer, then ``data: [DONE]``, since the engine hands out whole outputs.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srt_agent.errors import describe_fault
from srt_agent.serving.wire import WireError, batch_shape, output_to_wire, requests_from_wire

if TYPE_CHECKING:
    from srt_agent.engine.torch_engine import TorchEngine

__all__ = ["EngineServer"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 2**20
"""Largest request body read (a batch of long prompts fits; a runaway client does not)."""


class _HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class EngineServer:
    """An engine served over SGLang's native API on ``host:port`` (port 0: any free port).

    Args:
        engine: The engine; closed by :meth:`close`.
        model_dir: The model it was loaded from (reported by ``/get_model_info``).
        host: Interface to listen on (``127.0.0.1`` by default: the API has no authentication).
        port: TCP port; 0 picks a free one (see :attr:`url`).
        speculative: Whether the engine drafts (reported, and ``spec_verify_ct`` in answers).
    """

    def __init__(
        self,
        engine: TorchEngine,
        model_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 30000,
        speculative: bool = False,
    ) -> None:
        self.engine = engine
        self.model_dir = Path(model_dir)
        self.speculative = speculative
        self.started = time.time()
        self._ids = itertools.count()
        self._updating = threading.Lock()  # one weight update at a time
        self._routes = self._route_table()
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def serve_forever(self) -> None:
        """Answer requests until :meth:`shutdown` (from another thread) or Ctrl-C."""
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> EngineServer:
        """Serve from a background thread (tests, notebooks); returns ``self``."""
        self._thread = threading.Thread(target=self.serve_forever, name="srt-serve", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, then close the engine."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        self.engine.close()

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ endpoints
    def _route_table(self) -> dict[tuple[str, str], Callable[[Any], tuple[HTTPStatus, Any]]]:
        return {
            ("POST", "/generate"): self._generate,
            ("GET", "/health"): lambda _: (HTTPStatus.OK, None),
            ("GET", "/health_generate"): self._health_generate,
            ("GET", "/model_info"): self._model_info,
            ("GET", "/get_model_info"): self._model_info,  # SGLang's older name, still served
            ("GET", "/server_info"): self._server_info,
            ("GET", "/get_server_info"): self._server_info,
            ("POST", "/update_weights_from_disk"): self._update_from_disk,
            ("GET", "/flush_cache"): self._flush,
            ("POST", "/flush_cache"): self._flush,
            ("POST", "/update_weights_from_tensor"): self._unsupported(
                "tensor weight updates need SGLang's colocated engine; use /update_weights_from_disk"
            ),
            ("POST", "/release_memory_occupation"): self._unsupported(
                "the embedded engine keeps its memory; stop the server to free it"
            ),
            ("POST", "/resume_memory_occupation"): self._unsupported(
                "the embedded engine keeps its memory; stop the server to free it"
            ),
        }

    def _generate(self, body: Any) -> tuple[HTTPStatus, Any]:
        try:
            requests = requests_from_wire(body, lambda: f"srt-serve-{next(self._ids)}")
        except WireError as exc:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        try:
            outputs = self.engine.generate(requests)
        except ValueError as exc:  # too long a prompt, a duplicate rid: the client's to fix
            raise _HTTPError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        tokenizer = self.engine.tokenizer
        answers = []
        for req, out in zip(requests, outputs, strict=True):
            text = tokenizer.decode(list(out.token_ids)) if tokenizer is not None else None
            answers.append(
                output_to_wire(
                    out,
                    len(req.prompt_ids),
                    text=text if isinstance(text, str) else None,
                    speculative=self.speculative,
                )
            )
        return HTTPStatus.OK, answers if batch_shape(body) else answers[0]

    def _health_generate(self, _: Any) -> tuple[HTTPStatus, Any]:
        from srt_agent.contracts.generation import GenerationRequest, SamplingParams

        req = GenerationRequest(f"srt-health-{next(self._ids)}", (0,), SamplingParams(max_new_tokens=1))
        out = self.engine.generate([req])[0]
        if out.finish_reason == "abort":
            raise _HTTPError(HTTPStatus.SERVICE_UNAVAILABLE, out.error or "generation failed")
        return HTTPStatus.OK, None

    def _model_info(self, _: Any) -> tuple[HTTPStatus, Any]:
        return HTTPStatus.OK, {
            "model_path": str(self.model_dir),
            "tokenizer_path": str(self.model_dir),
            "is_generation": True,
            "max_context": self.engine.max_context,
        }

    def _server_info(self, _: Any) -> tuple[HTTPStatus, Any]:
        from srt_agent import __version__

        stats = self.engine.spec_stats()
        return HTTPStatus.OK, {
            "version": f"srt-agent {__version__}",
            "model_path": str(self.model_dir),
            "context_length": self.engine.max_context,
            "speculative_algorithm": "SRT" if self.speculative else None,
            "uptime_s": round(time.time() - self.started, 3),
            "tokens": stats.tokens,
            "row_steps": stats.row_steps,
        }

    def _update_from_disk(self, body: Any) -> tuple[HTTPStatus, Any]:
        from srt_agent.engine.hf_checkpoint import CheckpointError, read_state_dict

        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "model_path (a checkpoint directory) is required")
        with self._updating:
            try:
                self.engine.update_weights(read_state_dict(path))
            except (CheckpointError, OSError) as exc:
                return HTTPStatus.BAD_REQUEST, {"success": False, "message": describe_fault(exc)}
            if body.get("flush_cache", True):
                self.engine.flush_cache()
        # The tree cache is kept: earlier rollouts stay valid drafts (verification keeps exactness).
        return HTTPStatus.OK, {"success": True, "message": f"loaded {path}", "num_paused_requests": 0}

    def _flush(self, _: Any) -> tuple[HTTPStatus, Any]:
        self.engine.flush_cache()
        return HTTPStatus.OK, "Cache flushed."

    @staticmethod
    def _unsupported(why: str) -> Callable[[Any], tuple[HTTPStatus, Any]]:
        def answer(_: Any) -> tuple[HTTPStatus, Any]:
            raise _HTTPError(HTTPStatus.NOT_IMPLEMENTED, why)

        return answer

    # ------------------------------------------------------------------ HTTP plumbing
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: clients pool connections

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _dispatch(self, method: str) -> None:
                path = self.path.split("?", 1)[0]
                stream = False
                try:
                    body = self._body()
                    stream = isinstance(body, dict) and body.get("stream") is True
                    route = server._routes.get((method, path))
                    if route is None:
                        known = any(p == path for _, p in server._routes)
                        status = HTTPStatus.METHOD_NOT_ALLOWED if known else HTTPStatus.NOT_FOUND
                        raise _HTTPError(status, f"{method} {path} is not served here")
                    status, payload = route(body)
                except _HTTPError as exc:
                    status, payload, stream = exc.status, {"error": {"message": str(exc)}}, False
                except Exception as exc:  # a bug here must not kill the server thread
                    log.exception("%s %s failed", method, path)
                    status, payload, stream = (
                        HTTPStatus.INTERNAL_SERVER_ERROR,
                        {"error": {"message": describe_fault(exc)}},
                        False,
                    )
                self._answer(status, payload, stream)

            def _body(self) -> Any:
                size = int(self.headers.get("Content-Length") or 0)
                if size > MAX_BODY_BYTES:
                    raise _HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
                if not size:
                    return {}
                try:
                    return json.loads(self.rfile.read(size))
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise _HTTPError(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}") from None

            def _answer(self, status: HTTPStatus, payload: Any, stream: bool) -> None:
                if stream:
                    data = f"data: {json.dumps(payload)}\n\ndata: [DONE]\n\n".encode()
                    kind = "text/event-stream"
                elif isinstance(payload, str):
                    data, kind = payload.encode(), "text/plain; charset=utf-8"
                elif payload is None:
                    data, kind = b"", "text/plain; charset=utf-8"
                else:
                    data, kind = json.dumps(payload).encode(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
