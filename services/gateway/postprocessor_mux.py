"""The gateway's multiplexed ``PostprocessorClient``: one ``GenerateStream`` per postprocessor replica.

The gateway's only client of this hop (a stream per request, ``--postprocessor-transport unary``, was
measured against it and removed: bench/RESULTS.md). With a stream per request, every response the
postprocessor sends is one gRPC message on this hop, and with a paced engine that is one per token per
request. On a shared stream the postprocessor sends the responses of every request that left the same
engine step in one message, so this hop costs one message per engine step, as the worker hop does
(services/common/mux_client.py, mux_session.py).

A stream sticks to one replica, where a per-request call goes to the next replica of the channel's
round robin. So the target is expanded into replicas (replica_set.py). Each request goes to the
usable replica with the fewest open requests, equally loaded ones taking turns. A replica that
leaves the name keeps its stream until its requests end. One that drains refuses new requests
(``Draining``): the request starts on another replica. One whose stream breaks (SIGKILL, a crash, a
restart) loses the decode state of every request it was running; each of them moves to another
replica, or to the same one once it is back: from the start when our caller got nothing yet,
otherwise *resumed*. Every response names the worker token ids it accounts for; this client keeps
those of the responses it passed on, and sends them as ``GenerateRequest.resume``, which the new
replica replays with its output dropped before it continues the sequence on the worker, so that the
caller sees one uninterrupted stream (services/postprocessor/service.py). An error the
postprocessor itself sent (a worker failure it could not migrate, a bad request) is the caller's,
never retried here. A request moves at most ``MAX_SENDS`` times, or once per replica when there are
more: a request that kills every replica it lands on stops there.

A broken replica is passed over for ``DOWN_S``; its next request opens a fresh stream. A request that goes
back to the replica it was lost on (no other takes it) waits ``stage_wait.RETRY_BACKOFF_S`` first, doubled each
time: that replica's closing connection can read READY for a moment after it cut the stream. When no replica
is connected (the one replica restarting), a request waits up to ``wait_s`` (``--stage-wait-s``) for one
to connect, then fails with "the postprocessor is unavailable".
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import AsyncIterator

import grpc
from google.rpc import status_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc

from services.common import stage_wait
from services.common import tls as mesh_tls
from services.common.errors import Draining, MeshError, StageUnavailable, WorkerFailed, from_status_proto
from services.common.mux_client import MuxStream, Wire
from services.gateway.replica_set import ReplicaSet

log = logging.getLogger(__name__)

DOWN_S = 2.0  # a replica whose stream broke gets no new request for this long while others are usable


def _stream_error(e: grpc.aio.AioRpcError, address: str) -> MeshError:
    # A whole stream breaks by transport (the replica died or restarted), never with one request's
    # error: its details name hosts and sockets, so they go to the log and the client gets a fixed text.
    log.warning("postprocessor %s stream failed: %s %s", address, e.code().name, e.details())
    return WorkerFailed("the postprocessor serving this request went away")


def _chunk_error(status: status_pb2.Status, address: str) -> MeshError:
    return from_status_proto(status)  # the postprocessor's own domain errors, as a per-request call gets them


def _start(seq_id: int, request: postprocessor_pb2.GenerateRequest) -> postprocessor_pb2.GenerateStreamRequest:
    """Filled in place: nested constructors copy the prompt at every level (0.4 ms at 6k tokens, one copy 0.1)."""
    message = postprocessor_pb2.GenerateStreamRequest()
    message.start.id = seq_id
    message.start.request.CopyFrom(request)
    return message


def _wire(channel: grpc.aio.Channel) -> Wire:
    stub = postprocessor_pb2_grpc.PostprocessorServiceStub(channel)
    return Wire(
        open=stub.GenerateStream,
        start=_start,
        cancel=lambda seq_id: postprocessor_pb2.GenerateStreamRequest(
            cancel=postprocessor_pb2.GenerateStreamCancel(id=seq_id)),
        stream_error=_stream_error, chunk_error=_chunk_error,
        ended=lambda address: WorkerFailed("the postprocessor ended the stream"), peer="postprocessor")


def _resumed(req: postprocessor_pb2.GenerateRequest, delivered: array[int]) -> postprocessor_pb2.GenerateRequest:
    """``req`` to continue after the output of ``delivered`` (the ids of every response passed on)."""
    resumed = postprocessor_pb2.GenerateRequest()
    resumed.CopyFrom(req)
    resumed.resume.token_ids.extend(delivered)
    return resumed


class _Replica:
    """One postprocessor replica: its channel, and its current stream (a new one after a break)."""

    def __init__(self, address: str, wire: Wire, channel: grpc.aio.Channel):
        self.address = address
        self.wire = wire
        self.channel = channel
        self.stream: MuxStream | None = None
        self.listed = True  # still in the target's resolution; an unlisted replica gets no new requests
        self.down_until = 0.0  # its stream broke: other replicas get new requests until then

    @property
    def load(self) -> int:
        return self.stream.open_calls if self.stream is not None and not self.stream.broken else 0

    def usable(self, now: float) -> bool:
        return self.listed and now >= self.down_until and (self.stream is None or not self.stream.draining)

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.close()
        await self.channel.close()

    def open_stream(self) -> MuxStream:
        if self.stream is None or not self.stream.usable:
            self.stream = MuxStream(self.wire, self.address)
        return self.stream


class MuxPostprocessor:
    """``PostprocessorClient`` over one ``GenerateStream`` per replica of ``target``."""

    def __init__(self, target: str, tls: mesh_tls.MeshTls | None = None,
                 wait_s: float = stage_wait.DEFAULT_WAIT_S):
        self._wait_s = wait_s
        self._set = ReplicaSet(target, "postprocessor", lambda address, ch: _Replica(address, _wire(ch), ch), tls)
        self._turn = 0  # which of several equally loaded replicas is next

    async def _pick(self, refused: dict[str, int]) -> _Replica:
        await self._set.refresh()
        now = time.monotonic()
        candidates = [r for r in self._set.replicas.values() if r.usable(now) and r.address not in refused]
        if not candidates:
            # Every replica refused, failed or left: try the listed ones once more (one may be back).
            candidates = self._set.listed()
        if not candidates:
            raise WorkerFailed("no postprocessor replica is known")
        # Connected replicas first (asking the others to connect): a channel that is not connected fails a new
        # stream when its connection attempt fails. Ties take turns: at low load every replica has nothing
        # open, and the first would get it all.
        ranked = [((not stage_wait.connected(r.channel), r.load), r) for r in candidates]
        best = min(rank for rank, _ in ranked)
        tied = [r for rank, r in ranked if rank == best]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def unreachable(self) -> bool:
        """No listed replica is connected now (for /health; cheap)."""
        return self._set.unreachable()

    async def _pick_connected(self, refused: dict[str, int], deadline: float | None,
                              request_id: str) -> tuple[_Replica, float | None]:
        """A replica to send to, and the deadline of the wait for one, which starts when one is first needed
        and none is connected; raises ``StageUnavailable`` when none connected by then."""
        replica = await self._pick(refused)
        if stage_wait.connected(replica.channel):
            return replica, deadline
        # Connected replicas rank first, so none is: wait for one to connect (a restart), then pick again.
        deadline = deadline if deadline is not None else time.monotonic() + self._wait_s
        if not await self._set.any_connected(deadline - time.monotonic()):
            log.warning("no postprocessor replica reachable for %.1f s; request %s fails", self._wait_s, request_id)
            raise StageUnavailable.of("postprocessor")
        return await self._pick(refused), deadline

    async def generate(self, req: postprocessor_pb2.GenerateRequest
                       ) -> AsyncIterator[list[postprocessor_pb2.GenerateResponse]]:
        refused: dict[str, int] = {}  # replica address -> this request's sends it lost or refused
        attempts = 0  # every replica once, and at least MAX_SENDS in all (the one replica restarting)
        deadline: float | None = None  # set when a request first has to wait for a connection
        # The token ids of every response passed on: what a resume replays. Four bytes an id, where a list
        # holds an 8-byte pointer to a 28-byte int (ids above 256 are not shared): a gateway holds every
        # open stream's ids, and a long one's run to tens of thousands.
        delivered = array("I")
        answered = False
        sent = req
        while True:
            replica, deadline = await self._pick_connected(refused, deadline, req.request.request_id)
            if replica.address in refused:  # no other replica to take it: this one again, after a pause
                await stage_wait.pause_before_resend(refused[replica.address], deadline)
                replica, deadline = await self._pick_connected(refused, deadline, req.request.request_id)
            stream = replica.open_stream()
            call = stream.start(sent)
            try:
                while True:
                    # Everything that arrived for this request since the last ask: one HttpBody downstream.
                    batch = await call.next_batch()
                    if batch.messages:
                        answered = True
                        for message in batch.messages:
                            delivered.extend(message.token_ids)
                        yield batch.messages
                    if batch.error is not None:
                        raise batch.error
                    if batch.ended:
                        return
            except MeshError as e:
                attempts += 1
                # The replica refused the request (draining) or went away (its stream broke: dead, restarting),
                # rather than failing it: the request moves to another replica, resumed if our caller got output.
                lost = e is stream.failure
                if not (lost or isinstance(e, Draining)) or \
                        (attempts > len(self._set.replicas) and attempts >= stage_wait.MAX_SENDS):
                    raise
                if lost:
                    replica.down_until = time.monotonic() + DOWN_S
                    deadline = time.monotonic() + self._wait_s  # the wait for a replica counts from the break
                refused[replica.address] = refused.get(replica.address, 0) + 1
                if answered:
                    sent = _resumed(req, delivered)
                log.info("postprocessor %s %s; %s request %s on another replica after %d tokens", replica.address,
                         "is unreachable" if lost else "is draining", "resuming" if answered else "starting",
                         req.request.request_id, len(delivered))
            finally:
                call.cancel()  # no-op when it ended; tells the postprocessor when our caller went away

    async def close(self) -> None:
        await self._set.close()
