"""A real engine's data-parallel ranks as the worker serves them (engine-neutral: no engine import here).

vLLM (``--data-parallel-size``) and SGLang (``--dp-size``) run one engine core or scheduler per rank behind one
client in the worker's process, each with its own KV cache, its own queue and its own KV event publisher. The
engine derives each rank's publisher endpoint from the one it is given: it adds the rank to the port of a
``tcp://`` endpoint and refuses an ``ipc://`` one above rank 0, so a worker with ranks hands the engine a tcp
endpoint (services/workers/{vllm,sglang}/kv_events.py say which) instead of the private ipc:// ones a worker
without ranks uses. Here:

- ``RankSource``: where one rank publishes, and its replay socket;
- ``free_port_run``: a run of free loopback ports, for an engine that adds the rank to a fixed port (SGLang);
- ``RankInFlight``: the worker's requests in flight per rank, so that an idle rank reports no load whatever its
  last scheduler step said;
- ``ranked_kv_events``: one ZMQ subscriber and one ``BlockHashTranslator`` per rank, each feeding that rank's
  listener (``entry.KvEvents.listener(worker, rank, load)``: its own NATS stream, ``dp_rank`` in each message).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import socket
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

from services.common.kv_events import KvEventListener
from services.workers.engine_kv import BlockHashTranslator
from services.workers.engine_kv_zmq import Decoder, ZmqKvSubscriber

Closer = Callable[[], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class RankSource:
    """One rank's KV event publisher, as the worker's subscriber connects to it."""

    rank: int
    endpoint: str
    replay_endpoint: str | None


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port_run(count: int, host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """The first of ``count`` consecutive loopback ports that are free now, below the kernel's ephemeral range.

    The engine binds them later (in its own processes). Below the ephemeral range no outgoing connection or
    port-0 bind takes one in between (services/launcher/plan.py, ``free_port``, for the same reason).
    """
    rng = rng or random.Random()
    low = _ephemeral_low()
    for _ in range(200):
        base = rng.randrange(10_000, low - count)
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    s = held.enter_context(socket.socket())
                    s.bind((host, port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free loopback ports between 10000 and {low}")


class RankInFlight:
    """The worker's requests in flight per rank. A request sent without a rank (the engine places it) is counted
    apart: while one runs, no rank can be called idle."""

    def __init__(self) -> None:
        self._counts: collections.Counter[int | None] = collections.Counter()

    def add(self, rank: int | None) -> None:
        self._counts[rank] += 1

    def remove(self, rank: int | None) -> None:
        self._counts[rank] -= 1

    @contextlib.contextmanager
    def running(self, rank: int | None) -> Iterator[None]:
        self.add(rank)
        try:
            yield
        finally:
            self.remove(rank)

    def idle(self, rank: int | None = None) -> bool:
        """Nothing runs on ``rank`` (None: nothing runs at all)."""
        if rank is None:
            return self.total == 0
        return self._counts[rank] == 0 and self._counts[None] == 0

    @property
    def total(self) -> int:
        return sum(self._counts.values())


def ranked_kv_events(sources: Sequence[RankSource], block_size: int, decoder: Callable[[], Decoder],
                     listener: Callable[[int], KvEventListener | None]) -> list[Closer]:
    """Subscribes to each rank's publisher (a started engine's); returns the closers.

    ``decoder`` makes one payload decoder per rank; ``listener(rank)`` is that rank's listener, None for a
    worker that does not register (then nothing is subscribed).
    """
    closers: list[Closer] = []
    for source in sources:
        sink = listener(source.rank)
        if sink is None:
            continue
        translator = BlockHashTranslator(sink, block_size)  # engine hashes are per cache: one map per rank
        subscriber = ZmqKvSubscriber(source.endpoint, source.replay_endpoint, decoder(), translator.apply)
        subscriber.start()
        closers.append(subscriber.close)
    return closers
