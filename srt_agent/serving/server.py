"""``srt-agent serve``: an srt-agent engine behind SGLang's native HTTP API.

The embedded :class:`~srt_agent.engine.torch_engine.TorchEngine` (with its tree cache, so SRT
drafts for every client) answers the endpoints a rollout client needs, with SGLang's paths and
JSON (:mod:`srt_agent.serving.wire`): ``POST /generate`` (one request or a batch; concurrent
requests join the engine's running batch), ``GET /health``, ``GET /health_generate``,
``GET /model_info``, ``GET /server_info`` (and their older ``/get_*`` names),
``POST /update_weights_from_disk``, ``GET|POST /flush_cache``. Errors are
``{"error": {"message": ...}}`` with status 400 (a bad request), 404, 501 or 500, as SGLang's are.

It also follows SGLang 0.5.23's RL weight-sync protocol, rules included, so that a rollout engine
written for SGLang can be tested against it on a CPU:

* ``POST /init_weights_update_group`` joins the learner's process group
  (:func:`~srt_agent.serving.weight_sync.init_custom_process_group`, rank ``rank_offset``); it
  answers once every rank has joined. ``POST /destroy_weights_update_group`` leaves it.
* ``POST /begin_weight_update`` and ``POST /end_weight_update`` bracket a session; weight updates
  outside one fail, and so do a second begin and an end without a begin.
* ``POST /update_weights_from_distributed`` receives the named tensors over the group (one
  broadcast from rank 0 each, in list order, or one ``flattened_bucket``) and loads them; with
  ``flush_cache`` it then flushes, which fails (``success: false``, the weights are loaded) while
  requests are running, unless generation is paused in ``retract`` mode.
* ``POST /update_weights_from_tensor`` obeys the session rules, then refuses (501): its CUDA IPC
  handles cannot be opened by this server.
* Unless generation is paused, a weight update or session call waits for the ``/generate`` calls in
  flight to finish, and new ones wait for it (SGLang's model-update reader/writer lock).
* ``POST /pause_generation`` (``mode``: ``abort``, the default, ``retract`` or ``in_place``) holds
  new ``/generate`` calls until ``POST /continue_generation``; ``abort`` also aborts the running
  requests (their answers come back with ``finish_reason`` ``abort``) and answers once they have.
* ``GET|POST /release_memory_occupation`` and ``/resume_memory_occupation`` (``tags``: null, which
  means all, or a list of ``weights``, ``kv_cache``, ``cuda_graph``) keep SGLang's bookkeeping:
  release requires an idle server (or a ``retract`` pause), resuming a tag that is not released is
  refused. Nothing is freed (the weights stay, as with ``--enable-weights-cpu-backup``; releasing
  ``kv_cache`` flushes the prefix cache), but ``/generate`` fails while any tag is released.

Where SGLang's scheduler would die (an assertion, a ``KeyError``), this server answers 400 and
says so. Differences from SGLang: ``retract`` and ``in_place`` pauses hold new requests only; the
running ones go on to their end (SGLang stalls them, and after a ``retract`` recomputes their
cache with the new weights), so a weight update can reach them between two steps. A ``retract``
pause counts as idle for flushes and memory release even while those requests run. Unknown memory
tags are refused (SGLang records them).

Bad input is refused with 400 and the reason, before it reaches the engine: bodies that are not
JSON (``NaN`` and ``Infinity`` included), nest deeper than :data:`MAX_JSON_DEPTH` or hold an
integer too long to convert; non-finite or out-of-range sampling values; token ids outside the
vocabulary. The HTTP layer (:mod:`srt_agent.serving.asgi`: Starlette on uvicorn, as SGLang's own
server) adds the limits of a public port: a whole-request deadline against slow clients (408),
a body cap (413 unread), ``Content-Length`` required (411), idle keep-alive connections closed,
and a cap on open connections (503). Every call runs on a worker thread, since each blocks on the
engine or a process group; a waiting client costs a socket, not a thread. It streams
(``"stream": true``) one event with the whole answer, then ``data: [DONE]``, since the engine hands
out whole outputs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import uvicorn

from srt_agent.errors import describe_fault
from srt_agent.serving.asgi import MAX_JSON_DEPTH, Endpoint, build_app, deadline_protocol
from srt_agent.serving.asgi import HTTPError as _HTTPError
from srt_agent.serving.bodies import (
    BeginUpdateBody,
    Body,
    ContinueBody,
    DestroyGroupBody,
    InitGroupBody,
    MemoryBody,
    PauseBody,
    UpdateFromDiskBody,
    UpdateFromDistributedBody,
    UpdateFromTensorBody,
    WireError,
    parse_body,
)
from srt_agent.serving.wire import batch_shape, output_to_wire, requests_from_wire

if TYPE_CHECKING:
    import torch.distributed

    from srt_agent.engine.torch_engine import TorchEngine

__all__ = ["MAX_JSON_DEPTH", "EngineServer"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 2**20
"""Default for the largest request body read: 16 MiB holds a batch of ~2.5 million prompt tokens
(the weights never travel in a body: they come over the process group or from disk)."""

MAX_CONNECTIONS = 1024
"""Default for the connections open at once; requests on more are answered 503. Waiting clients
cost a socket each (not a thread), so the cap guards file descriptors, not the engine."""

REQUEST_TIMEOUT_S = 30.0
"""Default for how long a request may take to arrive whole (headers and body); then 408."""

KEEP_ALIVE_S = 60
"""Default for how long an idle keep-alive connection stays open between two requests."""

MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
"""SGLang's ``GPU_MEMORY_ALL_TYPES``: what ``tags: null`` releases or resumes."""


