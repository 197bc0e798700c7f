"""Fetching a client's http(s) media URL without letting the client aim the mesh at its own network.

Every hop (the URL and each redirect) is resolved here, every address it resolves to is checked, and
the connection goes to the checked address (the URL's host stays in the Host header and TLS's SNI and
certificate check), so a DNS answer that changes between check and connect (rebinding) cannot reach an
address that was not checked. Non-global addresses (private, loopback, link-local, CGNAT, reserved,
multicast, IPv4-mapped ones included) are refused unless ``MediaLimits.allow_private``. Size, redirect
and time bounds come from ``MediaLimits``. Each refusal is a ``FetchRefused`` that says why, in words fit
for the client (never the address a name resolved to).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable

import httpx

from services.preprocessor.media.limits import MediaLimits

_REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 64 * 1024


class FetchRefused(Exception):
    """The URL was not fetched, or its answer is not acceptable; the message says why."""


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def non_public_kind(ip: IpAddress) -> str | None:
    """What makes ``ip`` non-public, or None for a global unicast address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback however it is spelled
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified:
        return "unspecified"
    if not ip.is_global:
        return "private or reserved"
    return None


async def _resolve(host: str, port: int, refuse: Callable[[IpAddress], str | None] | None) -> str:
    """The address to connect to for ``host``: every address it resolves to is checked, the first is used."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise FetchRefused(f"its host {host!r} does not resolve") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise FetchRefused(f"its host {host!r} does not resolve")
    if refuse is not None:
        for addr in addresses:
            kind = refuse(ipaddress.ip_address(addr.split("%", 1)[0]))
            if kind is not None:
                raise FetchRefused(f"its host {host!r} resolves to a {kind} address, which this deployment does "
                                   "not fetch from (--media-allow-private-urls)")
    return addresses[0]


def _pinned(url: httpx.URL, address: str) -> httpx.URL:
    """``url`` with its host replaced by the checked ``address`` (port kept; httpx brackets an IPv6 one)."""
    return url.copy_with(host=address)


class UrlFetcher:
    """Fetches http(s) URLs within ``limits``; one connection pool for the process.

    ``refuse`` says what makes an address unfetchable (None: fetchable); tests narrow it to prove that every
    address of every hop is checked."""

    def __init__(self, limits: MediaLimits, refuse: Callable[[IpAddress], str | None] = non_public_kind):
        self._limits = limits
        self._refuse = None if limits.allow_private else refuse
        # No proxies from the environment: a proxy would connect to addresses this module never checked.
        self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                         timeout=httpx.Timeout(limits.timeout_s))

    async def close(self) -> None:
        await self._client.aclose()

    async def fetch(self, url: str) -> tuple[bytes, str]:
        """The body and Content-Type of ``url`` after at most ``max_redirects`` redirects."""
        try:
            async with asyncio.timeout(self._limits.timeout_s):
                return await self._follow(url)
        except TimeoutError:
            raise FetchRefused(f"fetching it took longer than {self._limits.timeout_s:g} s") from None

    async def _follow(self, url: str) -> tuple[bytes, str]:
        current = httpx.URL(url)
        for hop in range(self._limits.max_redirects + 1):
            if current.scheme not in ("http", "https") or not current.host:
                raise FetchRefused("it redirects to a URL that is not http(s)" if hop else "it is not an http(s) URL")
            port = current.port or (443 if current.scheme == "https" else 80)
            address = await _resolve(current.host, port, self._refuse)
            headers = {"Host": current.netloc.decode("ascii"), "Accept": "image/*, video/*, audio/*"}
            extensions = {"sni_hostname": current.host} if current.scheme == "https" else {}
            request = self._client.build_request("GET", _pinned(current, address), headers=headers,
                                                 extensions=extensions)
            try:
                response = await self._client.send(request, stream=True)
            except httpx.HTTPError as e:
                raise FetchRefused(f"fetching it failed ({type(e).__name__})") from None
            try:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    current = current.join(response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise FetchRefused(f"fetching it answered HTTP {response.status_code}")
                return await self._body(response), response.headers.get("content-type", "")
            finally:
                await response.aclose()
        raise FetchRefused(f"it redirects more than {self._limits.max_redirects} times")

    async def _body(self, response: httpx.Response) -> bytes:
        limit = self._limits.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise FetchRefused(f"it is {int(declared)} bytes; the limit is {limit}")
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes(_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise FetchRefused(f"it is larger than the {limit}-byte limit")
                chunks.append(chunk)
        except httpx.HTTPError as e:
            raise FetchRefused(f"reading it failed ({type(e).__name__})") from None
        return b"".join(chunks)

