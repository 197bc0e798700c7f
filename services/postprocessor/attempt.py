"""What a request's attempts are made of: calls on workers, and the ``Attempt`` every kind of attempt is.

A request runs as one attempt per route. ``Postprocessor.generate`` picks the attempt's kind once, from its
route (service.py, ``_open_attempt``):

- ``AggregatedAttempt`` (aggregated.py): the whole sequence on one worker;
- ``SequentialLegs`` (disagg_legs.py): a prefill leg, then a decode leg (vLLM, the mocker);
- ``PairedLegs`` (disagg_paired.py): both legs at once, when the prefill leg's first chunk asks for it (SGLang).

An attempt that fails names the worker to blame; the request then moves on to another route with the ids
generated so far (migration.py), into the same builder, as the next attempt.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import MeshError
from services.common.pump import Batch


class WorkerCall(Protocol):
    """One running sequence on a worker."""

    async def next_batch(self) -> Batch[worker_pb2.GenerateResponse]:
        """Every message that arrived since the last call (at least one), and whether the stream then
        ended cleanly or failed (``error``, a ``MeshError`` for a worker failure)."""

    def cancel(self) -> None:
        """Aborts the call (the worker stops generating); safe once it has ended."""

    def fail(self, error: MeshError) -> None:
        """Ends the call with ``error`` as its next outcome (the idle watch's verdict on a silent worker)."""


class WorkerClient(Protocol):
    """Opens Generate calls on workers by address."""

    def generate(self, address: str, request: worker_pb2.GenerateRequest) -> WorkerCall: ...


class Attempt(Protocol):
    """One try at a request's sequence on the workers of one route."""

    # Whose failure ended the attempt: the worker the next route avoids. Read once ``responses`` raised.
    blamed: str

    def responses(self) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        """The request's responses until the sequence finishes (the last one has the finish reason); a
        ``MeshError`` when a worker fails. Closing it cancels every call the attempt has open."""
        ...
