"""A store kept in NATS JetStream, reached on its own connection: the base of every such store.

The gateway's Responses store (services/gateway/responses_api/store.py), its video jobs
(services/gateway/videos/job_store.py) and its media store (services/gateway/media/store.py), and the
preprocessors' shared media uuids (services/preprocessor/media/uuid_store.py) each keep a bucket or a
stream in NATS. They reach it the same way, here:

- the connection is opened in the background, retrying until NATS answers (``run``, a service's
  background task, or the store's first use), so a service starts without NATS;
- a call made before NATS answers waits at most ``wait_s``, and a NATS call that fails (NATS away, a
  stream without a leader past the failover wait) is wrapped in ``unavailable_on_nats_failure``: both
  raise ``StoreUnavailable``, the one way a store says NATS is away. The gateway's stores let it reach
  the client as a 503; the uuid store, which never fails a request, reads it as a miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Generic, TypeVar

import grpc
import nats
import nats.errors
from nats.js import JetStreamContext

from services.common.errors import MeshError
from services.common.nats_connection import close_nats, connect_retrying, retry_until_open

H = TypeVar("H")
# What a NATS call raises when NATS cannot be reached or does not answer in time.
NATS_FAILURES = (TimeoutError, nats.errors.Error, OSError)

log = logging.getLogger(__name__)


class StoreUnavailable(MeshError):
    """NATS did not answer: a 503 like every other missing dependency."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    openai_type = "service_unavailable"
    reason = "STORE_UNAVAILABLE"


@contextlib.contextmanager
def unavailable_on_nats_failure(doing: str, hint: str = "") -> Iterator[None]:
    """A NATS call that fails inside is ``StoreUnavailable("could not <doing> (<why>)<hint>")``.

    A NATS answer that means something to the caller (a key not found, a lost compare-and-set) is caught
    inside, before it gets here: every nats-py error is a ``nats.errors.Error``.
    """
    try:
        yield
    except NATS_FAILURES as e:
        raise StoreUnavailable(f"could not {doing} ({e or type(e).__name__}){hint}") from None


class NatsStore(Generic[H]):
    """One store's connection and its open bucket or stream (``H``: what ``_open`` returns).

    ``what`` names the store in its 503 ("the media store (NATS at ...) is not reachable") and in the log;
    ``client_name`` is the connection's name as NATS shows it; ``call_timeout_s`` bounds each JetStream
    API call made through the context ``jetstream`` returns.
    """

    def __init__(self, nats_url: str, *, what: str, client_name: str, wait_s: float, call_timeout_s: float):
        self.nats_url = nats_url
        self.wait_s = wait_s
        self._what = what
        self._client_name = client_name
        self._call_timeout_s = call_timeout_s
        self._nc: nats.NATS | None = None
        self._js: JetStreamContext | None = None
        self._handle: H | None = None
        self._opening: asyncio.Task[H] | None = None

    async def _open(self, js: JetStreamContext) -> H:
        """Opens (or creates) the store's bucket or stream; called again until it succeeds."""
        raise NotImplementedError

    async def _connect(self) -> H:
        self._nc = await connect_retrying(self.nats_url, self._client_name)
        js = self._nc.jetstream(timeout=self._call_timeout_s)
        handle = await retry_until_open(lambda: self._open(js), self._what)
        self._js, self._handle = js, handle
        return handle

    def _start(self) -> asyncio.Task[H]:
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect())
        return self._opening

    async def run(self) -> None:
        """Connects and opens the store, retrying until NATS answers: a service's background task (a cancel
        ends the wait)."""
        await self._start()

    @property
    def ready(self) -> bool:
        return self._handle is not None

    async def opened(self) -> H:
        """The open bucket or stream, connecting first if nothing has; ``StoreUnavailable`` when NATS has
        not answered within ``wait_s``."""
        if self._handle is not None:
            return self._handle
        opening = self._start()
        if not opening.cancelled():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.wait_s):
                    return await asyncio.shield(opening)
        # Where NATS is stays in the log: a client's error names no internal address.
        log.warning("the %s (NATS at %s) is not reachable", self._what, self.nats_url)
        raise StoreUnavailable(f"The {self._what} is unavailable right now; try again.")

    async def jetstream(self) -> JetStreamContext:
        """The JetStream context the store was opened with (for writes that go through the stream)."""
        await self.opened()
        assert self._js is not None  # set with the handle
        return self._js

    async def connection(self) -> nats.NATS:
        """The store's NATS connection once the store is open: for a core subscription beside its JetStream calls."""
        await self.opened()
        assert self._nc is not None  # set before the handle
        return self._nc

    async def close(self) -> None:
        """Stops connecting and lets go of NATS; a later call would connect again."""
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        await close_nats(self._nc)
        self._nc, self._js, self._handle, self._opening = None, None, None, None
