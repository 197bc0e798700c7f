"""NATS KV watches that sleep while nothing changes, and that know when their first values are all in.

nats-py (2.16) runs every ordered consumer, which every ``KeyValue.watch`` is, with a task that wakes
every 0.25 s for the watch's whole life to see whether a flow-control reply is due. Four wake-ups a
second per watch were the largest idle cost of a mesh process (bench/idle.py): each stage watches the
worker bucket, the gateway more. JetStream asks for a flow-control reply only while a consumer has a
backlog (a watch's first values, a burst of changes), and the reply is due once the messages before the
request are delivered. ``quiet_flow_control`` stops the poller and starts the same check only when the
server has asked: at rest the watch wakes for its updates and its idle heartbeat, nothing else.

This reaches into nats-py's subscription state (``_jsi``) by name: no defaults, so a nats-py that
renames it fails here at the first watch, loudly (the pin in pyproject.toml is <2.17).

A watch starts with the bucket's current values, one per key, then a ``None`` marker. nats-py sends the
marker early when the consumer's info says nothing is pending and nothing was received yet: on a loaded
machine that answer can overtake values the server has already sent. ``FirstValues`` counts the keys from
the stream first (``key_count``) and says the first values are in once that many came, marker or not.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

# How often a pending flow-control reply is checked while one is pending (nats-py's own period).
_PENDING_POLL_S = 0.25


def quiet_flow_control(watcher: KeyValue.KeyWatcher) -> KeyValue.KeyWatcher:
    """Replaces ``watcher``'s always-on flow-control poller with one that runs only while a reply is due."""
    jsi: Any = watcher._sub._sub._jsi  # type: ignore[union-attr]  # the PushSubscription's Subscription's state
    if jsi._fctask is not None:
        jsi._fctask.cancel()
        jsi._fctask = None
    schedule = jsi.schedule_flow_control_response

    def schedule_and_check(reply: str) -> None:
        schedule(reply)
        if jsi._fctask is None or jsi._fctask.done():
            jsi._fctask = asyncio.create_task(_reply_when_delivered(jsi))  # unsubscribe cancels it

    jsi.schedule_flow_control_response = schedule_and_check
    return watcher


async def _reply_when_delivered(jsi: Any) -> None:
    """nats-py's ``check_flow_control_response``, ending once the reply is sent."""
    while jsi._fcr is not None and not jsi._conn.is_closed:
        if jsi._fciseq - jsi._psub._pending_queue.qsize() >= jsi._fcd:
            reply, jsi._fcr, jsi._fcd = jsi._fcr, None, 0
            with contextlib.suppress(nats.errors.Error):  # NATS away: the server resends its request
                await jsi._conn.publish(reply)
            return
        await asyncio.sleep(_PENDING_POLL_S)


async def key_count(js: JetStreamContext, bucket: str, keys: str) -> int:
    """How many keys of ``bucket`` the watch filter ``keys`` matches now, deleted ones included: a KV stream keeps
    each key's last message (a value or a delete marker), and a new watch delivers one entry per key."""
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.{keys}")
    return len(info.state.subjects or {})


class FirstValues:
    """Whether a new watch has delivered every key its bucket held when ``key_count`` counted them.

    A key can go between the count and the watch (its TTL ran out) and never come: a watch quiet for a while
    after nats-py's marker has nothing more to hand over (``quiet``).
    """

    def __init__(self, expected: int):
        self.expected = expected
        self._seen: set[str] | None = set() if expected else None  # None once complete
        self._marked = False

    @property
    def complete(self) -> bool:
        return self._seen is None

    def took(self, entry: KeyValue.Entry | None) -> bool:
        """Notes one update of the watch (``None``: the marker); whether the first values are all in now."""
        if self._seen is None:
            return True
        if entry is None:
            self._marked = True
        else:
            self._seen.add(entry.key)
            if len(self._seen) >= self.expected:
                self._seen = None
        return self._seen is None

    def quiet(self) -> bool:
        """The watch had nothing for a while; whether the first values count as all in now."""
        if self._seen is not None and self._marked:
            self._seen = None
        return self._seen is None
