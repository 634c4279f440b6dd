"""http_get against a local server only: no traffic ever goes to a non-loopback address."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from srt_agent.tool.definition import Tool
from srt_agent.tool.parser import parse_tool_calls
from srt_agent.tool.toolset import ToolSet
from srt_agent.tools.http_get import (
    FetchFailed,
    FetchRefused,
    HttpGetConfig,
    check_url,
    http_get,
    is_public_address,
    make_http_get_tool,
)

BIG = 1_000_000


class Server(ThreadingHTTPServer):
    daemon_threads = True
    hits: Counter[str]

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the slow handler's client goes away on purpose


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(
        self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8", **headers: str
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.hits[self.path] += 1
        port = self.server.server_address[1]
        routes = {
            "/text": lambda: self.reply(200, "héllo wörld".encode()),
            "/json": lambda: self.reply(200, b'{"answer": 42}', "application/json"),
            "/binary": lambda: self.reply(200, b"\x89PNG\r\n\x1a\n" + bytes(100), "image/png"),
            "/big": lambda: self.reply(200, b"a" * BIG),
            "/host": lambda: self.reply(200, self.headers["Host"].encode()),
            "/missing": lambda: self.reply(404, b"no such page"),
            "/redirect-local": lambda: self.reply(302, b"", Location="/text"),
            "/redirect-absolute": lambda: self.reply(301, b"", Location=f"http://127.0.0.1:{port}/json"),
            "/redirect-private": lambda: self.reply(302, b"", Location="http://10.0.0.1/secret"),
            "/redirect-metadata": lambda: self.reply(307, b"", Location="http://169.254.169.254/latest/"),
            "/redirect-file": lambda: self.reply(302, b"", Location="file:///etc/passwd"),
            "/redirect-loop": lambda: self.reply(302, b"", Location="/redirect-loop"),
        }
        if self.path == "/slow":
            time.sleep(1.5)
            self.reply(200, b"too late")
        else:
            routes.get(self.path, lambda: self.reply(404, b"unknown"))()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server(("127.0.0.1", 0), Handler)
    srv.hits = Counter()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def base(server: Server) -> str:
    server.hits.clear()
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request httpx is asked to send; refused URLs must never appear here."""
    urls: list[str] = []
    original = httpx.AsyncClient.send

    async def spy(self: httpx.AsyncClient, request: httpx.Request, **kw: Any) -> httpx.Response:
        urls.append(str(request.url))
        assert request.url.host == "127.0.0.1", f"test tried to reach {request.url}"
        return await original(self, request, **kw)

    monkeypatch.setattr(httpx.AsyncClient, "send", spy)
    return urls


def local_tool(**kw: Any) -> Tool:
    return make_http_get_tool(allow_hosts=["127.0.0.1"], **kw)


def call(t: Tool, url: str) -> str:
    result: str = asyncio.run(t.fn(url=url))
    return result


# -- fetching from the allowlisted local server ---------------------------------------------------------


def test_fetches_text_with_status_and_content_type(base: str, sent: list[str]) -> None:
    out = call(local_tool(), f"{base}/text")
    assert out == "HTTP 200 OK\nContent-Type: text/plain; charset=utf-8\n\nhéllo wörld"
    assert sent == [f"{base}/text"]


def test_json_and_error_status_are_returned(base: str, sent: list[str]) -> None:
    assert call(local_tool(), f"{base}/json").endswith('\n\n{"answer": 42}')
    assert call(local_tool(), f"{base}/missing").startswith("HTTP 404 Not Found")


def test_binary_body_is_described_not_dumped(base: str, sent: list[str]) -> None:
    out = call(local_tool(), f"{base}/binary")
    assert "[binary content, 108 bytes, not shown]" in out and "PNG" not in out


def test_body_is_cut_at_max_bytes(base: str, sent: list[str]) -> None:
    out = call(local_tool(max_bytes=1000), f"{base}/big")
    body = out.split("\n\n", 1)[1]
    assert body == "a" * 1000 + "\n[body truncated at 1000 bytes]"


def test_slow_endpoint_times_out(base: str, sent: list[str]) -> None:
    t0 = time.monotonic()
    with pytest.raises(FetchFailed, match=r"within 0\.3 s|ReadTimeout"):
        call(local_tool(timeout_s=0.3), f"{base}/slow")
    assert time.monotonic() - t0 < 1.2


