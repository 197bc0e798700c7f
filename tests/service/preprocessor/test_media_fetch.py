"""Fetching media URLs against a real HTTP server on 127.0.0.1: limits, redirects and address checks."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import threading

import pytest

from services.common.errors import InvalidRequest
from services.preprocessor.media.fetch import FetchRefused, UrlFetcher, non_public_kind
from services.preprocessor.media.limits import MediaLimits
from services.preprocessor.media.resolve import MediaResolver
from tests.media_samples import png

pytestmark = pytest.mark.service

CAT = png(56, 56, seed=1)


class Handler(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        Handler.hits.append(self.path)
        path = self.path
        if path == "/cat.png":
            self._send(200, CAT, "image/png")
        elif path == "/host":
            self._send(200, self.headers["Host"].encode(), "text/plain")
        elif path == "/big":
            self._send(200, bytes(4096), "application/octet-stream")
        elif path == "/big-chunked":  # no Content-Length: the limit holds while reading
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(8):
                self.wfile.write(b"400\r\n" + bytes(1024) + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif path.startswith("/hop/"):
            n = int(path.rsplit("/", 1)[1])
            self.send_response(302)
            self.send_header("Location", "/cat.png" if n == 0 else f"/hop/{n - 1}")
            self.end_headers()
        elif path == "/to-other-host":
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.2:{self.server.server_address[1]}/cat.png")
            self.end_headers()
        elif path == "/slow":
            threading.Event().wait(2)
            self._send(200, CAT, "image/png")
        elif path == "/text":
            self._send(200, b"not an image at all", "image/png")
        else:
            self._send(404, b"no", "text/plain")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the client gave up (the timeout test)
            self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def allowing(**kw) -> MediaLimits:
    return MediaLimits(allow_private=True, **kw)


async def test_fetches_an_image_from_an_allowed_loopback_server(server):
    fetcher = UrlFetcher(allowing())
    body, ctype = await fetcher.fetch(f"{server}/cat.png")
    assert body == CAT and ctype == "image/png"
    # Connected to the checked address, the URL's own host kept in the Host header.
    port = server.rsplit(":", 1)[1]
    body, _ = await fetcher.fetch(f"http://localhost:{port}/host")
    assert body == f"localhost:{port}".encode()
    await fetcher.close()


async def test_loopback_is_refused_by_default_before_any_connection(server):
    Handler.hits.clear()
    fetcher = UrlFetcher(MediaLimits())
    for url in (f"{server}/cat.png", server.replace("127.0.0.1", "localhost") + "/cat.png"):
        with pytest.raises(FetchRefused, match="resolves to a loopback address"):
            await fetcher.fetch(url)
    assert Handler.hits == []  # never connected
    await fetcher.close()


@pytest.mark.parametrize(("address", "kind"), [
    ("10.1.2.3", "private or reserved"), ("192.168.0.1", "private or reserved"), ("100.64.0.1", "private or reserved"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("0.0.0.0", "unspecified"), ("224.0.0.1", "multicast"), ("fd00::1", "private or reserved"),
    ("8.8.8.8", None), ("2606:4700::1111", None),
])
def test_address_kinds(address, kind):
    assert non_public_kind(ipaddress.ip_address(address)) == kind


async def test_every_resolved_address_is_checked(monkeypatch):
    import asyncio
    import socket

    loop = asyncio.get_running_loop()

    async def two_addresses(host, port, **kw):  # a name with one public and one private address
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))]

    monkeypatch.setattr(loop, "getaddrinfo", two_addresses)
    fetcher = UrlFetcher(MediaLimits())
    with pytest.raises(FetchRefused, match="resolves to a private or reserved address"):
        await fetcher.fetch("http://mixed.example/cat.png")
    await fetcher.close()


async def test_a_redirect_hop_is_checked_too(server):
    # 127.0.0.1 is allowed here, 127.0.0.2 is not: the redirect's address is checked before connecting to it.
    only_dot_one = lambda ip: None if str(ip) == "127.0.0.1" else "forbidden"  # noqa: E731
    fetcher = UrlFetcher(MediaLimits(), refuse=only_dot_one)
    assert (await fetcher.fetch(f"{server}/cat.png"))[0] == CAT
    Handler.hits.clear()
    with pytest.raises(FetchRefused, match="resolves to a forbidden address"):
        await fetcher.fetch(f"{server}/to-other-host")
    assert Handler.hits == ["/to-other-host"]
    await fetcher.close()


async def test_redirects_are_bounded(server):
    fetcher = UrlFetcher(allowing(max_redirects=2))
    assert (await fetcher.fetch(f"{server}/hop/1"))[0] == CAT  # two redirects
    with pytest.raises(FetchRefused, match="redirects more than 2 times"):
        await fetcher.fetch(f"{server}/hop/2")
    await fetcher.close()


async def test_size_and_time_are_bounded(server):
    fetcher = UrlFetcher(allowing(max_bytes=1000, timeout_s=0.5))
    with pytest.raises(FetchRefused, match="4096 bytes; the limit is 1000"):
        await fetcher.fetch(f"{server}/big")
    with pytest.raises(FetchRefused, match="larger than the 1000-byte limit"):
        await fetcher.fetch(f"{server}/big-chunked")
    with pytest.raises(FetchRefused, match="longer than 0.5 s"):
        await fetcher.fetch(f"{server}/slow")
    with pytest.raises(FetchRefused, match="HTTP 404"):
        await fetcher.fetch(f"{server}/missing")
    await fetcher.close()


class Part:
    def __init__(self, url="", uuid="", modality="image", data="", fmt=""):
        self.modality, self.url, self.data, self.format, self.uuid = modality, url, data, fmt, uuid
        self.message_index, self.part_index = 0, 1


async def test_the_resolver_fetches_each_url_once_and_proves_it_is_an_image(server):
    resolver = MediaResolver(allowing())
    Handler.hits.clear()
    got = await resolver.resolve([Part(f"{server}/cat.png"), Part(f"{server}/cat.png")])
    assert Handler.hits == ["/cat.png"]
    assert got[0] is got[1] and got[0].content == CAT and (got[0].info.width, got[0].info.height) == (56, 56)
    assert got[0].info.mime_type == "image/png"
    with pytest.raises(InvalidRequest, match=r"'messages\[0\].content\[1\].image_url.url': it is not an image") as e:
        await resolver.resolve([Part(f"{server}/text")])
    assert e.value.param == "messages[0].content"
    await resolver.close()


async def test_a_refused_fetch_is_a_400_naming_the_part(server):
    resolver = MediaResolver(MediaLimits())
    with pytest.raises(InvalidRequest, match="image_url.url': its host .* loopback address") as e:
        await resolver.resolve([Part(f"{server}/cat.png")])
    assert e.value.http_status == 400
    await resolver.close()
