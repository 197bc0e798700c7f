"""The Batch API of one gateway replica, put together: its NATS stores, its runner, its two servicers.

The gateway's assembly hands in ``rpcs``: the servicer method that serves each batch endpoint in this process
(a front end may not import another; the assembly sits above them all), and starts ``background``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import grpc
from meshfront.gateway.v1 import batches_pb2_grpc

from services.common.namespace import Namespace
from services.gateway.batch import state
from services.gateway.batch.files import FileStore
from services.gateway.batch.inprocess import InProcess, Rpc
from services.gateway.batch.runner import DEFAULT_CONCURRENCY, BatchRunner
from services.gateway.batch.server import BatchesServicer, FilesServicer, FormParser
from services.gateway.batch.store import BATCHES, LineStore, RecordStore


class BatchApi:
    def __init__(self, nats_url: str, namespace: Namespace, rpcs: Mapping[str, Rpc], parse_form: FormParser, *,
                 max_concurrency: int = DEFAULT_CONCURRENCY):
        self.files = FileStore(nats_url, namespace=namespace)
        self.batches = RecordStore(nats_url, BATCHES, state.valid_id, namespace=namespace)
        self.lines = LineStore(nats_url, namespace=namespace)
        self.runner = BatchRunner(self.batches, self.lines, self.files, InProcess(rpcs),
                                  max_concurrency=max_concurrency)
        self.files_servicer = FilesServicer(self.files, parse_form)
        self.batches_servicer = BatchesServicer(self.runner)

    def add_to(self, server: grpc.aio.Server) -> None:
        batches_pb2_grpc.add_FilesServiceServicer_to_server(self.files_servicer, server)
        batches_pb2_grpc.add_BatchesServiceServicer_to_server(self.batches_servicer, server)

    @property
    def background(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        return [self.files.run, self.batches.run, self.lines.run, self.runner.sweep]

    async def close(self) -> None:
        """The runs first (each hands its batch back through the stores still open), then the stores."""
        await self.runner.close()
        for store in (self.lines, self.batches, self.files):
            await store.close()
