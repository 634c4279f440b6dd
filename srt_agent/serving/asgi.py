"""The HTTP layer of ``srt-agent serve``: a Starlette app on uvicorn, with the limits of a public port.

:class:`~srt_agent.serving.server.EngineServer` owns the endpoints (functions from a parsed JSON
body to a status and a payload, which block on the engine or a process group); this module puts
them on the network. Each call runs on a worker thread (at most :data:`HANDLER_THREADS` at once;
more wait for one), so the event loop only reads requests and writes answers, and a slow or hostile
client costs a socket, never a thread. The limits, each answered with a JSON error that says what
was wrong (``{"error": {"message": ...}}``, as SGLang's):

* **the whole request** (headers and body) must arrive within ``request_timeout_s`` of its first
  byte (of the connection, for its first request): a client that trickles bytes is answered 408
  and disconnected (:class:`_DeadlineProtocol`; uvicorn itself times only idle keep-alive gaps);
* **idle keep-alive** connections close after ``keep_alive_s``;
* **the body**: a ``POST`` without ``Content-Length`` is refused with 411 (a chunked one too),
  one longer than ``max_body_bytes`` with 413 before any of it is read, and the connection closes;
* **its JSON**: ``NaN`` and ``Infinity`` are not JSON (400), nor is nesting deeper than
  :data:`MAX_JSON_DEPTH` (400; the parser's own recursion guard stops a body of a million
  brackets at ~1,000 levels, and the parsed value is then measured without recursion);
* **connections**: beyond ``max_connections`` open at once, requests are answered 503 by uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

import anyio
import h11
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from srt_agent.errors import SrtAgentError, describe_fault

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 32
"""Deepest nesting a body may have (SGLang's deepest body, a batch of token-id lists, has 3)."""

HANDLER_THREADS = 256
"""Endpoint calls running at once (each on a thread, blocked on the engine); more wait for one."""

Endpoint = Callable[[Any], tuple[HTTPStatus, Any]]
"""A parsed JSON body (``{}`` when there is none) to ``(status, payload)``; may raise :class:`HTTPError`."""


class HTTPError(SrtAgentError):
    """A refusal: answered with ``status`` and ``{"error": {"message": message}}``.

    Args:
        status: The HTTP status.
        message: What was wrong, naming the field or header.
        close: Close the connection after answering (the body was left unread).
    """

    def __init__(self, status: HTTPStatus, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


def build_app(routes: Mapping[tuple[str, str], Endpoint], *, max_body_bytes: int) -> Starlette:
    """The Starlette app serving ``routes`` (``(method, path)`` to endpoint), errors as JSON."""
    limiter = anyio.CapacityLimiter(HANDLER_THREADS)

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method  # Starlette adds HEAD to GET
        call = routes[(method, request.url.path)]
        stream = False
        try:
            body = await read_body(request, max_body_bytes)
            stream = isinstance(body, dict) and body.get("stream") is True
            status, payload = await anyio.to_thread.run_sync(call, body, limiter=limiter)
        except HTTPError as exc:
            return error_response(exc.status, str(exc), close=exc.close)
        except ClientDisconnect:  # nobody to answer; the status is for the log
            return Response(status_code=HTTPStatus.BAD_REQUEST)
        except Exception as exc:  # a bug here must not kill the server
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(HTTPStatus.INTERNAL_SERVER_ERROR, describe_fault(exc))
        return answer(status, payload, stream)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # registered for HTTPException only
        status = HTTPStatus(exc.status_code)
        message = f"{request.method} {request.url.path} is not served here"
        return error_response(status, message if status in (404, 405) else str(exc.detail))

    paths: dict[str, list[str]] = {}
    for method, path in routes:
        paths.setdefault(path, []).append(method)
    return Starlette(
        routes=[Route(path, endpoint, methods=methods) for path, methods in paths.items()],
        exception_handlers={HTTPException: http_error},
    )


async def read_body(request: Request, max_body_bytes: int) -> Any:
    """The request's JSON body (``{}`` for none), or an :class:`HTTPError` naming what is wrong.

    The headers are judged before any of the body is read: a body too long, or of unknown length,
    is refused unread.
    """
    headers = request.headers
    if headers.get("transfer-encoding", "").strip():
        raise HTTPError(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length header", close=True)
    length = headers.get("content-length")
    if length is None:
        if request.method == "POST":
            raise HTTPError(
                HTTPStatus.LENGTH_REQUIRED,
                "a POST needs a Content-Length header (0 for an empty body)",
                close=True,
            )
        return {}
    size = int(length)  # h11 has refused a Content-Length that is not a count (400)
    if size > max_body_bytes:
        raise HTTPError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the body has {size} bytes, over this server's {max_body_bytes} (serve --max-body-mb raises it)",
            close=True,
        )
    return parse_body(await request.body()) if size else {}


def parse_body(raw: bytes) -> Any:
    """A request body's JSON, or a 400 that says what is wrong with it.

    Stricter than :func:`json.loads`: ``NaN`` and ``Infinity`` are not JSON and are refused, and
    so is nesting deeper than :data:`MAX_JSON_DEPTH`.
    """

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    too_deep = f"the body nests deeper than {MAX_JSON_DEPTH} levels"
    try:
        value = json.loads(raw, parse_constant=refuse_constant)
    except RecursionError:  # the C parser's guard, at ~1,000 levels
        raise HTTPError(HTTPStatus.BAD_REQUEST, too_deep) from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError; so are huge ints
        why = str(exc)  # the parser's own words; only a huge int's message echoes input, and briefly
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {why[:200]}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise HTTPError(HTTPStatus.BAD_REQUEST, too_deep)
    return value


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON (a scalar is 0, ``[]`` is 1), without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in item if isinstance(child, dict | list))
    return deepest


def answer(status: HTTPStatus, payload: Any, stream: bool) -> Response:
    """An endpoint's answer: JSON, plain text, empty, or one server-sent event then ``[DONE]``."""
    if stream:
        data = f"data: {json.dumps(payload)}\n\ndata: [DONE]\n\n".encode()
        return Response(data, status_code=status, media_type="text/event-stream")
    if isinstance(payload, str):
        return Response(payload.encode(), status_code=status, media_type="text/plain; charset=utf-8")
    if payload is None:
        return Response(b"", status_code=status, media_type="text/plain; charset=utf-8")
    return Response(json.dumps(payload).encode(), status_code=status, media_type="application/json")


def error_response(status: HTTPStatus, message: str, *, close: bool = False) -> Response:
    """``{"error": {"message": ...}}`` with ``status`` (and ``Connection: close`` if asked)."""
    headers = {"Connection": "close"} if close else None
    return Response(
        json.dumps({"error": {"message": message}}).encode(),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def deadline_protocol(request_timeout_s: float) -> type[H11Protocol]:
    """Uvicorn's HTTP/1.1 protocol with a whole-request deadline of ``request_timeout_s``."""
    return type("DeadlineProtocol", (_DeadlineProtocol,), {"request_timeout_s": request_timeout_s})


class _DeadlineProtocol(H11Protocol):
    """:class:`H11Protocol` that gives each request ``request_timeout_s`` to arrive whole.

    The clock starts when the connection opens (for its first request) or when the first byte of a
    later request arrives, and stops once the request's last body byte is in. uvicorn alone times
    only the idle gap between requests: a client sending a byte now and then would hold its
    connection for ever.
    """

    request_timeout_s = 30.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # a new request begins
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._disarm()  # all of it arrived

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            message = (
                f"the request did not arrive whole within {self.request_timeout_s:g} s "
                "(headers and body); send it at once"
            )
            body = json.dumps({"error": {"message": message}}).encode()
            head = (
                f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
        self.transport.close()
