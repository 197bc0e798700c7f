"""The paired order of a disaggregated attempt: both legs at once, for engines that pair by bootstrap (SGLang).

SGLang's prefill server holds a request until the decode server has connected for the same bootstrap room, and
returns its first token only after the KV went over; its decode server takes the prefill leg's prompt and its
output starts with that same first token (docs/engines.md, "Disaggregation"). The sequential order
(disagg_legs.py) would wait out SGLang's bootstrap timeout. Such a prefill worker announces its bootstrap
(host, port and the room it drew) in a first chunk of its own, before its engine sees the request
(worker.proto, ``GenerateResponse.kv_transfer_params``); the postprocessor, which reads the prefill leg's first
chunk before it picks the attempt's kind (service.py, ``_open_attempt``), then makes the attempt a ``PairedLegs``:

- the **decode leg** opens at once: the request as it is (the prefill leg's prompt, the request's budgets), role
  DECODE, the announced parameters;
- the **first token** goes to the client from whichever leg has it first, once: when the prefill leg's came
  first, the decode leg's copy of it is dropped before the decoder sees it (``_DropFirst``); when the decode
  leg's came first, the prefill leg is cancelled (its work ended with the transfer) and never read again;
- the decode leg's first response names both workers; ``kv_transfer_ms`` is the time from the prefill leg's
  token to the decode leg's first chunk (0 when the decode leg's came first: the transfer delayed nothing);
- **failure**: before the first token, a failed prefill leg blames the prefill worker and cancels the decode leg;
  a decode leg refused for its transfer parameters blames the prefill worker too; any other decode failure
  blames the decode worker, and the request migrates as any other does;
- **cancel**: a hang-up cancels both calls at once. Nothing is released explicitly: SGLang's prefill server
  holds nothing past its leg (it returns only after the transfer), and cancelling the leg aborts it there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import MeshError, WorkerFailed
from services.common.pump import Batch
from services.postprocessor.aggregated import CallReader
from services.postprocessor.attempt import WorkerCall, WorkerClient
from services.postprocessor.disagg_common import drop_leg_budget, name_both_workers, refused_transfer
from services.postprocessor.migration import WorkerRoute


def announces_pairing(message: worker_pb2.GenerateResponse) -> bool:
    """A prefill leg's first chunk that asks for the paired order: transfer parameters before any token."""
    return bool(message.kv_transfer_params) and not message.token_ids and not message.finish_reason


def paired_decode_leg(request: common_pb2.PreprocessedRequest, route: WorkerRoute,
                      kv_transfer_params: bytes) -> worker_pb2.GenerateRequest:
    """The decode leg's worker call in the paired order: the prefill leg's prompt and the request's budgets (its
    output starts with the first token). Built in place, as disagg_legs.prefill_leg is."""
    call = worker_pb2.GenerateRequest()
    leg = call.request
    leg.CopyFrom(request)
    leg.disaggregation.role = common_pb2.DISAGGREGATION_ROLE_DECODE
    leg.disaggregation.kv_transfer_params = kv_transfer_params
    leg.disaggregation.peer_worker_id, leg.disaggregation.peer_address = route.prefill_worker_id, route.prefill_address
    return call


class _DropFirst:
    """The decode leg's call as the decoder reads it: ``pending`` (a ``next_batch`` already asked for) first,
    and the leg's first ``drop`` tokens (and their logprobs) removed: they went out from the prefill leg."""

    def __init__(self, call: WorkerCall, pending: asyncio.Future[Batch[worker_pb2.GenerateResponse]] | None,
                 drop: int):
        self._call, self._pending, self._drop = call, pending, drop

    async def next_batch(self) -> Batch[worker_pb2.GenerateResponse]:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            batch = await pending
        else:
            batch = await self._call.next_batch()
        if self._drop:
            for message in batch.messages:
                dropped = min(self._drop, len(message.token_ids))
                if dropped:
                    del message.token_ids[:dropped]
                    del message.logprobs[:dropped]
                    self._drop -= dropped
        return batch

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._call.cancel()

    def fail(self, error: MeshError) -> None:
        self._call.fail(error)


def _tokens(batch: Batch[worker_pb2.GenerateResponse]) -> bool:
    return any(m.token_ids or m.finish_reason for m in batch.messages)


