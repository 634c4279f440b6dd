"""``http_get``: fetch a web page for the model without letting it reach private networks.

Every hop (the first URL and each redirect, at most ``max_redirects``) is checked *before* any connection:

- the scheme must be ``http`` or ``https``;
- with an allowlist, the host must be on it (exact, case-insensitive match); listed hosts are trusted and
  skip the address check, which is how a test or a local service is reached on purpose;
- any other host is resolved (``getaddrinfo``) and refused if *any* of its addresses is loopback, private,
  link-local (cloud metadata at 169.254.169.254), shared, multicast, reserved or unspecified. The request
  then goes to the checked address (with the original ``Host`` header and TLS server name), so a second DNS
  answer cannot swap in a private address between the check and the connection (DNS rebinding).

Redirects are followed by hand, so each new host gets the same check. Bodies are streamed and cut at
``max_bytes``; connect/read and the whole call share one time limit; proxy variables and ``.netrc`` are
ignored.

Compressed bodies are undone here, not by httpx (which would inflate a whole network read at once, so a
64 KiB read of a gzip bomb became 64 MiB): ``gzip`` (``x-gzip``, several members), ``deflate`` (zlib or
raw) and stacked codings are inflated a piece at a time with ``max_length``, and inflating stops at
``max_bytes``, so at most ``max_bytes`` plus one piece (:data:`PIECE`) of inflated data is ever held. The
compressed bytes read, and those between stacked codings, are capped too (:func:`compressed_cap`), so a
stream that inflates to nothing cannot be read forever. A coding the tool does not know (``br``,
``zstd``, ...) is not undone: the body is kept as it came (capped) and described, not shown. Error
messages echo URLs and hosts through :func:`~srt_agent.errors.shown`, so they stay short whatever the
input.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import zlib
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from srt_agent.errors import SrtAgentError, shown
from srt_agent.tooling.definition import Tool, tool

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript", "application/xhtml")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

PIECE = 64 * 1024
"""Most bytes one inflate step produces (and most compressed bytes passed between stacked codings at once)."""
_GZIP = frozenset({"gzip", "x-gzip"})
_DEFLATE = frozenset({"deflate"})
_GUESS_BYTES = 1024  # a zlib-looking deflate body is retried as raw deflate if it fails this early
_URL_SHOWN = 200  # characters of a URL (or host) an error message may echo


class FetchRefused(SrtAgentError, ValueError):
    """The URL (or a redirect target) is not allowed; nothing was sent to it."""


class FetchFailed(SrtAgentError, RuntimeError):
    """The request was allowed but did not complete (timeout, connection error, too many redirects)."""


class HttpGetConfig(BaseModel):
    """Policy and limits for :func:`make_http_get_tool`.

    Attributes:
        allow_hosts: Hostnames or IP literals that may be fetched; empty means any public host.
        allow_private: Also allow hosts that resolve to non-public addresses (never needed for listed hosts).
        max_bytes: Body bytes kept (after decompression) before the response is cut off; compressed
            bytes read are capped at ``compressed_cap(max_bytes)``.
        timeout_s: Limit for connecting, for each read, and for the whole call including redirects.
        max_redirects: Redirects followed (each re-checked) before giving up.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow_hosts: tuple[str, ...] = ()
    allow_private: bool = False
    max_bytes: int = Field(default=100_000, ge=1)
    timeout_s: float = Field(default=10.0, gt=0)
    max_redirects: int = Field(default=3, ge=0, le=10)


class FetchResult(BaseModel):
    """A fetched response (body already capped).

    Attributes:
        url: Final URL, after redirects.
        redirects: URLs redirected to, in order.
        status_code: HTTP status.
        reason: Reason phrase.
        content_type: The ``Content-Type`` header ('' when absent).
        body: Body bytes (at most ``max_bytes``), decompressed unless ``encoding`` is set.
        truncated: True when the body was longer than ``max_bytes`` (after decompression), or its
            compressed form longer than :func:`compressed_cap` allows.
        charset: Declared charset, if any.
        encoding: The ``Content-Encoding`` the body is still in, when it is one the tool does not undo
            ('' when the body is plain).
    """

    model_config = ConfigDict(frozen=True)

    url: str
    redirects: tuple[str, ...] = ()
    status_code: int
    reason: str
    content_type: str
    body: bytes
    truncated: bool
    charset: str | None = None
    encoding: str = ""

    def render(self) -> str:
        """Status line, content type, redirects, then the body as text (binary bodies are described)."""
        lines = [
            f"HTTP {self.status_code} {self.reason}".rstrip(),
            f"Content-Type: {self.content_type or '-'}",
        ]
        if self.redirects:
            lines.append("Redirected to: " + " -> ".join(self.redirects))
        if self.encoding:
            text = f"[{_clip(self.encoding, 40)}-encoded content, {len(self.body)} bytes, not decoded]"
        elif _looks_textual(self.content_type, self.body):
            text = self.body.decode(self.charset or "utf-8", errors="replace")
        else:
            text = f"[binary content, {len(self.body)} bytes, not shown]"
        cut = f"\n[body truncated at {len(self.body)} bytes]" if self.truncated else ""
        return "\n".join(lines) + "\n\n" + text + cut


