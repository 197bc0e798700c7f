"""Streamed writes go out in rounds: every write that became ready in one turn of the event loop is
issued at the end of that turn, together with the others.

Why: a paced engine hands every running request its next token in the same step, and the step's
tokens reach a stage as one multiplexed message. Each request's task then takes its turn: it turns
its tokens into a frame and writes it to its stream. Written as each frame is ready, the frames of
one step leave tens of µs apart, and each goes to the socket alone: one ``sendmsg`` here, and one
wake-up and ``readv`` per frame in Envoy on the other side. Written in a round, back to back, gRPC's
HTTP/2 transport sends the frames that queue behind the first write together, and Envoy reads many
of them at once. Measured through the all-in-one gateway at paced c=128 (bench/RESULTS.md,
"2026-12-03, 14:20-15:35"): Envoy 4.00 -> 1.66 and the gateway 13.35 -> 8.17 CPU ms per request, and
the inter-token latency halved with them. The floor's stand-in gateway (bench/edge_floor.py) writes in rounds
by construction: one ticker wakes every stream at once.

What it costs: a frame waits for the rest of the loop's turn, that is for the other requests whose
tokens came in the same message. A lone stream waits one turn of an idle loop.
"""

from __future__ import annotations

import asyncio
from typing import Any


class WriteRounds:
    """The current round of waiting writes, for the event loop that runs them."""

    __slots__ = ("_loop", "_waiting")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[asyncio.Future[None]] | None = None

    async def turn(self) -> None:
        """Returns at the end of the loop's current turn, with every other write that became ready in it.

        The first writer of a turn opens the round and schedules its release behind the callbacks
        already queued (every task that the same message woke); later writers join it.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        waiting = self._waiting
        # A round opened on another loop (one that stopped before releasing it: a test's) is not this one's.
        if waiting is None or self._loop is not loop:
            waiting = self._waiting = [waiter]
            self._loop = loop
            loop.call_soon(self._release, waiting)
        else:
            waiting.append(waiter)
        await waiter

    def _release(self, waiting: list[asyncio.Future[None]]) -> None:
        if self._waiting is waiting:
            self._waiting = None
        for waiter in waiting:
            if not waiter.done():  # a writer cancelled while it waited (its caller went away)
                waiter.set_result(None)


ROUNDS = WriteRounds()


async def write_in_round(context: Any, message: Any) -> None:
    """``context.write(message)`` at the end of this loop turn's round of writes (the process's one)."""
    await ROUNDS.turn()
    await context.write(message)
