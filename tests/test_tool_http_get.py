"""http_get against a local server only: no traffic ever goes to a non-loopback address."""

from __future__ import annotations

import asyncio
import functools
import gzip
import threading
import time
import tracemalloc
import zlib
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from srt_agent.tooling.definition import Tool
from srt_agent.tooling.parser import parse_tool_calls
from srt_agent.tooling.toolset import ToolSet
from srt_agent.tools.http_get import (
    FetchFailed,
    FetchRefused,
    HttpGetConfig,
    _Decoder,
    check_url,
    compressed_cap,
    http_get,
    is_public_address,
    make_http_get_tool,
)

BIG = 1_000_000
TEXT = ("héllo wörld " * 2000).encode()  # 28 KB, compresses well
MIB = 1 << 20


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


# Content-Encoding header and body, per /enc/<name> route: TEXT, compressed as real servers do.
ENCODED = {
    "gzip": ("gzip", gzip.compress(TEXT)),
    "x-gzip": ("x-gzip", gzip.compress(TEXT)),
    "deflate": ("deflate", zlib.compress(TEXT)),
    "deflate-raw": ("deflate", _raw_deflate(TEXT)),
    # Raw deflate whose first two bytes pass as a zlib header (a stored block of 29 bytes, then the rest).
    "deflate-raw-zlib-like": ("deflate", b"\x08\x1d\x00\xe2\xff" + TEXT[:29] + _raw_deflate(TEXT[29:])),
    "stacked": ("gzip, deflate", zlib.compress(gzip.compress(TEXT))),  # gzip applied first
    "stacked-identity": ("identity, gzip", gzip.compress(TEXT)),
    "gzip-members": ("gzip", gzip.compress(TEXT[:10_001]) + gzip.compress(TEXT[10_001:])),
    "gzip-padded": ("gzip", gzip.compress(TEXT) + bytes(100)),
}


@functools.cache
def bomb(coding: str) -> tuple[str, bytes, bytes, int]:
    """A 1 GiB run of zeros, compressed to about 1 MiB without ever building it.

    Returns (Content-Encoding, head, block, count): the body is head + block * count. After a full
    flush the compressor forgets its history, so every further MiB of zeros compresses to the same
    block. There is no trailer: the tool must stop long before the end anyway.
    """
    if coding == "gzip, deflate":  # a bomb inside a bomb: ~1 KB of deflate -> ~1 MiB of gzip -> 1 GiB
        _, head, block, count = bomb("gzip")
        outer = zlib.compressobj(9)
        body = outer.compress(head) + b"".join(outer.compress(block) for _ in range(count))
        return coding, body + outer.flush(), b"", 0
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "deflate-raw": -zlib.MAX_WBITS}[coding]
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    head = c.compress(bytes(MIB)) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(MIB)) + c.flush(zlib.Z_FULL_FLUSH)
    return coding.replace("-raw", ""), head, block, 1023


# Streams that inflate to nothing at all, sent 10 MB long: only the cap on compressed bytes stops them.
PADDING = {
    "deflate": (b"\x78\x9c", b"\x00\x00\x00\xff\xff"),  # zlib header, then empty stored blocks
    "gzip": (b"", gzip.compress(b"")),  # empty gzip members, one after another
}


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

    def stream(self, coding: str, head: bytes, block: bytes, count: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Encoding", coding)
        self.send_header("Content-Length", str(len(head) + len(block) * count))
        self.end_headers()
        try:
            self.wfile.write(head)
            batch = max(1, 65536 // max(1, len(block)))
            for sent in range(0, count, batch):
                self.wfile.write(block * min(batch, count - sent))
        except OSError:
            pass  # the client stopped reading, as it should

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
            "/redirect-long": lambda: self.reply(302, b"", Location="/" + "x" * 10_000),
            "/enc/br": lambda: self.reply(200, b"\x1b\x03\x00\xf8\xa5\x02", **{"Content-Encoding": "br"}),
            "/enc/corrupt": lambda: self.reply(200, b"not gzip at all", **{"Content-Encoding": "gzip"}),
        }
        kind, _, name = self.path.rpartition("/")
        if kind == "/enc" and name in ENCODED:
            coding, data = ENCODED[name]
            self.reply(200, data, **{"Content-Encoding": coding})
        elif kind == "/bomb":
            self.stream(*bomb(name.replace("+", ", ")))
        elif kind == "/padding":
            head, block = PADDING[name]
            self.stream(name, head, block, 10_000_000 // len(block))
        elif self.path == "/slow":
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


# -- compressed bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_compressed_bodies_are_decoded(base: str, sent: list[str], name: str) -> None:
    out = call(local_tool(), f"{base}/enc/{name}")
    assert out == "HTTP 200 OK\nContent-Type: text/plain; charset=utf-8\n\n" + TEXT.decode()


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_decoding_does_not_depend_on_how_the_body_arrives(name: str) -> None:
    coding, data = ENCODED[name]
    codings = [c.strip() for c in coding.split(",") if c.strip() != "identity"]
    for step, ask in [(1, 1), (1, 70_000), (3, 100), (4096, 7), (len(data), 70_000)]:
        decoder, out = _Decoder(codings, 10 * BIG), bytearray()
        for i in range(0, len(data), step):
            decoder.feed(data[i : i + step])
            while piece := decoder.read(ask):
                assert len(piece) <= ask
                out += piece
        assert out == TEXT, (step, ask)


@pytest.mark.parametrize("name", ["gzip", "deflate-raw", "stacked"])
def test_compressed_body_is_cut_at_max_bytes_after_decoding(base: str, sent: list[str], name: str) -> None:
    out = call(local_tool(max_bytes=1000), f"{base}/enc/{name}")
    body = out.split("\n\n", 1)[1]
    assert body == TEXT[:1000].decode(errors="replace") + "\n[body truncated at 1000 bytes]"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "deflate-raw", "gzip+deflate"])
