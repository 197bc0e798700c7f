"""Data-parallel attention ranks: what a worker with several engines behind one address is to routing.

A worker started with data-parallel ranks (vLLM's ``--data-parallel-size``, SGLang's ``--dp-size``, the
mocker's ``--dp-size``) runs one engine per rank, each with its own KV cache and its own queue, behind one gRPC
address. Its card says which ranks it has (``WorkerCard.data_parallel_start_rank`` and
``data_parallel_size``, Dynamo's runtime-config names), its KV event messages say which rank each comes from,
and a request to it says which rank runs it (``PreprocessedRequest.dp_rank``).

Routing sees each rank as a target of its own, as Dynamo's ``WorkerWithDpRank`` is: the router's bookings,
KV index, load and sessions are keyed by a *target id*, which is the worker's id for a worker without ranks
(so nothing changes for one) and ``<worker_id>@dp<rank>`` for each rank of a worker with them. Worker ids
may not hold ``@`` (services/workers/config.py), so a target id splits back unambiguously.
"""

from __future__ import annotations

from collections.abc import Sequence

SEPARATOR = "@dp"
# Dynamo's "no rank" value of the x-dp-rank and x-prefill-dp-rank headers (u32::MAX): the header is ignored.
NO_RANK = 4294967295


def target_id(worker_id: str, dp_rank: int | None) -> str:
    """The routing target of one rank of a worker (``dp_rank`` None: the worker has no ranks)."""
    return worker_id if dp_rank is None else f"{worker_id}{SEPARATOR}{dp_rank}"


def split_target(target: str) -> tuple[str, int | None]:
    """(worker id, rank) of a target id; rank None for a worker without ranks."""
    worker, sep, rank = target.rpartition(SEPARATOR)
    if not sep or not rank.isdigit():
        return target, None
    return worker, int(rank)


def ranks_of(start_rank: int, size: int) -> Sequence[int] | None:
    """The ranks a card declares; None for a worker without data-parallel ranks (size 1 from rank 0)."""
    if size <= 1 and start_rank == 0:
        return None
    return range(start_rank, start_rank + max(size, 1))
