"""``srt-agent serve`` under hostile input: every malformed body gets 400 and the reason, the server lives on.

Each case was tried as an attacker would, on the server before these guards: a ``NaN``
temperature sampled token 0 forever, a deeply nested body answered 500 with a ``RecursionError``,
a 50 MB body was read whole, a negative ``Content-Length`` was a 500, an out-of-range seed or token
id reached the engine.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from train_fixtures import save_tiny_policy

from srt_agent.contracts.generation import SamplingParams
from srt_agent.runtime import build_engine
from srt_agent.serving import EngineServer
from srt_agent.serving.server import MAX_JSON_DEPTH


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    model_dir = save_tiny_policy(tmp_path_factory.mktemp("tiny-llama"))
    engine = build_engine(model_dir, max_batch_size=4, seed=0)
    with EngineServer(engine, model_dir, port=0, max_body_bytes=2**20, max_connections=4).start() as srv:
        yield srv


def _post(server: EngineServer, raw: bytes) -> httpx.Response:
    return httpx.post(
        f"{server.url}/generate", content=raw, headers={"Content-Type": "application/json"}, timeout=30
    )


def _raw(server: EngineServer, request: bytes) -> bytes:
    """What the server answers to ``request`` sent as is on a fresh connection (until it closes)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _healthy(server: EngineServer) -> bool:
    answer = _post(server, b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}}')
    return answer.status_code == 200 and len(answer.json()["output_ids"]) == 3


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}', "NaN is not a JSON number"),
        (b'{"input_ids": [1], "sampling_params": {"top_p": -Infinity}}', "-Infinity is not a JSON number"),
        (b'{"input_ids": [1], "sampling_params": {"temperature": 1e999}}', "temperature must be a finite"),
        (b'{"input_ids": [1], "sampling_params": {"sampling_seed": 9999999999999999999}}', "seed must be in"),
        (b'{"input_ids": [1], "sampling_params": {"sampling_seed": -1}}', "seed must be in"),
        (b'{"input_ids": [1, 99999999]}', "outside the vocabulary"),
        (b'{"input_ids": [1, ' + b"9" * 5000 + b"]}", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, f"deeper than {MAX_JSON_DEPTH} levels"),
        (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, f"deeper than {MAX_JSON_DEPTH} levels"),
        (b'{"input_ids": [1], ', "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
    ],
    ids=[
        "nan-temperature",
        "infinite-top-p",
        "overflowing-temperature",
        "huge-seed",
        "negative-seed",
        "token-outside-vocab",
        "5000-digit-int",
        "nested-lists",
        "nested-objects",
        "truncated",
        "not-utf8",
        "not-an-object",
    ],
)
def test_malformed_bodies_get_400_and_the_reason(server: EngineServer, body: bytes, reason: str) -> None:
    answer = _post(server, body)
    assert answer.status_code == 400, answer.text
    assert reason in answer.json()["error"]["message"]
    assert len(answer.text) < 400  # the reason, not an echo of the body


def test_the_server_lives_on_after_every_attack(server: EngineServer) -> None:
    for body in (b"[" * 100_000, b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}'):
        _post(server, body)
    assert _healthy(server)


def test_a_body_over_the_cap_is_refused_unread(server: EngineServer) -> None:
    # Only the headers are sent: the 413 comes back without waiting for 50 MB that never arrive.
    started = time.monotonic()
    answer = _raw(server, b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413") and b"over this server's 1048576" in answer
    assert time.monotonic() - started < 5  # it closed the connection instead of reading on
    assert _healthy(server)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (b"Content-Length: -5\r\n", b"400"),
        (b"Content-Length: 12abc\r\n", b"400"),
        (b"Transfer-Encoding: chunked\r\n", b"411"),
        (b"", b"411"),  # a POST without Content-Length
    ],
)
def test_bad_lengths_get_a_client_error(server: EngineServer, headers: bytes, status: bytes) -> None:
    answer = _raw(server, b"POST /generate HTTP/1.1\r\nHost: x\r\n" + headers + b"Connection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]


def test_connections_beyond_the_cap_get_503_and_the_others_go_on(server: EngineServer) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(4)]
    try:
        time.sleep(0.2)  # the server has accepted them: 4 of its 4 connections are open
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert extra.recv(200).startswith(b"HTTP/1.1 503")
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while not _healthy_or_none(server) and time.monotonic() < deadline:
        time.sleep(0.1)  # the slots come back as the server notices the closed sockets
    assert _healthy(server)