def _looks_textual(content_type: str, body: bytes) -> bool:
    ct = content_type.split(";", 1)[0].strip().lower()
    if not ct:
        return b"\x00" not in body[:1024]
    return ct.startswith(_TEXT_TYPES) or ct.endswith(("+json", "+xml"))


def is_public_address(ip: IPAddress) -> bool:
    """True for globally routable unicast addresses (IPv4-mapped IPv6 is judged as its IPv4 address)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_link_local or ip.is_loopback)


async def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchFailed(f"cannot resolve host {shown(host, _URL_SHOWN)}: {_clip(exc)}") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


async def check_url(url: httpx.URL, config: HttpGetConfig) -> str | None:
    """Decide whether ``url`` may be fetched, without contacting it.

    Args:
        url: The URL (first request or redirect target).
        config: The policy.

    Returns:
        The address to connect to, or ``None`` for an allowlisted host (connected to by name).

    Raises:
        FetchRefused: Scheme, host, or a resolved address is not allowed.
        FetchFailed: The host name does not resolve.
    """
    if url.scheme not in ("http", "https"):
        raise FetchRefused(
            f"only http and https URLs can be fetched, not {shown(url.scheme or 'a relative', 40)} URLs"
        )
    host = url.host.lower().rstrip(".")
    if not host:
        raise FetchRefused(f"URL has no host: {shown(str(url), _URL_SHOWN)}")
    allowed = {h.lower().rstrip(".") for h in config.allow_hosts}
    if host in allowed:
        return None
    if allowed:
        listed = _clip(", ".join(sorted(allowed)))
        raise FetchRefused(f"host {shown(host, _URL_SHOWN)} is not in the allowlist ({listed})")
    addresses = await _resolve(host, url.port or (443 if url.scheme == "https" else 80))
    if not addresses:
        raise FetchFailed(f"host {shown(host, _URL_SHOWN)} has no address")
    for ip in addresses:
        if not config.allow_private and not is_public_address(ip):
            raise FetchRefused(
                f"host {shown(host, _URL_SHOWN)} resolves to {ip}, "
                "a loopback/private/link-local/reserved address; refused"
            )
    return str(addresses[0])


def _clip(value: object, limit: int = _URL_SHOWN) -> str:
    """``str(value)`` cut to ``limit`` characters (exception texts may quote a long URL or header)."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compressed_cap(max_bytes: int) -> int:
    """Most compressed bytes read (and passed between stacked codings) for a ``max_bytes`` body.

    Deflate grows incompressible data by well under 1%, plus headers, so a body that decompresses to
    ``max_bytes`` always fits; a stream needing more is padding (empty blocks or members) and is cut.
    """
    return max_bytes + max_bytes // 64 + PIECE