_SGLANG_DIES = "SGLang 0.5.23's scheduler would have died here"
B = TypeVar("B", bound=Body)


class EngineServer:
    """An engine served over SGLang's native API on ``host:port`` (port 0: any free port).

    Args:
        engine: The engine; closed by :meth:`close`.
        model_dir: The model it was loaded from (reported by ``/get_model_info``).
        host: Interface to listen on (``127.0.0.1`` by default: the API has no authentication).
        port: TCP port; 0 picks a free one (see :attr:`url`).
        speculative: Whether the engine drafts (reported, and ``spec_verify_ct`` in answers).
        group_timeout_s: How long joining a weight-sync group, and each broadcast over it, may
            wait (torch's default, as in SGLang: 30 minutes).
        max_body_bytes: Largest request body read; a longer one is refused (413) unread.
        max_connections: Connections open at once; requests beyond them are answered 503.
        request_timeout_s: How long a request may take to arrive whole; a slower one is
            answered 408 and disconnected.
        keep_alive_s: How long an idle keep-alive connection stays open between requests.
    """

    def __init__(
        self,
        engine: TorchEngine,
        model_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 30000,
        speculative: bool = False,
        group_timeout_s: float = 1800.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        keep_alive_s: int = KEEP_ALIVE_S,
    ) -> None:
        if max_body_bytes < 1 or max_connections < 1:
            raise ValueError(
                f"max_body_bytes and max_connections must be >= 1, got {max_body_bytes} and {max_connections}"
            )
        if not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        self.model_dir = Path(model_dir)
        self.speculative = speculative
        self.group_timeout = timedelta(seconds=group_timeout_s)
        self.started = time.time()
        self._ids = itertools.count()
        self._updating = threading.Lock()  # one weight update at a time
        # SGLang's tokenizer-side state: the pause flag, and the model-update lock that every
        # /generate holds (reader) and every unpaused weight update takes (writer).
        self._state = threading.Condition()
        self._paused: str | None = None  # the pause mode
        self._readers = 0  # /generate calls in the engine
        self._writer = False
        self._writers_waiting = 0
        # SGLang's scheduler-side state (changed under the writer, or under _state).
        self._session: dict[str, Any] | None = None  # selector, and whether weights were loaded
        self._groups: dict[str, tuple[torch.distributed.ProcessGroup, str]] = {}  # name: (group, backend)
        self._groups_lock = threading.Lock()  # a group is not left while weights arrive over it
        self._released: set[str] = set()
        # Bound here, so that a taken port fails now and port 0's pick is known at once.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family, backlog=2048)
        config = uvicorn.Config(
            build_app(self._route_table(), max_body_bytes=max_body_bytes),
            http=deadline_protocol(request_timeout_s),
            ws="none",
            lifespan="off",
            loop="asyncio",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=keep_alive_s,
            # uvicorn counts the connection asking too: one more, so exactly max_connections are served.
            limit_concurrency=max_connections + 1,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket."""
        host, port = self._socket.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Answer requests until :meth:`close` (from another thread) or Ctrl-C."""
        self._server.run(sockets=[self._socket])

    def start(self, timeout_s: float = 30.0) -> EngineServer:
        """Serve from a background thread (tests, notebooks) once it accepts; returns ``self``.

        Raises:
            RuntimeError: The server did not start within ``timeout_s``.
        """
        self._thread = threading.Thread(target=self.serve_forever, name="srt-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"srt-agent serve did not start on {self.url}")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        """Stop serving, leave the weight-sync groups, then close the engine."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._socket.close()
        with self._state:
            self._paused = None  # held /generate calls go on, and find the engine closed
            self._state.notify_all()
        for name in list(self._groups):
            try:
                self._destroy_group(name)
            except Exception as exc:  # noqa: BLE001 - closing goes on
                log.warning("leaving weight-sync group %r failed: %s", name, describe_fault(exc))
        self.engine.close()

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ endpoints
    def _route_table(self) -> dict[tuple[str, str], Endpoint]:
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
            ("POST", "/init_weights_update_group"): self._init_group,
            ("POST", "/destroy_weights_update_group"): self._destroy_group_route,
            ("POST", "/begin_weight_update"): self._begin_update,
            ("POST", "/end_weight_update"): self._end_update,
            ("POST", "/update_weights_from_distributed"): self._update_from_distributed,
            ("POST", "/update_weights_from_tensor"): self._update_from_tensor,
            ("POST", "/pause_generation"): self._pause,
            ("POST", "/continue_generation"): self._continue,
            ("GET", "/release_memory_occupation"): self._release_memory,
            ("POST", "/release_memory_occupation"): self._release_memory,
            ("GET", "/resume_memory_occupation"): self._resume_memory,
            ("POST", "/resume_memory_occupation"): self._resume_memory,
        }

    def _generate(self, body: Any) -> tuple[HTTPStatus, Any]:
        try:
            requests = requests_from_wire(body, lambda: f"srt-serve-{next(self._ids)}")
        except WireError as exc:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        for request in requests:  # SGLang refuses these with 400 too, before they reach a batch
            reason = self.engine.invalid_reason(request)
            if reason:
                raise _HTTPError(HTTPStatus.BAD_REQUEST, reason)
        try:
            with self._reading():
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
            "verify_forwards": stats.verify_forwards,
            "nodes_drafted": stats.nodes_drafted,
            "nodes_accepted": stats.nodes_accepted,
        }

    def _update_from_disk(self, body: Any) -> tuple[HTTPStatus, Any]:
        from srt_agent.engine.hf_checkpoint import CheckpointError, read_state_dict

        request = _parse(UpdateFromDiskBody, body)
        path = request.model_path
        with self._updating:
            try:
                self.engine.update_weights(read_state_dict(path))
            except (CheckpointError, OSError) as exc:
                return HTTPStatus.BAD_REQUEST, {"success": False, "message": describe_fault(exc)}
            if request.flush_cache:
                self.engine.flush_cache()
        # The tree cache is kept: earlier rollouts stay valid drafts (verification keeps exactness).
        return HTTPStatus.OK, {"success": True, "message": f"loaded {path}", "num_paused_requests": 0}

    def _flush(self, _: Any) -> tuple[HTTPStatus, Any]:
        self.engine.flush_cache()
        return HTTPStatus.OK, "Cache flushed."

    # ------------------------------------------------------------------ weight sync (SGLang's RL API)
    def _init_group(self, body: Any) -> tuple[HTTPStatus, Any]:
        from srt_agent.serving.weight_sync import init_custom_process_group, tcp_init_method

        request = _parse(InitGroupBody, body)  # an empty group_name is refused: SGLang asserts on it
        name, backend = request.group_name, request.backend
        if name in self._groups:
            return _failure(f"Failed to initialize custom process group: a group named {name!r} exists.")
        # The rendezvous returns once every rank (the learner's rank 0 too) has joined; this request's
        # handler thread waits for it, the server's other requests go on.
        try:
            group = init_custom_process_group(
                backend,
                tcp_init_method(request.master_address, request.master_port),
                request.world_size,
                request.rank_offset,  # plus the TP rank, 0 here
                name,
                timeout=self.group_timeout,
            )
        except Exception as exc:  # noqa: BLE001 - SGLang answers any failure to join as success: false
            log.warning("joining weight-sync group %r failed: %s", name, describe_fault(exc))
            return _failure(f"Failed to initialize custom process group: {describe_fault(exc)}.")
        with self._groups_lock:
            self._groups[name] = (group, backend)
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to initialize custom process group."}

    def _destroy_group_route(self, body: Any) -> tuple[HTTPStatus, Any]:
        name = _parse(DestroyGroupBody, body).group_name
        try:
            with self._groups_lock:
                if name not in self._groups:
                    return _failure("The group to be destroyed does not exist.")
                self._destroy_group(name)
        except Exception as exc:  # noqa: BLE001 - as SGLang: success false
            return _failure(f"Failed to destroy custom process group: {describe_fault(exc)}.")
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to destroy custom process group."}

    def _destroy_group(self, name: str) -> None:
        import torch.distributed as dist

        group, _ = self._groups.pop(name)
        dist.destroy_process_group(group)

    def _begin_update(self, body: Any) -> tuple[HTTPStatus, Any]:
        selector = _parse(BeginUpdateBody, body).selector
        with self._weights_exclusive():
            if self._session is not None:
                return _failure("a weight-update session is already open; call end_weight_update() first")
            self._session = {"selector": selector, "loaded": False}
        return HTTPStatus.OK, {"success": True, "message": "Success"}

    def _end_update(self, _: Any) -> tuple[HTTPStatus, Any]:
        with self._weights_exclusive():
            if self._session is None:
                return _failure("no weight-update session is open; call begin_weight_update() first")
            self._session = None
        return HTTPStatus.OK, {"success": True, "message": "Success"}

    def _update_from_distributed(self, body: Any) -> tuple[HTTPStatus, Any]:
        from srt_agent.engine.hf_checkpoint import CheckpointError
        from srt_agent.serving.weight_sync import receive_tensors

        request = _parse(UpdateFromDistributedBody, body)
        name = request.group_name
        if request.abort_all_requests:
            self._abort_running("aborted for a weight update")
        with self._weights_exclusive():
            if self._session is None:
                return _failure(
                    "update_weights_from_distributed must run between begin_weight_update() and "
                    "end_weight_update()"
                )
            try:
                with self._groups_lock:
                    if name not in self._groups:
                        raise ValueError(
                            f"Group {name} not in {list(self._groups)}. "
                            "Please call `init_weights_update_group` first."
                        )
                    group, backend = self._groups[name]
                    tensors = receive_tensors(
                        group,
                        request.names,
                        request.dtypes,
                        request.shapes,
                        device=self._receive_device(backend),
                        load_format=request.load_format,
                    )
            except Exception as exc:  # noqa: BLE001 - as SGLang: any failure to receive is success false
                return _failure(f"Failed to receive weights: {describe_fault(exc)}")
            if "weights" in self._released:
                return _failure(
                    "the weights were received but not loaded: their memory is released; call "
                    f"/resume_memory_occupation with tags ['weights'] first ({_SGLANG_DIES}: it would "
                    "write into released GPU memory)"
                )
            try:
                self.engine.update_weights(dict(tensors))
            except (CheckpointError, ValueError) as exc:
                return _failure(f"Failed to update parameter online: {describe_fault(exc)}")
            self._session["loaded"] = True
            if request.flush_cache and not self._flush_if_idle():
                return _failure(
                    "Weights were updated, but the cache was not flushed because requests are still "
                    "running or queued. Retract or finish them, then call /flush_cache."
                )
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to update parameter online."}

    def _update_from_tensor(self, body: Any) -> tuple[HTTPStatus, Any]:
        if _parse(UpdateFromTensorBody, body).abort_all_requests:
            self._abort_running("aborted for a weight update")
        with self._weights_exclusive():
            if self._session is None:
                return _failure(
                    "update_weights_from_tensor must run between begin_weight_update() and "
                    "end_weight_update()"
                )
        return HTTPStatus.NOT_IMPLEMENTED, {
            "success": False,
            "message": "this server cannot open the tensors' CUDA IPC handles (SGLang's colocated "
            "path); use /update_weights_from_distributed or /update_weights_from_disk",
        }

    def _receive_device(self, backend: str) -> Any:
        """Where tensors arrive: NCCL on the engine's GPU (else the current GPU), gloo on the CPU."""
        import torch

        if backend != "nccl":
            return torch.device("cpu")
        device = self.engine.model.device
        return device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())

    # ------------------------------------------------------------------ pause, memory
    def _pause(self, body: Any) -> tuple[HTTPStatus, Any]:
        mode = _parse(PauseBody, body).mode
        with self._state:
            self._paused = mode
            self._state.notify_all()
        if mode == "abort":
            self._abort_running("aborted by /pause_generation", until_done=True)
        return HTTPStatus.OK, {"message": "Generation paused successfully.", "status": "ok"}

    def _continue(self, body: Any) -> tuple[HTTPStatus, Any]:
        empty_cache = _parse(ContinueBody, body).torch_empty_cache
        with self._state:
            # A paused weight update holds SGLang's pause condition: continuing waits for it.
            self._state.wait_for(lambda: not (self._writer and self._paused is not None))
            self._paused = None
            self._state.notify_all()
        if empty_cache and self.engine.model.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        return HTTPStatus.OK, {"message": "Generation continued successfully.", "status": "ok"}

    def _release_memory(self, body: Any) -> tuple[HTTPStatus, Any]:
        tags = _memory_tags(body)
        with self._state:
            if not self._idle():
                raise _HTTPError(
                    HTTPStatus.BAD_REQUEST,
                    f"release_memory_occupation should be called only when server is idle; {self._readers} "
                    f"generate call(s) are running ({_SGLANG_DIES}: an assert). Finish them, or pause "
                    "generation first (mode abort or retract)",
                )
            self._released.update(tags)
        if "kv_cache" in tags:
            self.engine.flush_cache()
        return HTTPStatus.OK, None

    def _resume_memory(self, body: Any) -> tuple[HTTPStatus, Any]:
        tags = _memory_tags(body)
        with self._state:
            left = set(self._released)
            missing = []
            for tag in tags:  # SGLang removes them one by one: a tag twice is resumed twice
                if tag in left:
                    left.remove(tag)
                else:
                    missing.append(tag)
            if missing:
                raise _HTTPError(
                    HTTPStatus.BAD_REQUEST,
                    f"cannot resume {missing}: not released (released: {sorted(self._released)}; "
                    f"{_SGLANG_DIES}: a KeyError). Resume only released tags; null means all of "
                    f"{list(MEMORY_TAGS)}",
                )
            self._released = left
        return HTTPStatus.OK, None

    # ------------------------------------------------------------------ SGLang's locks and states
    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Hold SGLang's model-update reader lock around a generation, once generation is not paused."""
        with self._state:
            self._state.wait_for(
                lambda: self._paused is None and not self._writer and not self._writers_waiting
            )
            if self._released:
                raise _HTTPError(
                    HTTPStatus.BAD_REQUEST,
                    f"cannot generate: the server's memory is released ({sorted(self._released)}); "
                    "POST /resume_memory_occupation first",
                )
            self._readers += 1
        try:
            yield
        finally:
            with self._state:
                self._readers -= 1
                self._state.notify_all()

    @contextlib.contextmanager
    def _weights_exclusive(self) -> Iterator[None]:
        """SGLang's writer lock: wait for running generations unless paused, and hold new ones."""
        with self._state:
            self._writers_waiting += 1
            try:
                self._state.wait_for(
                    lambda: not self._writer and (self._paused is not None or self._readers == 0)
                )
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._state:
                self._writer = False
                self._state.notify_all()

    def _idle(self) -> bool:
        """SGLang's ``is_fully_idle(ignore_waiting=paused)``: nothing running (retracted requests wait)."""
        return self._paused == "retract" or self._readers == 0

    def _flush_if_idle(self) -> bool:
        with self._state:
            if not self._idle():
                return False
        self.engine.flush_cache()
        return True

    def _abort_running(self, why: str, *, until_done: bool = False) -> None:
        """Abort every request in the engine (answers: ``abort``); ``until_done``: until no call is left."""
        while True:
            self.engine.abort_all(why)
            if not until_done:
                return
            with self._state:
                # A call may reach the engine just after the abort: abort again until none is left.
                if self._state.wait_for(lambda: self._readers == 0, timeout=0.05):
                    return


def _parse(model: type[B], body: Any) -> B:
    """``body`` read as ``model``; a malformed body is a 400 naming the field."""
    try:
        return parse_body(model, body)
    except WireError as exc:
        raise _HTTPError(HTTPStatus.BAD_REQUEST, str(exc)) from None


def _failure(message: str) -> tuple[HTTPStatus, Any]:
    """SGLang's answer to a control call that did not succeed."""
    return HTTPStatus.BAD_REQUEST, {"success": False, "message": message}


def _memory_tags(body: Any) -> list[str]:
    """The ``tags`` of a memory release or resume: null or ``[]`` mean all of :data:`MEMORY_TAGS`."""
    tags = _parse(MemoryBody, body).tags
    if not tags:
        return list(MEMORY_TAGS)
    unknown = [t for t in tags if t not in MEMORY_TAGS]
    if unknown:
        raise _HTTPError(HTTPStatus.BAD_REQUEST, f"unknown memory tags {unknown}; use {list(MEMORY_TAGS)}")
    return list(tags)