class PairedLegs:
    """One attempt in the paired order, from its prefill leg's call and first messages (read already, by whoever
    chose the order: the first one ``announces_pairing``); ``blamed`` says whose failure ended it."""

    def __init__(self, route: WorkerRoute, request: common_pb2.PreprocessedRequest, prefill_call: WorkerCall,
                 first: list[worker_pb2.GenerateResponse], workers: WorkerClient, reader: CallReader):
        self.blamed = route.prefill_worker_id
        self._route, self._request = route, request
        self._prefill_call, self._announced, self._rest = prefill_call, first[0], first[1:]
        self._workers, self._reader = workers, reader
        self._prefill_next: asyncio.Future[Batch[worker_pb2.GenerateResponse]] | None = None
        self._decode_next: asyncio.Future[Batch[worker_pb2.GenerateResponse]] | None = None

    async def responses(self) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        """Owns both calls: both are cancelled when it ends."""
        route, request, prefill_call, builder = self._route, self._request, self._prefill_call, self._reader.builder
        decode_call = self._workers.generate(route.address,
                                             paired_decode_leg(request, route, self._announced.kv_transfer_params))
        reader: WorkerCall = decode_call
        decoding = False  # the decode leg sent its first token
        token_at = 0.0  # when the prefill leg's token arrived (0: the decode leg's came first)
        try:
            prefill_messages, decode_first = await self._first_token(prefill_call, decode_call)
            if decode_first is not None:
                # The decode leg has the first token (and the KV): the prefill leg has nothing left to give.
                prefill_call.cancel()
                reader = _Replay(decode_first, decode_call)
            else:
                token_at = time.monotonic()
                drop_leg_budget(prefill_messages, request)
                response = builder.build(prefill_messages)
                reader, self._decode_next = _DropFirst(decode_call, self._decode_next, 1), None
                if response is not None:
                    yield response
                if builder.decoder.finish is not None:
                    return
            self.blamed = route.worker_id
            async for response in self._reader.responses(route.address, reader):
                if not decoding:
                    decoding = True
                    name_both_workers(response, route, token_at)
                yield response
        except MeshError as e:
            if not decoding and refused_transfer(e):
                self.blamed = route.prefill_worker_id  # its bootstrap is gone, not the decode worker
                raise WorkerFailed("the KV transfer from the prefill worker failed") from e
            raise
        finally:
            self._cancel_all(reader, decode_call)

    def _cancel_all(self, reader: WorkerCall, decode_call: WorkerCall) -> None:
        for pending in (self._prefill_next, self._decode_next):
            if pending is not None:
                pending.cancel()
        self._prefill_call.cancel()  # a no-op once a leg ended
        reader.cancel()
        decode_call.cancel()

    async def _first_token(self, prefill_call: WorkerCall, decode_call: WorkerCall,
                           ) -> tuple[list[worker_pb2.GenerateResponse], Batch[worker_pb2.GenerateResponse] | None]:
        """Reads both legs until one has the first token: the prefill leg's messages with tokens (or a
        finish), or the decode leg's first batch with a token (then the first is whatever came before)."""
        prefill_messages = list(self._rest)
        while not any(m.token_ids or m.finish_reason for m in prefill_messages):
            if self._prefill_next is None:
                self._prefill_next = asyncio.ensure_future(prefill_call.next_batch())
            if self._decode_next is None:
                self._decode_next = asyncio.ensure_future(decode_call.next_batch())
            await asyncio.wait((self._prefill_next, self._decode_next), return_when=asyncio.FIRST_COMPLETED)
            if self._decode_next.done():
                batch, self._decode_next = self._decode_next.result(), None
                if _tokens(batch):
                    return prefill_messages, batch
                if batch.error is not None or batch.ended:
                    self.blamed = self._route.worker_id  # or the prefill worker: a refused transfer, in responses
                    raise _leg_error(batch.error, "the decode worker ended the stream without a token")
                continue  # the prefill leg's outcome is read next round if it is ready too
            batch, self._prefill_next = self._prefill_next.result(), None
            prefill_messages.extend(batch.messages)
            if not _tokens(batch) and (batch.error is not None or batch.ended):
                raise _leg_error(batch.error, "the prefill worker ended the stream without a token")
        return [m for m in prefill_messages if m.token_ids or m.finish_reason], None


class _Replay:
    """The decode leg's call after its first batch was read here: that batch again, then the call's own."""

    def __init__(self, first: Batch[worker_pb2.GenerateResponse], call: WorkerCall):
        self._first: Batch[worker_pb2.GenerateResponse] | None = first
        self._call = call

    async def next_batch(self) -> Batch[worker_pb2.GenerateResponse]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._call.next_batch()

    def cancel(self) -> None:
        self._call.cancel()

    def fail(self, error: MeshError) -> None:
        self._call.fail(error)


def _leg_error(error: BaseException | None, ended: str) -> MeshError:
    if isinstance(error, MeshError):
        return error
    return WorkerFailed(ended if error is None else "worker failed")
