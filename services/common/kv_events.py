"""The KV event plane's wire format, shared by the workers that publish it and the routers that read it.

A worker's engine reports cache changes to a ``KvEventListener`` (``stored`` / ``removed`` /
``cleared``, blocks as ``StoredBlock``); services/workers/kv_events.py turns them into NATS
messages, and services/router/events.py (with services/router/core/kv_ingest.py) applies them.
Both sides meet here and nowhere else, so neither service imports the other.

Subjects: ``meshfront.kv.events.<namespace>.<model>.<worker_id>`` (the model name with every character that
NATS subjects reserve replaced by ``_``; the worker's namespace, services/common/namespace.py, so that a router
of one namespace subscribes to its own workers' alone) carries one message per engine tick;
``meshfront.kv.dump.<namespace>.<worker_id>`` (NATS request-reply) answers "which blocks do you hold?".
A worker with data-parallel ranks (services/common/dp_ranks.py) publishes each rank's messages on its one
events subject with the rank in ``dp_rank`` and ``seq`` counted per rank, and answers for each rank on
``meshfront.kv.dump.<namespace>.<worker_id>.dp<rank>``. Message shape::

    {"worker_id": str, "dp_rank": int (a worker with ranks only), "model": str, "seq": int, "published_at_ms": int,
     "events": [{"stored": {"parent_hash": int | None, "blocks": [{"block_hash": int, "tokens_hash": int}]}}
                | {"removed": {"block_hashes": [int]}} | {"cleared": {}}],
     "load": {"active_blocks": int, "waiting": int, "running": int, "total_blocks": int}}

and a dump reply ``{"worker_id", "model", "seq", "blocks": [[block_hash, parent_hash, tokens_hash], ...]}``
(every parent before its children, current as of ``seq``). Blocks follow Dynamo's ``KvCacheEvent`` field
names: ``block_hash`` = the sequence hash, ``tokens_hash`` = the local hash of the block's own tokens.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Protocol

from services.common.namespace import Namespace

EVENTS_PREFIX = "meshfront.kv.events"
DUMP_PREFIX = "meshfront.kv.dump"


@dataclasses.dataclass(frozen=True, slots=True)
class StoredBlock:
    """A block as the KV event plane describes it."""

    # Sequence hash: identifies the block together with its whole prefix.
    block_hash: int
    # Local hash of the block's own tokens (what Dynamo calls tokens_hash).
    tokens_hash: int


class KvEventListener(Protocol):
    """Receives cache changes in the order they happen (synchronously, on the engine's thread)."""

    def stored(self, blocks: Sequence[StoredBlock], parent_hash: int | None) -> None:
        """``blocks`` now form a chain in the cache, following ``parent_hash`` (None: the root)."""

    def removed(self, block_hashes: Sequence[int]) -> None:
        """These blocks (sequence hashes) were evicted."""

    def cleared(self) -> None:
        """Every cached block is gone."""


def subject_token(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"


def events_subject(namespace: Namespace, model: str, worker_id: str) -> str:
    return f"{namespace.subject(EVENTS_PREFIX)}.{subject_token(model)}.{subject_token(worker_id)}"


def dump_subject(namespace: Namespace, worker_id: str, dp_rank: int | None = None) -> str:
    """Where a worker (``dp_rank`` None), or one data-parallel rank of it, answers for its blocks."""
    subject = f"{namespace.subject(DUMP_PREFIX)}.{subject_token(worker_id)}"
    return subject if dp_rank is None else f"{subject}.dp{dp_rank}"


def stored_event(blocks: Sequence[StoredBlock], parent_hash: int | None) -> dict:
    return {"stored": {"parent_hash": parent_hash, "blocks": [
        {"block_hash": b.block_hash, "tokens_hash": b.tokens_hash} for b in blocks]}}


def removed_event(block_hashes: Sequence[int]) -> dict:
    return {"removed": {"block_hashes": list(block_hashes)}}


def cleared_event() -> dict:
    return {"cleared": {}}
