"""The gateway's ``RouterClient`` over the mesh: a channel per router replica, and each request's
release and first-token report sent back to the replica that booked it.

Router replicas used to share every booking over NATS, so that a release could land on any of them
(gRPC's round robin sent each call to the next replica). That costs each replica the events of every
request the others route: at four replicas a sixth more CPU per request (bench/RESULTS.md,
2026-12-03). With releases returned to the booking replica, a replica shares only the bookings the
others' decisions read (services/router/events.py), and a round-robin fleet shares none.

So the target is expanded into replicas (replica_set.py). A Route call goes to the connected replica
with the fewest Route calls open, equally loaded ones taking turns: a replica that falls behind (a busy
host, a CPU quota spent) gets fewer until it catches up, where plain turns would queue its share behind
it while the others idle. A call that fails by transport (the replica died or restarts) goes to another
one, and when none is connected a call waits up to ``wait_s`` (``--stage-wait-s``) for one, as
``StageCaller`` does for a single channel. Each replica holds its own releases and reports, which ride
on its next Route or go together after ``releases.FLUSH_S`` (releases.py). A replica that went away
took its bookings with it: what it booked is released nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Container

import grpc
from meshfront.router.v1 import router_pb2, router_pb2_grpc

from services.common import stage_wait
from services.common import tls as mesh_tls
from services.common.error_interceptor import request_id_metadata
from services.common.errors import StageUnavailable, from_rpc_error, ours_in
from services.common.tracing import call_metadata
from services.gateway.releases import RidingReleases
from services.gateway.replica_set import ReplicaSet

log = logging.getLogger(__name__)

RESOLVE_RETRY_S = 0.2  # how soon a dns name that resolved to no replica is asked again, while a call waits
DOWN_S = 2.0  # a replica whose call failed by transport gets no new request for this long while others are usable
_RELEASE_TIMEOUT_S = 5.0


class _Calls:
    """One replica's calls, as ``RidingReleases`` makes them: Route raises what gRPC raised (the caller
    decides whether another replica gets it); a lost release batch only leaves a booking to the replica's
    own end."""

    def __init__(self, channel: grpc.aio.Channel):
        self._stub = router_pb2_grpc.RouterServiceStub(channel)

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        return await self._stub.Route(req, metadata=call_metadata(request_id_metadata(req.request_id)))

    async def release_batch(self, req: router_pb2.ReleaseBatchRequest) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._stub.ReleaseBatch(req, timeout=_RELEASE_TIMEOUT_S)


class _RouterReplica:
    def __init__(self, address: str, channel: grpc.aio.Channel):
        self.address = address
        self.channel = channel
        self.listed = True
        self.down_until = 0.0
        self.riding = RidingReleases(_Calls(channel))
        self.booked = 0  # requests it booked that this gateway has not released yet
        self.routing = 0  # Route calls open on it

    @property
    def load(self) -> int:
        return self.booked

    def usable(self, now: float) -> bool:
        return self.listed and now >= self.down_until and stage_wait.connected(self.channel)

    async def close(self) -> None:
        await self.riding.close()
        await self.channel.close()


class ReplicaRouters:
    """``RouterClient`` over every replica of ``target``."""

    def __init__(self, target: str, tls: mesh_tls.MeshTls | None = None,
                 wait_s: float = stage_wait.DEFAULT_WAIT_S):
        self._wait_s = wait_s
        self._set = ReplicaSet(target, "router", _RouterReplica, tls)
        self._booked_by: dict[str, _RouterReplica] = {}  # request id -> the replica that booked it
        self._turn = 0

    def unreachable(self) -> bool:
        """No listed replica is connected now (for /health; cheap)."""
        return self._set.unreachable()

    async def _pick(self, refused: Container[str], deadline: float | None) -> tuple[_RouterReplica, float | None]:
        """The next connected replica not ``refused``, and the deadline of the wait for one, which starts when
        one is first needed and none is connected; raises ``StageUnavailable`` when none connected by then."""
        while True:
            await self._set.refresh()
            now = time.monotonic()
            ready = [r for r in self._set.replicas.values() if r.usable(now) and r.address not in refused]
            if not ready:  # every one refused, failed or down: any connected one (one may be back)
                ready = [r for r in self._set.listed() if stage_wait.connected(r.channel)]
            if ready:
                fewest = min(r.routing for r in ready)
                tied = [r for r in ready if r.routing == fewest]
                self._turn += 1
                return tied[self._turn % len(tied)], deadline
            deadline = deadline if deadline is not None else now + self._wait_s
            if not self._set.listed() and now < deadline:  # the name resolves to no replica yet: ask again soon
                await asyncio.sleep(min(RESOLVE_RETRY_S, deadline - now))
            elif not await self._set.any_connected(deadline - now):
                log.warning("no router replica reachable for %.1f s", self._wait_s)
                raise StageUnavailable.of("router")

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        refused: dict[str, int] = {}  # replica address -> this request's sends that failed on it by transport
        deadline: float | None = None
        for send in range(1, stage_wait.MAX_SENDS + 1):
            replica, deadline = await self._pick(refused, deadline)
            if replica.address in refused:  # no other replica to try: this one again, after a pause
                await stage_wait.pause_before_resend(refused[replica.address], deadline)
                replica, deadline = await self._pick(refused, deadline)  # it may have gone away meanwhile: wait
            replica.routing += 1
            try:
                # Releases held for this replica ride along; if the call fails they are lost with the replica.
                response = await replica.riding.route(req)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or ours_in(e) is not None:
                    raise from_rpc_error(e) from None  # the router's own answer, not a lost connection
                log.warning("Route to router %s failed (%s; send %d of %d): %s", replica.address, e.code().name,
                            send, stage_wait.MAX_SENDS, e.details())
                replica.down_until = time.monotonic() + DOWN_S
                refused[replica.address] = refused.get(replica.address, 0) + 1
                deadline = time.monotonic() + self._wait_s  # the wait for a replica counts from the failure
                continue
            finally:
                replica.routing -= 1
            self._booked(req.request_id, replica)
            return response
        raise StageUnavailable.of("router")

    def _booked(self, request_id: str, replica: _RouterReplica) -> None:
        before = self._booked_by.get(request_id)
        if before is replica:
            return  # booked again where it was: the router replaces the booking
        if before is not None:  # booked again elsewhere: the first booking is over
            self._released_by(request_id, before)
        self._booked_by[request_id] = replica
        replica.booked += 1

    def _released_by(self, request_id: str, replica: _RouterReplica) -> None:
        replica.booked -= 1
        replica.riding.hold_release(router_pb2.ReleaseRequest(request_id=request_id))
        self._set.forget_if_idle(replica)

    async def release(self, req: router_pb2.ReleaseRequest) -> None:
        if req.first_token:  # the deprecated first-token form: the request goes on
            replica = self._booked_by.get(req.request_id)
            if replica is not None:
                replica.riding.hold_release(req)
            return
        replica = self._booked_by.pop(req.request_id, None)
        if replica is not None:  # else never booked here (its Route failed): nothing to free
            self._released_by(req.request_id, replica)

    async def report_first_token(self, report: router_pb2.FirstTokenReport) -> None:
        replica = self._booked_by.get(report.request_id)
        if replica is not None:
            replica.riding.hold_first_token(report)

    async def release_batch(self, req: router_pb2.ReleaseBatchRequest) -> None:
        for report in req.first_tokens:
            await self.report_first_token(report)
        for release in req.releases:
            await self.release(release)

    async def close(self) -> None:
        """Sends what each replica holds, then closes the channels."""
        await self._set.close()
