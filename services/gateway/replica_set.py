"""The replicas of one stage as the gateway holds them: a channel to each, found from the stage's target.

Some clients cannot leave the choice of replica to gRPC's round robin: a multiplexed stream sticks to
one replica (postprocessor_mux.py), and a request's release must reach the router replica that booked
it (router_replicas.py). So the target is expanded here: ``ipv4:a:1,b:2`` lists the replicas,
``dns:///name:port`` (a headless Kubernetes Service) is resolved now and every ``REFRESH_S``, and any
other target is one replica. A replica that leaves the name is kept while it still has work here
(``load``), and closed once it has none.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import grpc

from services.common import stage_wait
from services.common import tls as mesh_tls
from services.common.grpc_server import PINGED_CHANNEL_OPTIONS
from services.common.targets import split_target

log = logging.getLogger(__name__)

REFRESH_S = 10.0  # how often a dns:/// target is resolved again (new replicas get requests after this)


class Replica(Protocol):
    address: str
    channel: grpc.aio.Channel
    listed: bool  # still in the target's resolution; an unlisted replica gets no new requests

    @property
    def load(self) -> int:
        """Work this client still has on the replica (an unlisted one is closed when it has none)."""

    async def close(self) -> None: ...


R = TypeVar("R", bound=Replica)


class ReplicaSet(Generic[R]):
    """The replicas of ``target``, each made by ``make(address, channel)``."""

    def __init__(self, target: str, stage: str, make: Callable[[str, grpc.aio.Channel], R],
                 tls: mesh_tls.MeshTls | None = None):
        self.stage = stage
        self._make = make
        self._tls = tls
        fixed, self._dns = split_target(target)
        self.replicas: dict[str, R] = {}
        self._reach: dict[str, stage_wait.Reachability] = {}  # address -> its channel's, for readiness
        self._resolved_at = 0.0
        self._resolving: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        for address in fixed:
            self._add(address)

    def _add(self, address: str) -> None:
        options: list[tuple[str, object]] = list(PINGED_CHANNEL_OPTIONS)  # a frozen replica's calls go to others
        if self._tls is not None and self._dns is not None:
            options.append(("grpc.ssl_target_name_override", self._dns[0]))  # the cert names the Service
        channel = mesh_tls.channel(address, options, self._tls)
        self.replicas[address] = self._make(address, channel)
        self._reach[address] = stage_wait.Reachability(channel)

    async def refresh(self) -> None:
        """Resolves a dns target again when it is due (at once while the name lists no replica)."""
        listed = bool(self.listed())
        if self._dns is None or (listed and time.monotonic() - self._resolved_at < REFRESH_S):
            return
        if self._resolving is None or self._resolving.done():
            self._resolving = asyncio.create_task(self._resolve(*self._dns))
        if not listed:
            await asyncio.shield(self._resolving)

    async def _resolve(self, host: str, port: int) -> None:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            log.warning("cannot resolve %s target %s: %s (keeping %d replicas)", self.stage, host, e,
                        len(self.replicas))
            return
        finally:
            self._resolved_at = time.monotonic()
        found = {(f"ipv6:[{info[4][0]}]:{port}" if info[0] == socket.AF_INET6 else f"ipv4:{info[4][0]}:{port}")
                 for info in infos}
        for address in found - self.replicas.keys():
            self._add(address)
        for address, replica in list(self.replicas.items()):
            replica.listed = address in found
            self.forget_if_idle(replica)

    def forget_if_idle(self, replica: R) -> None:
        """Closes ``replica`` when it left the name and has no work here left (nothing more will use it)."""
        if replica.listed or replica.load or self.replicas.get(replica.address) is not replica:
            return
        del self.replicas[replica.address]
        del self._reach[replica.address]
        self._closing.add(asyncio.create_task(replica.close()))
        self._closing = {t for t in self._closing if not t.done()}

    def listed(self) -> list[R]:
        return [r for r in self.replicas.values() if r.listed]

    async def any_connected(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for any listed replica to connect; whether one did."""
        waits = [asyncio.ensure_future(stage_wait.wait_connected(r.channel, timeout_s)) for r in self.listed()]
        try:
            for done in asyncio.as_completed(waits):
                if await done:
                    return True
            return False
        finally:
            for wait in waits:
                wait.cancel()

    def unreachable(self) -> bool:
        """No listed replica is reachable (for /health: see ``stage_wait.Reachability``; cheap). Every one is
        asked, so that each sees its channel's failures as they come."""
        listed = self.listed()
        return bool(listed) and all([self._reach[r.address].unreachable() for r in listed])

    async def close(self) -> None:
        if self._resolving is not None:
            self._resolving.cancel()
        replicas, self.replicas, self._reach = list(self.replicas.values()), {}, {}
        for replica in replicas:
            await replica.close()
        for task in self._closing:
            await task
