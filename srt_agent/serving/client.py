"""``SGLangEngine``: the engine protocol over SGLang's native HTTP API (or ``srt-agent serve``).

Token ids in, token ids and their sampling logprobs out, through ``POST /generate`` with
``input_ids`` and ``return_logprob`` (:mod:`srt_agent.serving.wire`). Drafting happens in the
server (SRT's plugin in SGLang, the tree cache in ``srt-agent serve``), so this client has no
draft source of its own; its speculation figures come from the answers' counters.

HTTP runs on one background event loop with a pooled ``httpx.AsyncClient``, so the engine can be
awaited from any event loop (each rollout batch runs its own) and called from plain threads.
Connection failures and 502/503/504 answers are retried with exponential back-off; a request that
still fails raises :class:`EngineConnectionError` (its episode fails, the batch goes on).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import shutil
import tempfile
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import tenacity

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, check_room
from srt_agent.contracts.speculation import SpecStats
from srt_agent.errors import SrtAgentError
from srt_agent.serving.bodies import (
    BeginUpdateBody,
    DestroyGroupBody,
    InitGroupBody,
    Selector,
    UpdateFromDiskBody,
    UpdateFromDistributedBody,
    UpdateFromTensorBody,
    WireError,
)
from srt_agent.serving.wire import output_from_wire, request_to_wire

if TYPE_CHECKING:
    import torch

__all__ = ["EngineConnectionError", "SGLangEngine"]

T = TypeVar("T")

_RETRY_STATUS = frozenset({502, 503, 504})


class EngineConnectionError(SrtAgentError, RuntimeError):
    """The server could not be reached, or kept failing, after the retries."""


class SGLangEngine:
    """An engine served over HTTP with SGLang's native API.

    Args:
        url: The server, e.g. ``http://127.0.0.1:30000``.
        max_context: Longest prompt + generation the server's model holds (the rollout stops an
            episode that would pass it before sending the request).
        model_dir: The policy's checkpoint directory on this machine; :meth:`update_weights`
            copies its ``config.json`` next to the new weights. Needed only for that.
        timeout_s: Most seconds one request may take (a long generation included).
        connect_timeout_s: Most seconds to open a connection.
        retries: Further tries after a connection failure or a 502/503/504 answer.
        backoff_s: First pause between tries; doubled each time.
        max_connections: Connections pooled to the server (about the rollout's concurrency).
        api_key: Sent as ``Authorization: Bearer`` (SGLang's ``--api-key``).
        weights_dir: Where :meth:`update_weights` writes checkpoints the server loads; it must be
            readable by the server at the same path. Default: a temporary folder removed on
            :meth:`close`.
        weight_sync: How :meth:`update_weights` reaches the server: ``disk`` (a checkpoint the
            server loads) or ``tensor`` (the tensors themselves, for a server on this machine:
            :meth:`update_weights_from_tensors`).
        tp_size: The server's tensor-parallel size (``tensor`` sends one copy per rank).
        transport: An httpx transport to use instead of the network (tests).
        check: Ask ``/health`` now, so a wrong URL fails here rather than in the first episode.

    Raises:
        EngineConnectionError: ``check`` and the server does not answer.
    """

    def __init__(
        self,
        url: str,
        *,
        max_context: int,
        model_dir: str | Path | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_connections: int = 256,
        api_key: str | None = None,
        weights_dir: str | Path | None = None,
        weight_sync: str = "disk",
        tp_size: int = 1,
        transport: httpx.AsyncBaseTransport | None = None,
        check: bool = True,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"engine url must start with http:// or https://, got {url!r}")
        if max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {max_context}")
        if weight_sync not in ("disk", "tensor"):
            raise ValueError(f"weight_sync must be 'disk' or 'tensor', got {weight_sync!r}")
        if retries < 0 or backoff_s < 0:
            raise ValueError(f"retries and backoff_s must be >= 0, got {retries} and {backoff_s}")
        self.url = url.rstrip("/")
        self._max_context = max_context
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.retries = retries
        self.backoff_s = backoff_s
        self._own_weights_dir = weights_dir is None
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self._weights_version = 0
        self.weight_sync = weight_sync
        self.tp_size = tp_size
        self._lock = threading.Lock()
        self._stats = SpecStats()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="SGLangEngine-http", daemon=True)
        self._thread.start()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)

        async def make() -> httpx.AsyncClient:
            return httpx.AsyncClient(
                base_url=self.url, timeout=timeout, limits=limits, headers=headers, transport=transport
            )

        self._client = self._run(make())
        if check:
            try:
                self._run(self._call("GET", "/health"))
            except EngineConnectionError:
                self.close()
                raise

    # ------------------------------------------------------------------ the engine protocol
    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + generation) the server's model holds."""
        return self._max_context

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Send the requests concurrently and return their outputs in request order.

        Raises:
            PromptTooLongError: A prompt leaves no room to generate (checked before sending).
            ValueError: Duplicate request ids.
            EngineConnectionError: A request failed after the retries.
        """
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"request ids must be unique within a call, got duplicates in {ids}")
        for r in requests:
            self._check_length(r)
        futures = [self._submit(self._generate(r)) for r in requests]
        return [f.result() for f in futures]

    async def agenerate(self, request: GenerationRequest) -> GenerationOutput:
        """Send one request (it joins the server's running batch) and await its output.

        Cancelling the awaiting task closes the request's connection and asks the server to
        abort it.
        """
        self._check_length(request)
        return await asyncio.wrap_future(self._submit(self._generate(request)))

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Write ``state_dict`` as a checkpoint in :attr:`weights_dir` and have the server load it.

        The server flushes its KV prefix cache (computed with the old weights); SRT's trees are
        kept by its drafter.

        Raises:
            ValueError: No ``model_dir`` was given (its ``config.json`` completes the checkpoint).
            RuntimeError: The server refused the checkpoint.
        """
        if self.weight_sync == "tensor":
            self.update_weights_from_tensors(state_dict)
            return
        if self.model_dir is None:
            raise ValueError("SGLangEngine.update_weights needs model_dir= (the policy's checkpoint)")
        from safetensors.torch import save_file

        if self.weights_dir is None:
            self.weights_dir = Path(tempfile.mkdtemp(prefix="srt-weights-"))
        self._weights_version += 1
        target = self.weights_dir / f"step-{self._weights_version:06d}"
        target.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "generation_config.json"):
            if (self.model_dir / name).is_file():
                shutil.copy2(self.model_dir / name, target / name)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
        save_file(tensors, str(target / "model.safetensors"))
        self.update_weights_from_disk(target)
        previous = self.weights_dir / f"step-{self._weights_version - 1:06d}"
        if self._own_weights_dir and previous.is_dir():
            shutil.rmtree(previous, ignore_errors=True)

    def update_weights_from_disk(self, model_path: str | Path, *, flush_cache: bool = True) -> None:
        """Have the server load the checkpoint at ``model_path`` (a path on the server's disk).

        Raises:
            RuntimeError: The server answered ``success: false``.
        """
        body = UpdateFromDiskBody(model_path=str(model_path), flush_cache=flush_cache).wire()
        answer = self._run(self._call("POST", "/update_weights_from_disk", body))
        self._check_success(answer, f"load {model_path}")

    def update_weights_from_tensors(
        self, state_dict: Mapping[str, torch.Tensor], *, flush_cache: bool = True
    ) -> None:
        """Send the tensors to a server on this machine (SGLang's ``/update_weights_from_tensor``).

        They travel as SGLang's ``MultiprocessingSerializer`` sends them: a ``ForkingPickler`` dump
        with torch's reductions (CUDA tensors as IPC handles, CPU tensors as shared memory),
        base64-encoded, one copy per tensor-parallel rank, inside the weight-update session SGLang
        0.5.23 requires (``/begin_weight_update`` ... ``/end_weight_update``).

        Raises:
            RuntimeError: The server refused the weights.
        """
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing  # noqa: F401 - registers torch's reductions with ForkingPickler

        buffer = io.BytesIO()
        ForkingPickler(buffer).dump([(name, t.detach()) for name, t in state_dict.items()])
        payload = base64.b64encode(buffer.getvalue()).decode()
        with self.weight_update_session():
            self.update_weights_from_serialized([payload] * self.tp_size, flush_cache=flush_cache)

    def update_weights_from_serialized(
        self,
        serialized_named_tensors: Sequence[str],
        *,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> None:
        """``/update_weights_from_tensor`` with ready payloads (base64, one per tensor-parallel rank).

        It must run inside a weight-update session (:meth:`weight_update_session`).

        Raises:
            RuntimeError: The server refused the weights (outside a session, say).
        """
        body = UpdateFromTensorBody(
            serialized_named_tensors=list(serialized_named_tensors),
            flush_cache=flush_cache,
            load_format=load_format,
        ).wire()
        answer = self._run(self._call("POST", "/update_weights_from_tensor", body))
        self._check_success(answer, "load the weights")

    # ------------------------------------------------------------------ SGLang's RL weight sync
    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        *,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> None:
        """Have the server join the learner's weight-sync process group (``/init_weights_update_group``).

        The server's ranks are ``rank_offset`` plus its tensor-parallel ranks; the learner's rank 0
        hosts the rendezvous at ``master_address:master_port`` and joins with
        :func:`srt_agent.serving.weight_sync.init_custom_process_group` (or
        :meth:`~srt_agent.serving.weight_sync.WeightSender.connect`). This call blocks until every
        rank has joined, so make it from another thread (or process) than the learner's join.

        Raises:
            RuntimeError: The server could not join (e.g. the rendezvous timed out).
        """
        body = InitGroupBody(
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        ).wire()
        answer = self._run(self._call("POST", "/init_weights_update_group", body))
        self._check_success(answer, f"join weight-sync group {group_name!r}")

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        """Have the server leave a weight-sync group.

        Raises:
            RuntimeError: No such group.
        """
        body = DestroyGroupBody(group_name=group_name).wire()
        answer = self._run(self._call("POST", "/destroy_weights_update_group", body))
        self._check_success(answer, f"leave weight-sync group {group_name!r}")

    def begin_weight_update(self, selector: Selector = "all") -> None:
        """Open the weight-update session SGLang 0.5.23 requires around ``update_weights_from_*``.

        Raises:
            RuntimeError: A session is open already.
        """
        body = BeginUpdateBody(selector=selector).wire()
        answer = self._run(self._call("POST", "/begin_weight_update", body))
        self._check_success(answer, "open a weight update session")

    def end_weight_update(self) -> None:
        """Close the weight-update session.

        Raises:
            RuntimeError: No session is open.
        """
        answer = self._run(self._call("POST", "/end_weight_update", {}))
        self._check_success(answer, "close the weight update session")

    @contextlib.contextmanager
    def weight_update_session(self, selector: Selector = "all") -> Iterator[None]:
        """``begin_weight_update`` ... ``end_weight_update``; the session is closed even on an error."""
        self.begin_weight_update(selector)
        try:
            yield
        finally:
            self.end_weight_update()

    def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str | torch.dtype],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        load_format: str | None = None,
        abort_all_requests: bool = False,
        weight_version: str | None = None,
    ) -> None:
        """Have the server receive tensors the learner broadcasts over the group, and load them.

        The learner broadcasts them from rank 0 in the same order
        (:class:`~srt_agent.serving.weight_sync.WeightSender`), one broadcast each, or one
        ``uint8`` buffer with ``load_format="flattened_bucket"``. The call blocks until the server
        has received and loaded them, so make it from another thread (or process) than the
        broadcast. It must run inside a weight-update session (:meth:`weight_update_session`).

        Args:
            names: HF parameter names.
            dtypes: Their dtypes (``torch.bfloat16`` or ``"bfloat16"``).
            shapes: Their shapes.
            group_name: The group (as in :meth:`init_weights_update_group`).
            flush_cache: Flush the server's cache afterwards (SGLang refuses while requests run,
                unless paused with ``retract``; the call then fails though the weights are loaded).
            load_format: ``None``, or ``"flattened_bucket"``.
            abort_all_requests: Abort the running requests first.
            weight_version: A version label the server records.

        Raises:
            RuntimeError: The server refused (outside a session, an unknown group, a wrong name or
                shape), or the flush failed.
        """
        body = UpdateFromDistributedBody(
            names=list(names),
            dtypes=[str(d).removeprefix("torch.") for d in dtypes],
            shapes=[[int(n) for n in s] for s in shapes],
            group_name=group_name,
            flush_cache=flush_cache,
            load_format=load_format,
            abort_all_requests=abort_all_requests,
            weight_version=weight_version,
        ).wire()
        answer = self._run(self._call("POST", "/update_weights_from_distributed", body))
        self._check_success(answer, f"receive {len(names)} tensor(s) over {group_name!r}")

    def _check_success(self, answer: Any, what: str) -> None:
        """Raise when a ``{"success": ..., "message": ...}`` answer says the server could not ``what``."""
        if not isinstance(answer, dict) or not answer.get("success"):
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise RuntimeError(f"{self.url} could not {what}: {message}")

    def flush_cache(self) -> None:
        """Drop the server's KV prefix cache."""
        self._run(self._call("POST", "/flush_cache"))

    # ------------------------------------------------------------------ pause, memory
    def pause_generation(self, mode: str) -> None:
        """Hold new generations until :meth:`continue_generation` (``/pause_generation``).

        Args:
            mode: ``"abort"`` (SGLang's default) aborts the running requests too; ``"retract"``
                puts them back in the queue (their cache is recomputed after the pause);
                ``"in_place"`` leaves them where they are (a cache flush then fails).
        """
        answer = self._run(self._call("POST", "/pause_generation", {"mode": mode}))
        self._check_status(answer, f"pause generation ({mode})")

    def continue_generation(self, *, torch_empty_cache: bool = True) -> None:
        """Let held and new generations run again (``/continue_generation``)."""
        body = {"torch_empty_cache": torch_empty_cache}
        answer = self._run(self._call("POST", "/continue_generation", body))
        self._check_status(answer, "continue generation")

    def _check_status(self, answer: Any, what: str) -> None:
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            raise RuntimeError(f"{self.url} could not {what}: {answer}")

    def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Free the server's GPU memory while the learner trains (``/release_memory_occupation``).

        Args:
            tags: Which memory: ``None`` for all, or some of ``"weights"``, ``"kv_cache"``,
                ``"cuda_graph"``. SGLang needs the server idle (or paused) and
                ``--enable-memory-saver``; its weights are lost unless ``--enable-weights-cpu-backup``.

        Raises:
            ValueError: The server refused (it is busy, say).
        """
        body = {"tags": list(tags) if tags is not None else None}
        self._run(self._call("POST", "/release_memory_occupation", body))

    def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Take back released memory (``/resume_memory_occupation``).

        Args:
            tags: ``None`` for all three tags, or some of them; each must have been released (a
                tag resumed that is not released kills SGLang's scheduler).

        Raises:
            ValueError: The server refused (a tag is not released, say).
        """
        body = {"tags": list(tags) if tags is not None else None}
        self._run(self._call("POST", "/resume_memory_occupation", body))

    def server_info(self) -> dict[str, Any]:
        """The server's ``/server_info`` answer."""
        answer = self._run(self._call("GET", "/server_info"))
        return answer if isinstance(answer, dict) else {"answer": answer}

    def spec_stats(self, reset: bool = False) -> SpecStats:
        """Tokens and forwards of this client's requests (from the servers' answers).

        Args:
            reset: Start counting afresh after the snapshot.
        """
        with self._lock:
            out = self._stats
            if reset:
                self._stats = SpecStats()
        return out

    def close(self) -> None:
        """Close the connections and stop the HTTP thread (the server keeps running)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        client = getattr(self, "_client", None)
        if client is not None:
            asyncio.run_coroutine_threadsafe(client.aclose(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        if self._own_weights_dir and self.weights_dir is not None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)

    def __enter__(self) -> SGLangEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _check_length(self, request: GenerationRequest) -> None:
        check_room(request, self._max_context)
        if request.tool_grammar is not None:
            # The wire carries token ids and sampling options only; dropping the grammar would
            # sample a different distribution than the caller asked for.
            raise ValueError(
                f"request {request.request_id!r} asks for constrained tool calls, which a server engine "
                "does not apply; use the in-process engine (--engine torch) or turn the constraint off"
            )

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        if self._closed:
            coro.close()
            raise RuntimeError("SGLangEngine is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._submit(coro).result()

    async def _generate(self, request: GenerationRequest) -> GenerationOutput:
        # The room left in the context caps the generation, as the in-process engine does.
        room = self._max_context - len(request.prompt_ids)
        if request.params.max_new_tokens > room:
            request = replace(request, params=replace(request.params, max_new_tokens=room))
        try:
            answer = await self._call("POST", "/generate", request_to_wire(request))
        except asyncio.CancelledError:
            await asyncio.shield(self._abort(request.request_id))
            raise
        try:
            out = output_from_wire(request.request_id, answer)
        except WireError as exc:
            raise EngineConnectionError(f"{self.url}/generate answered {exc}") from None
        with self._lock:
            s = self._stats
            self._stats = replace(
                s,
                tokens=s.tokens + len(out.token_ids),
                row_steps=s.row_steps + out.forward_passes,
                runahead_tokens=s.runahead_tokens
                + (len(out.token_ids) if request.priority == "runahead" else 0),
                preempted=s.preempted + (out.finish_reason == "preempted"),
            )
        return out

    async def _abort(self, rid: str) -> None:
        # Best effort: the closed connection already tells SGLang to stop.
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post("/abort_request", json={"rid": rid}, timeout=5.0)

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        """One API call with retries (tenacity); the parsed JSON answer (text answers as a string).

        Connection failures and 502/503/504 answers are tried again after ``backoff_s``, doubling,
        up to ``retries`` more times; the last answer, or an :class:`EngineConnectionError`, ends it.
        A read timeout is not retried: the server may still be generating that request.
        """
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, exp_base=2),
            retry=tenacity.retry_if_exception_type((*_RETRY_ERRORS, _Unavailable)),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._client.request(method, path, json=body)
                    if response.status_code in _RETRY_STATUS:
                        raise _Unavailable(response)
        except _Unavailable as exc:  # still unavailable at the last try: its answer says why
            return _parse(exc.response, f"{self.url}{path}")
        except _RETRY_ERRORS as exc:
            raise EngineConnectionError(
                f"no answer from {self.url}{path} after {self.retries + 1} tries ({type(exc).__name__}: "
                f"{exc}); is the server up? Start one with `srt-agent serve --model DIR` "
                "or `srt-agent sglang-serve --model DIR`"
            ) from None
        except httpx.TimeoutException as exc:
            raise EngineConnectionError(f"{self.url}{path} timed out ({type(exc).__name__})") from None
        return _parse(response, f"{self.url}{path}")


_RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)
"""Failures before the server took the request: safe to send it again."""


class _Unavailable(Exception):
    """A 502/503/504 answer, retried like a connection failure."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def _parse(response: httpx.Response, where: str) -> Any:
    if response.status_code >= 400:
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if isinstance(payload, dict) and payload.get("success") is False:
            return payload  # SGLang's {"success": false, "message": ...}: the caller says what failed
        try:
            message = payload["error"]["message"]
        except (KeyError, TypeError):
            message = response.text[:500]
        if response.status_code in (400, 404, 405, 422, 501):
            raise ValueError(f"{where} refused the request ({response.status_code}): {message}")
        raise EngineConnectionError(f"{where} failed ({response.status_code}): {message}")
    if "json" in response.headers.get("content-type", ""):
        try:
            return response.json()
        except json.JSONDecodeError as exc:
            raise EngineConnectionError(f"{where} answered malformed JSON: {exc}") from None
    return response.text
