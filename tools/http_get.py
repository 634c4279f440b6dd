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
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import httpx
from pydantic import BaseModel, ConfigDict, Field

from srt_agent.errors import SrtAgentError
from srt_agent.tool.definition import Tool, tool

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript", "application/xhtml")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class FetchRefused(SrtAgentError, ValueError):
    """The URL (or a redirect target) is not allowed; nothing was sent to it."""


class FetchFailed(SrtAgentError, RuntimeError):
    """The request was allowed but did not complete (timeout, connection error, too many redirects)."""


class HttpGetConfig(BaseModel):
    """Policy and limits for :func:`make_http_get_tool`.

    Attributes:
        allow_hosts: Hostnames or IP literals that may be fetched; empty means any public host.
        allow_private: Also allow hosts that resolve to non-public addresses (never needed for listed hosts).
        max_bytes: Body bytes read before the response is cut off.
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
        body: Body bytes (at most ``max_bytes``).
        truncated: True when the body was longer than ``max_bytes``.
        charset: Declared charset, if any.
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

    def render(self) -> str:
        """Status line, content type, redirects, then the body as text (binary bodies are described)."""
        lines = [
            f"HTTP {self.status_code} {self.reason}".rstrip(),
            f"Content-Type: {self.content_type or '-'}",
        ]
        if self.redirects:
            lines.append("Redirected to: " + " -> ".join(self.redirects))
        if _looks_textual(self.content_type, self.body):
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
        raise FetchFailed(f"cannot resolve host {host!r}: {exc}") from None
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
            f"only http and https URLs can be fetched, not {url.scheme or 'a relative'!r} URLs"
        )
    host = url.host.lower().rstrip(".")
    if not host:
        raise FetchRefused(f"URL has no host: {url}")
    allowed = {h.lower().rstrip(".") for h in config.allow_hosts}
    if host in allowed:
        return None
    if allowed:
        raise FetchRefused(f"host {host!r} is not in the allowlist ({', '.join(sorted(allowed))})")
    addresses = await _resolve(host, url.port or (443 if url.scheme == "https" else 80))
    if not addresses:
        raise FetchFailed(f"host {host!r} has no address")
    for ip in addresses:
        if not config.allow_private and not is_public_address(ip):
            raise FetchRefused(
                f"host {host!r} resolves to {ip}, a loopback/private/link-local/reserved address; refused"
            )
    return str(addresses[0])


async def _read_capped(resp: httpx.Response, limit: int) -> tuple[bytes, bool]:
    body = bytearray()
    async for chunk in resp.aiter_bytes():
        body += chunk
        if len(body) > limit:
            return bytes(body[:limit]), True  # stop reading: the rest is never downloaded
    return bytes(body), False


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
                body, truncated = await _read_capped(resp, config.max_bytes)
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
            )
    raise FetchFailed(f"more than {config.max_redirects} redirects (last: {current})")


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
        raise FetchRefused(f"invalid URL {url!r}: {exc}") from None
    except httpx.HTTPError as exc:
        raise FetchFailed(f"request failed: {type(exc).__name__}: {exc}") from None


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
        max_bytes: Body bytes read per response.
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
