"""A loopback TCP proxy that can freeze: a stand-in for a peer that is SIGSTOPped or on a wedged host.

While frozen it reads nothing in either direction and closes nothing, which is what a frozen process
looks like from outside: its connections stay open, its kernel still acknowledges bytes, and no
answer ever comes, not even to an HTTP/2 ping. Used where the frozen peer runs in the test's own
process (a SIGSTOP there would stop the test too).
"""

from __future__ import annotations

import asyncio
import contextlib


class FrozenProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host:port) until ``freeze()``."""

    def __init__(self, target: str):
        self._host, port = target.rsplit(":", 1)
        self._port = int(port)
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task] = set()
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self._thawed.clear()

    async def _connect(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection(self._host, self._port)
        for src, dst in ((client_r, upstream_w), (upstream_r, client_w)):
            task = asyncio.create_task(self._pump(src, dst))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._thawed.wait()  # frozen: nothing is read, so nothing is answered
                data = await src.read(65536)
                if not data:
                    break
                await self._thawed.wait()
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    async def close(self) -> None:
        for task in list(self._pumps):
            task.cancel()
        for task in list(self._pumps):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
