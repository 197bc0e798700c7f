"""One engine per data-parallel rank behind one worker: the request's rank picks the engine.

A worker with data-parallel attention ranks (services/common/dp_ranks.py) registers its ranks on its card; the
router books, indexes and loads each rank on its own and sends each request with the rank it chose
(``PreprocessedRequest.dp_rank`` -> ``EngineRequest.dp_rank``). ``RankedEngines`` is the ``Engine`` that
dispatches on it:

- a request with a rank runs on that rank's engine; a rank the worker does not have is the caller's mistake
  (``RequestRejected`` naming ``dp_rank``: INVALID_ARGUMENT), as the router never sends one;
- a request without a rank (a caller that does not route by rank: a pinned warm-up, a test) runs on the rank
  with the fewest sequences running and waiting, lowest rank first.

The mocker builds one ``MockerEngine`` per rank (``--dp-size``), each with its own KV cache, scheduler and KV
event publisher, in one process and one event loop.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping

from services.workers.engine import Engine, EngineOutput, EngineRequest, RequestRejected

# A rank's current work in sequences (running + waiting), for a request that names no rank.
Backlog = Callable[[], int]


class RankedEngines:
    """Implements ``services.workers.engine.Engine`` over one engine per rank."""

    def __init__(self, engines: Mapping[int, Engine], backlog: Mapping[int, Backlog]):
        if not engines or engines.keys() != backlog.keys():
            raise ValueError("one engine and one backlog reader per rank, at least one rank")
        self.engines = dict(sorted(engines.items()))
        self._backlog = backlog

    async def start(self) -> None:
        for engine in self.engines.values():
            await engine.start()

    async def close(self) -> None:
        for engine in self.engines.values():
            await engine.close()

    def engine_for(self, request: EngineRequest) -> Engine:
        if request.dp_rank is None:
            return self.engines[min(self.engines, key=lambda r: (self._backlog[r](), r))]
        engine = self.engines.get(request.dp_rank)
        if engine is None:
            ranks = ", ".join(map(str, self.engines))
            raise RequestRejected(f"this worker has no data-parallel rank {request.dp_rank} (its ranks: {ranks})",
                                  param="dp_rank")
        return engine

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        # The rank's engine's own stream, not one wrapped per output: nothing is added on the token path.
        try:
            engine = self.engine_for(request)
        except RequestRejected as e:
            return _refused(e)  # raised where the stream is read, as an engine's own refusal is
        return engine.generate(request)


async def _refused(error: RequestRejected) -> AsyncGenerator[EngineOutput, None]:
    raise error
    yield  # an async generator (unreachable)