def _healthy_or_none(server: EngineServer) -> bool:
    try:
        return _healthy(server)
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_sampling_params_refuse_non_finite_temperatures(bad: float) -> None:
    with pytest.raises(ValueError, match="finite number >= 0"):
        SamplingParams(temperature=bad)


def test_server_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        EngineServer(None, Path("."), port=0, max_body_bytes=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="request_timeout_s"):
        EngineServer(None, Path("."), port=0, request_timeout_s=0)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """A server with the default connection cap and short deadlines (so the tests wait seconds)."""
    model_dir = save_tiny_policy(tmp_path_factory.mktemp("tiny-llama"))
    engine = build_engine(model_dir, max_batch_size=4, seed=0)
    with EngineServer(engine, model_dir, port=0, request_timeout_s=2.0, keep_alive_s=1).start() as srv:
        yield srv


def _until_closed(s: socket.socket) -> bytes:
    chunks = []
    while chunk := s.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _connect(server: EngineServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


@pytest.mark.timeout(60)
def test_300_slow_clients_do_not_stop_a_well_behaved_one(patient: EngineServer) -> None:
    """Slowloris: 300 connections each trickling a request (a byte, then silence) cost the
    server sockets, not threads; a normal client is served at once, and the deadline drops them."""
    slow = [_connect(patient) for _ in range(300)]
    try:
        for s in slow:
            s.sendall(b"P")  # the first byte of "POST /generate ...", and no more for 10 s
        time.sleep(0.5)
        started = time.monotonic()
        assert _healthy(patient)
        assert time.monotonic() - started < 2.0
        # The whole-request deadline (2 s here) answers each slow client 408 and disconnects it.
        time.sleep(2.5)
        answers = [_until_closed(s) for s in slow[:5]]  # the answer, then the server closes
        assert all(a.startswith(b"HTTP/1.1 408") and b"did not arrive whole" in a for a in answers), answers
    finally:
        for s in slow:
            s.close()


def test_a_request_trickled_past_its_deadline_is_answered_408(patient: EngineServer) -> None:
    body = b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}}'
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with _connect(patient) as s:
        s.sendall(head + body[:10])  # the headers at once, the body never completed
        started = time.monotonic()
        answer = s.recv(500)
    assert answer.startswith(b"HTTP/1.1 408") and 1.5 < time.monotonic() - started < 5


def test_idle_keep_alive_connections_close(patient: EngineServer) -> None:
    with _connect(patient) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(200).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert s.recv(200) == b""  # the server closed it after the keep-alive time (1 s here)
        assert time.monotonic() - started < 5


def test_deep_and_large_bodies_and_nan_over_real_sockets(patient: EngineServer) -> None:
    deep = _post(patient, b"[" * 10_000 + b"]" * 10_000)
    assert deep.status_code == 400 and "deeper than 32 levels" in deep.json()["error"]["message"]
    nan = _post(patient, b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}')
    assert nan.status_code == 400 and "NaN is not a JSON number" in nan.json()["error"]["message"]
    started = time.monotonic()  # 20 MB announced, none sent: refused from the headers alone
    big = _raw(patient, b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 20000000\r\n\r\n")
    assert big.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 2
    missing = _raw(patient, b"POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert missing.startswith(b"HTTP/1.1 411") and b"Content-Length" in missing
    assert _healthy(patient)


def test_unknown_paths_and_methods_get_json_errors(patient: EngineServer) -> None:
    missing = httpx.get(f"{patient.url}/no_such_endpoint", timeout=10)
    assert (
        missing.status_code == 404
        and "GET /no_such_endpoint is not served here" in missing.json()["error"]["message"]
    )
    wrong = httpx.delete(f"{patient.url}/generate", timeout=10)
    assert wrong.status_code == 405 and "DELETE /generate" in wrong.json()["error"]["message"]
    assert httpx.head(f"{patient.url}/health", timeout=10).status_code == 200