class _Inflater:
    """One ``gzip`` or ``deflate`` coding undone incrementally: :meth:`read` never returns more than asked."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._gzip = coding in _GZIP
        self._obj: Any = zlib.decompressobj(16 + zlib.MAX_WBITS) if self._gzip else None
        self._tail = b""  # input fed but not inflated yet: at most one piece (plus a byte while sniffing)
        # A decompression error is reported; in a later gzip member only once it has produced output,
        # before that the bytes are taken as padding after the last member and ignored.
        self._strict = True
        self._guess = False  # deflate taken as zlib-wrapped from its first two bytes, not yet confirmed
        self._seen = b""  # input used while guessing (at most _GUESS_BYTES), to start over as raw deflate
        self.done = False  # the stream ended; whatever follows it is ignored

    def feed(self, data: bytes) -> None:
        if not self.done:
            self._tail += data

    def read(self, n: int) -> bytes:
        """Up to ``n`` (> 0) inflated bytes from the input fed so far; b'' when that input is used up.

        Called even with no input left: zlib may hold output back when it hit ``n``.
        """
        if self.done:
            return b""
        if self._obj is None:  # deflate: zlib-wrapped as the RFC says, or raw as some servers send
            if len(self._tail) < 2:
                return b""
            cmf, flg = self._tail[0], self._tail[1]
            self._guess = cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0
            self._obj = zlib.decompressobj(zlib.MAX_WBITS if self._guess else -zlib.MAX_WBITS)
        try:
            out: bytes = self._obj.decompress(self._tail, n)
        except zlib.error as exc:
            if self._guess:  # not zlib after all: the same bytes again, as raw deflate
                self._guess, self._obj = False, zlib.decompressobj(-zlib.MAX_WBITS)
                self._tail, self._seen = self._seen + self._tail, b""
                return self.read(n)
            if not self._strict:  # bytes after the last gzip member: padding, ignored
                self.done, self._tail = True, b""
                return b""
            raise FetchFailed(f"cannot decompress the {self.coding} body: {_clip(exc)}") from None
        self._strict = self._strict or bool(out)
        if self._guess:
            self._seen += self._tail[: len(self._tail) - len(self._obj.unconsumed_tail)]
            if out or self._obj.eof or len(self._seen) > _GUESS_BYTES:
                self._guess, self._seen = False, b""
        self._tail = self._obj.unconsumed_tail
        if self._obj.eof:  # what follows the end is all in unused_data (unconsumed_tail may repeat it)
            if self._gzip:  # another member may follow
                self._tail, self._strict = self._obj.unused_data, False
                self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                self.done, self._tail = True, b""
        return out


class _Decoder:
    """Stacked codings, undone last-applied first (``gzip, deflate``: deflate, then gzip), a piece at a time.

    Between two codings at most one piece is held, and at most ``cap`` bytes in all may pass; more sets
    ``over`` and the body is cut.
    """

    def __init__(self, codings: list[str], cap: int) -> None:
        self._stages = [_Inflater(c) for c in reversed(codings)]
        self._passed = [0] * len(self._stages)
        self._cap = cap
        self.over = False

    @property
    def done(self) -> bool:
        return self._stages[-1].done

    def feed(self, raw: bytes) -> None:
        self._stages[0].feed(raw)

    def read(self, n: int) -> bytes:
        """Up to ``n`` decoded bytes from the raw bytes fed so far; b'' when they are used up."""
        return self._pull(len(self._stages) - 1, n)

    def _pull(self, i: int, n: int) -> bytes:
        stage = self._stages[i]
        while not self.over:
            out = stage.read(n)
            if out or stage.done or i == 0:
                return out
            piece = self._pull(i - 1, PIECE)
            if not piece:
                return b""
            self._passed[i] += len(piece)
            if self._passed[i] > self._cap:
                self.over = True
                return b""
            stage.feed(piece)
        return b""


def _codings(resp: httpx.Response) -> list[str]:
    header = resp.headers.get("content-encoding", "")
    return [c for c in (part.strip().lower() for part in header.split(",")) if c and c != "identity"]


async def _read_capped(resp: httpx.Response, limit: int) -> tuple[bytes, bool, str]:
    """The body, cut at ``limit`` bytes after decompression; also whether it was cut, and any coding left.

    Raw bytes are read (httpx's own decoders are not used, see the module notes); reading stops as soon
    as the body is complete, cut, or the compressed bytes pass :func:`compressed_cap`.
    """
    codings = _codings(resp)
    if any(c not in _GZIP | _DEFLATE for c in codings):
        # Not undone: kept as sent, so the caller sees which coding and how many bytes.
        left = ", ".join(codings)
        codings = []
    else:
        left = ""
    body = bytearray()
    if not codings:
        async for chunk in resp.aiter_raw():
            body += chunk
            if len(body) > limit:
                del body[limit:]
                return bytes(body), True, left  # stop reading: the rest is never downloaded
        return bytes(body), False, left
    cap = compressed_cap(limit)
    decoder = _Decoder(codings, cap)
    raw = 0
    async for chunk in resp.aiter_raw():
        raw += len(chunk)
        decoder.feed(chunk)
        while out := decoder.read(min(PIECE, limit + 1 - len(body))):
            body += out
            if len(body) > limit:
                del body[limit:]
                return bytes(body), True, ""
        if decoder.done:
            break  # the stream ended: anything after it is ignored
        if decoder.over or raw > cap:
            return bytes(body), True, ""
    return bytes(body), False, ""


async def _fetch(url: str, config: HttpGetConfig) -> FetchResult:
    current = httpx.URL(url)
    redirects: list[str] = []
    timeout = httpx.Timeout(config.timeout_s)
    headers = {"User-Agent": "srt-agent-http-get/0.1", "Accept-Encoding": "identity"}
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        for _ in range(config.max_redirects + 1):
            pinned = await check_url(current, config)
            hop_headers, extensions = dict(headers), {}
            target = current
            if pinned is not None:
                target = current.copy_with(host=pinned)
                hop_headers["Host"] = current.netloc.decode("ascii")
                if current.scheme == "https":
                    extensions["sni_hostname"] = current.host  # TLS checks the certificate against the name
            request = client.build_request("GET", target, headers=hop_headers, extensions=extensions)
            resp = await client.send(request, stream=True)
            try:
                location = resp.headers.get("location")
                if resp.status_code in _REDIRECTS and location:
                    current = current.join(location)
                    redirects.append(str(current))
                    continue
                body, truncated, encoding = await _read_capped(resp, config.max_bytes)
            finally:
                await resp.aclose()
            return FetchResult(
                url=str(current),
                redirects=tuple(redirects),
                status_code=resp.status_code,
                reason=resp.reason_phrase,
                content_type=resp.headers.get("content-type", ""),
                body=body,
                truncated=truncated,
                charset=resp.charset_encoding,
                encoding=encoding,
            )
    raise FetchFailed(f"more than {config.max_redirects} redirects (last: {shown(str(current), _URL_SHOWN)})")


async def fetch(url: str, config: HttpGetConfig | None = None) -> FetchResult:
    """Fetch ``url`` under the policy, following checked redirects.

    Args:
        url: An http(s) URL.
        config: Policy and limits; the defaults when omitted.

    Returns:
        The response with its body capped at ``config.max_bytes``.

    Raises:
        FetchRefused: The URL or a redirect target is not allowed (nothing was sent to it).
        FetchFailed: Timeout, connection failure, bad URL, or too many redirects.
    """
    cfg = config or HttpGetConfig()
    try:
        return await asyncio.wait_for(_fetch(url, cfg), cfg.timeout_s)
    except asyncio.TimeoutError:
        raise FetchFailed(f"no complete response within {cfg.timeout_s:g} s") from None
    except httpx.InvalidURL as exc:
        raise FetchRefused(f"invalid URL {shown(url, _URL_SHOWN)}: {_clip(exc)}") from None
    except httpx.HTTPError as exc:
        raise FetchFailed(f"request failed: {type(exc).__name__}: {_clip(exc)}") from None


def make_http_get_tool(
    allow_hosts: tuple[str, ...] | list[str] = (),
    allow_private: bool = False,
    max_bytes: int = 100_000,
    timeout_s: float = 10.0,
    *,
    max_redirects: int = 3,
    name: str = "http_get",
) -> Tool:
    """Build an ``http_get`` tool with its own policy.

    Args:
        allow_hosts: Hosts that may be fetched (exact names or IP literals); empty means any public host.
        allow_private: Allow non-listed hosts that resolve to private/loopback addresses.
        max_bytes: Body bytes kept per response (after decompression).
        timeout_s: Time limit for the whole call.
        max_redirects: Redirects followed, each checked like the first URL.
        name: The tool's name.

    Returns:
        An async tool; its own timeout is slightly longer than ``timeout_s`` so the fetch reports first.
    """
    cfg = HttpGetConfig(
        allow_hosts=tuple(allow_hosts),
        allow_private=allow_private,
        max_bytes=max_bytes,
        timeout_s=timeout_s,
        max_redirects=max_redirects,
    )

    async def http_get(url: str) -> str:
        """Fetch a web page with HTTP GET and return its status, content type and text.

        Args:
            url: An http:// or https:// URL on a public host.
        """
        return (await fetch(url, cfg)).render()

    return tool(name=name, timeout=cfg.timeout_s + 2.0)(http_get)


http_get = make_http_get_tool()
