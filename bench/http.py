"""A minimal HTTP/1.1 keep-alive client for streamed POSTs, built on asyncio streams.

The load generator shares two cores with the mesh it measures, so the client must cost as little
CPU as possible: no HTTP library, one ``read`` per arrival, chunked framing undone in a few slices.
It speaks exactly what Envoy answers the OpenAI endpoints with (``Transfer-Encoding: chunked`` for
streams, ``Content-Length`` for errors) and nothing more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

READ_SIZE = 1 << 16


class HttpError(Exception):
    """The server answered with a status other than 200, or broke the framing."""


class ChunkedDecoder:
    """Incremental ``Transfer-Encoding: chunked`` decoder: feed raw bytes, get payload bytes."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need: int | None = None  # payload bytes of the current chunk still to collect
        self._in_trailer = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        out = []
        while not self.done:
            if self._in_trailer:
                self._consume_trailer()
                break
            if self._need is None:
                eol = self._buf.find(b"\r\n")
                if eol < 0:
                    break
                size = int(bytes(self._buf[:eol]).split(b";", 1)[0], 16)
                del self._buf[: eol + 2]
                if size == 0:
                    self._in_trailer = True
                    continue
                self._need = size
            if len(self._buf) < self._need + 2:
                break
            out.append(bytes(self._buf[: self._need]))
            del self._buf[: self._need + 2]
            self._need = None
        return b"".join(out)

    def _consume_trailer(self) -> None:
        # Trailer lines end with an empty line; servers almost never send any, so usually just CRLF.
        while True:
            eol = self._buf.find(b"\r\n")
            if eol < 0:
                return
            line = bytes(self._buf[:eol])
            del self._buf[: eol + 2]
            if not line:
                self.done = True
                return


class Connection:
    """One keep-alive connection; ``post_stream`` may be called again once a response has ended."""

    def __init__(self, host: str, port: int, headers: Sequence[tuple[str, str]] = ()):
        self.host = host
        self.port = port
        # Sent with every request (an API key, a policy class): pre-rendered once.
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def post_stream(self, path: str, body: bytes) -> AsyncIterator[tuple[float, bytes]]:
        """POSTs ``body`` and yields ``(arrival monotonic time, payload bytes)`` per socket read.

        Raises HttpError (with the response body) for a non-200 status. The connection is closed on
        any failure and when the server asks to close, so the next call reconnects.
        """
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\n{self._extra}Content-Length: {len(body)}\r\n\r\n").encode()
        async for item in self._exchange(head + body):
            yield item

    async def get_stream(self, path: str) -> AsyncIterator[tuple[float, bytes]]:
        """GETs ``path``; yields and raises as ``post_stream`` does (a download read as it comes)."""
        async for item in self._exchange(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode()):
            yield item

    async def _exchange(self, request: bytes) -> AsyncIterator[tuple[float, bytes]]:
        if not self.connected:
            await self.connect()
        try:
            self._writer.write(request)
            status, headers = await self._read_head()
            if status != 200:
                body = b"".join([payload async for _, payload in self._read_body(headers)])
                raise HttpError(f"HTTP {status}: {body.decode(errors='replace')[:300]}")
            async for item in self._read_body(headers):
                yield item
            if headers.get("connection", "").lower() == "close":
                self.close()
        except BaseException:
            self.close()
            raise

    async def _read_head(self) -> tuple[int, dict[str, str]]:
        raw = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise HttpError(f"bad status line {lines[0]!r}")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        return int(parts[1]), headers

    async def _read_body(self, headers: dict[str, str]) -> AsyncIterator[tuple[float, bytes]]:
        reader = self._reader
        if "chunked" in headers.get("transfer-encoding", "").lower():
            decoder = ChunkedDecoder()
            while not decoder.done:
                data = await reader.read(READ_SIZE)
                if not data:
                    raise HttpError("connection closed inside a chunked body")
                payload = decoder.feed(data)
                if payload:
                    yield time.monotonic(), payload
        elif "content-length" in headers:
            payload = await reader.readexactly(int(headers["content-length"]))
            yield time.monotonic(), payload
        else:  # read to EOF; the connection cannot be reused
            payload = await reader.read()
            self.close()
            yield time.monotonic(), payload