def test_compression_bomb_is_cut_without_inflating_it(base: str, sent: list[str], coding: str) -> None:
    # ~1 MiB on the wire (~1 KB for the stacked one) that inflates to 1 GiB of zeros. Before the fix
    # httpx inflated each 64 KiB network read whole: ~140 MiB peak for the gzip bomb.
    bomb(coding.replace("+", ", "))  # built before measuring
    tool = local_tool(max_bytes=BIG)
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    t0 = time.monotonic()
    try:
        out = call(tool, f"{base}/bomb/{coding}")
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        if not tracing:
            tracemalloc.stop()
    assert time.monotonic() - t0 < 5
    assert out.endswith("\0" * 100 + f"\n[body truncated at {BIG} bytes]")
    assert peak < 16 * MIB, f"peak {peak / MIB:.1f} MiB"


@pytest.mark.parametrize("coding", sorted(PADDING))
def test_stream_that_inflates_to_nothing_is_cut_by_compressed_size(
    base: str, sent: list[str], coding: str
) -> None:
    out = call(local_tool(max_bytes=1000, timeout_s=5), f"{base}/padding/{coding}")
    assert out.endswith("\n\n\n[body truncated at 0 bytes]")
    assert compressed_cap(1000) < 100_000  # far less than the 10 MB the server would send


def test_unknown_encoding_is_described_not_decoded(base: str, sent: list[str]) -> None:
    out = call(local_tool(), f"{base}/enc/br")
    assert out.endswith("\n\n[br-encoded content, 6 bytes, not decoded]")


def test_corrupt_compressed_body_fails(base: str, sent: list[str]) -> None:
    with pytest.raises(FetchFailed, match="cannot decompress the gzip body"):
        call(local_tool(), f"{base}/enc/corrupt")


# -- long URLs are never echoed whole ----------------------------------------------------------------------


def test_huge_url_is_not_repeated_in_the_error(sent: list[str]) -> None:
    url = "http://127.0.0.1/" + "a" * 1_000_000
    with pytest.raises(FetchRefused, match="invalid URL") as info:
        call(local_tool(), url)
    assert len(str(info.value)) < 500
    text = f'<tool_call>{{"name": "http_get", "arguments": {{"url": "{url}"}}}}</tool_call>'
    tools = ToolSet([local_tool()], max_output_chars=10_000_000)
    (result,) = asyncio.run(tools.aexecute(parse_tool_calls(text)))
    assert result.content.startswith("Error (error): FetchRefused: invalid URL") and len(result.content) < 500
    assert sent == []


@pytest.mark.parametrize("url", ["http://" + "h" * 60_000 + ".com/", "ftp" * 20_000 + "://example.com/"])
def test_long_host_or_scheme_is_not_repeated_in_the_refusal(sent: list[str], url: str) -> None:
    with pytest.raises(FetchRefused) as info:
        call(local_tool(), url)
    assert len(str(info.value)) < 500


def test_long_redirect_target_is_not_repeated_in_the_error(base: str, sent: list[str]) -> None:
    with pytest.raises(FetchFailed, match="more than 0 redirects") as info:
        call(local_tool(max_redirects=0), f"{base}/redirect-long")
    assert len(str(info.value)) < 500


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