def test_redirects_within_the_allowlist_are_followed(base: str, sent: list[str]) -> None:
    out = call(local_tool(), f"{base}/redirect-local")
    assert out.startswith("HTTP 200 OK") and f"Redirected to: {base}/text" in out
    assert call(local_tool(), f"{base}/redirect-absolute").endswith('{"answer": 42}')


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/redirect-private", "'10.0.0.1' is not in the allowlist"),
        ("/redirect-metadata", "'169.254.169.254' is not in the allowlist"),
        ("/redirect-file", "only http and https"),
    ],
)
def test_redirect_to_disallowed_target_is_refused(base: str, sent: list[str], path: str, reason: str) -> None:
    with pytest.raises(FetchRefused, match=reason):
        call(local_tool(), base + path)
    assert sent == [base + path]  # the refused hop was never requested


def test_redirect_loop_stops(base: str, server: Server, sent: list[str]) -> None:
    with pytest.raises(FetchFailed, match="more than 2 redirects"):
        call(local_tool(max_redirects=2), f"{base}/redirect-loop")
    assert server.hits["/redirect-loop"] == 3


# -- refusals happen before any traffic ----------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1/",
        "http://localhost/",
        "http://127.1/",
        "http://2130706433/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "http://10.0.0.1/",
        "http://192.168.1.1/admin",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
    ],
)
def test_non_public_addresses_are_refused_without_allowlist(url: str, sent: list[str]) -> None:
    with pytest.raises(FetchRefused, match="refused"):
        asyncio.run(http_get.fn(url=url))
    assert sent == []


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://example.com/", "/x"])
def test_other_schemes_are_refused(url: str, sent: list[str]) -> None:
    with pytest.raises(FetchRefused, match="only http and https"):
        asyncio.run(http_get.fn(url=url))
    assert sent == []


def test_loopback_not_in_allowlist_is_refused(base: str, server: Server, sent: list[str]) -> None:
    t = make_http_get_tool(allow_hosts=["docs.example.org"])
    with pytest.raises(FetchRefused, match="not in the allowlist"):
        call(t, f"{base}/text")
    with pytest.raises(FetchRefused, match="not in the allowlist"):
        call(t, "https://example.com/")
    assert sent == [] and server.hits["/text"] == 0


def test_request_goes_to_the_checked_address_with_the_original_host(
    base: str, sent: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second DNS answer must not matter: the connection uses the address that passed the check.
    import ipaddress

    from srt_agent.tools import http_get as module

    async def fake_resolve(host: str, port: int) -> list[Any]:
        assert host == "service.test"
        return [ipaddress.ip_address("127.0.0.1")]

    monkeypatch.setattr(module, "_resolve", fake_resolve)
    port = base.rsplit(":", 1)[1]
    out = call(make_http_get_tool(allow_private=True), f"http://service.test:{port}/host")
    assert out.endswith(f"\n\nservice.test:{port}")
    assert sent == [f"{base}/host"]


def test_check_url_pins_public_addresses_and_trusts_listed_hosts() -> None:
    open_cfg = HttpGetConfig()
    assert asyncio.run(check_url(httpx.URL("http://93.184.216.34/"), open_cfg)) == "93.184.216.34"
    listed = HttpGetConfig(allow_hosts=("LocalHost",))
    assert asyncio.run(check_url(httpx.URL("http://localhost:8080/"), listed)) is None


def test_is_public_address() -> None:
    import ipaddress

    assert is_public_address(ipaddress.ip_address("8.8.8.8"))
    assert is_public_address(ipaddress.ip_address("2606:4700::1111"))
    for private in ("127.0.0.1", "10.1.2.3", "172.16.0.1", "169.254.1.1", "::1", "fe80::1", "fc00::1"):
        assert not is_public_address(ipaddress.ip_address(private)), private


# -- through the tool set -------------------------------------------------------------------------------


def test_toolset_turns_refusals_and_timeouts_into_error_messages(base: str, sent: list[str]) -> None:
    tools = ToolSet([local_tool(timeout_s=0.3)], max_output_chars=500)
    text = "".join(
        f'<tool_call>{{"name": "http_get", "arguments": {{"url": "{u}"}}}}</tool_call>'
        for u in (f"{base}/text", "http://169.254.169.254/", f"{base}/slow", f"{base}/big")
    )
    ok, refused, slow, big = asyncio.run(tools.aexecute(parse_tool_calls(text)))
    assert ok.ok and ok.content.endswith("héllo wörld")
    assert refused.content.startswith("Error (error): FetchRefused: ") and "allowlist" in refused.content
    assert slow.content.startswith("Error (error): FetchFailed: ")
    assert big.ok and "[... truncated" in big.content
    assert local_tool(timeout_s=0.3).timeout > 0.3
