"""The mocker's side of disaggregated prefill and decode: blocks held for a transfer, and the pull.

A request's transfer parameters are a JSON object shaped like vLLM's ``kv_transfer_params``, so that
the postprocessor treats the mocker and a real engine alike:

- the prefill leg asks ``{"do_remote_decode": true}``: the mocker computes the prefill, emits one token
  and, instead of freeing the sequence's KV blocks, keeps them under a handle (``KvHolds``). Its last
  output carries ``{"do_remote_prefill": true, "remote_engine_id": <worker id>, "remote_address":
  <its gRPC address>, "remote_handle": <handle>, "remote_num_tokens": <prompt tokens held>}``;
- the decode leg sends those back to the decode worker, which pulls the blocks from the prefill worker
  (``KvPuller``: the ``KvTransferService.PullKv`` RPC on the prefill worker's own port, transfer_grpc.py)
  and waits out the transfer time the bytes would take (``TransferSettings``); the pull frees the
  prefill worker's blocks at once. The decode worker then stores them in its own cache (its KV events
  show them) and decodes, its prompt all cached.

With ``--kv-transfer-overlap`` the transfer overlaps the prefill, as SGLang's Mooncake transfer does
layer by layer: the prefill worker announces the hold's parameters before it computes anything (an
output with no tokens, ``"pipelined": true``), so that the postprocessor opens the decode leg at once (the paired
order, services/postprocessor/disagg_paired.py); the decode worker's pull waits at the prefill worker until the
prompt is computed, and the answer says when each step computed its share (``ComputedKv``). The decode worker
then waits only for what its link (the same bytes over the same bandwidth) could not have moved while the prefill
ran (``exposed_seconds``): each step's KV leaves layer by layer as the layers finish, and nothing leaves before
the pull arrived. The first token comes with the KV, as SGLang's decode server takes it, so the decode worker's
first step computes the second. Without it (the default, as vLLM's NIXL connector pulls) the order is sequential: the
parameters come with the prefill leg's token, and the whole transfer starts at the pull. In the paired order the
prefill leg's token goes out at once, but its finish only once the decode leg pulled: a caller who cancels the
leg instead (the answer needed no decode leg, the client left) frees the hold, as cancelling SGLang's does.

A hold ends when it is pulled, released by the caller (the client went away: ``ReleaseKv``), or after
``hold_timeout_s`` when nobody came for it (counted: ``meshfront_worker_kv_transfers_total{outcome=
"expired"}``). Transfer parameters the decode worker cannot resolve (an unknown or expired handle, a
worker that is gone or is another one now, blocks of another prompt) are refused with
``KvTransferFailed``, which the postprocessor treats as a failed leg.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import orjson
from prometheus_client import Counter, Gauge

from services.common.kv_events import StoredBlock
from services.workers.engine import KvTransferFailed
from services.workers.mocker.kv_cache import KvCache

log = logging.getLogger(__name__)

DO_REMOTE_DECODE = "do_remote_decode"
DO_REMOTE_PREFILL = "do_remote_prefill"
REMOTE_ENGINE_ID = "remote_engine_id"
REMOTE_ADDRESS = "remote_address"
REMOTE_HANDLE = "remote_handle"
REMOTE_NUM_TOKENS = "remote_num_tokens"
PIPELINED = "pipelined"

# An 8B model in bf16 with grouped-query attention (32 layers, 8 KV heads of 128): 128 KiB of K and V per
# token, 2 MiB per 16-token block.
DEFAULT_BLOCK_BYTES = 2 * 1024 * 1024
# One RDMA NIC's worth (NIXL over 200 Gb/s InfiniBand moves ~25 GB/s).
DEFAULT_BANDWIDTH_GBS = 25.0
DEFAULT_HOLD_TIMEOUT_S = 30.0
# The 8B model's 32 layers: the KV of a step leaves in that many slices, each when its layer is computed.
DEFAULT_LAYERS = 32


@functools.cache
def transfer_metrics() -> tuple[Counter, Gauge]:
    """Transfers by outcome (prefill side: pulled, released, expired; decode side: received, refused), and
    the blocks held for transfers now."""
    return (Counter("meshfront_worker_kv_transfers", "KV transfers by outcome: held blocks pulled, released by "
                    "the caller or expired unpulled (prefill side); blocks received or parameters refused "
                    "(decode side)", ["outcome"]),
            Gauge("meshfront_worker_kv_transfer_held_blocks", "KV blocks a prefill worker holds for decode workers"))


@dataclasses.dataclass(frozen=True)
class TransferSettings:
    """How long moving blocks takes: ``blocks * block_bytes / bandwidth``, divided by the speed-up; with
    ``overlap``, how much of that a transfer streamed during the prefill still leaves after it."""

    block_bytes: int = DEFAULT_BLOCK_BYTES
    bandwidth_gbs: float = DEFAULT_BANDWIDTH_GBS
    hold_timeout_s: float = DEFAULT_HOLD_TIMEOUT_S
    speedup_ratio: float = 1.0
    overlap: bool = False
    layers: int = DEFAULT_LAYERS

    def seconds(self, blocks: int) -> float:
        if self.speedup_ratio == 0 or blocks <= 0:
            return 0.0
        return blocks * self.block_bytes / (self.bandwidth_gbs * 1e9) / self.speedup_ratio

    def exposed_seconds(self, blocks: int, pulled: PulledKv) -> float:
        """How long the decode worker still waits for ``blocks`` once the pull is answered.

        Without overlap (or without a record of the prefill's steps) the whole transfer starts then. With it,
        one link moves the same bytes at the same bandwidth, but each step's KV leaves in ``layers`` slices,
        each as soon as its layer is computed (a step's layers take equal shares of it) and the link is free,
        and never before the pull arrived (time 0 of ``pulled.computed``): what is left when the pull is
        answered (``pulled.waited_s`` after it arrived) is the wait."""
        total = self.seconds(blocks)
        tokens = sum(c.tokens for c in pulled.computed)
        if not self.overlap or not tokens or not total:
            return total
        per_token = total / tokens  # the held blocks' bytes spread over the tokens the steps computed
        link_free = 0.0
        for c in pulled.computed:
            slice_s = c.tokens * per_token / self.layers
            for layer in range(1, self.layers + 1):
                link_free = max(link_free, c.start_s + c.duration_s * layer / self.layers) + slice_s
        return max(0.0, link_free - pulled.waited_s)


@dataclasses.dataclass(frozen=True)
class ComputedKv:
    """Prompt tokens whose KV one step computed: when it started and how long it took, in seconds (on the
    prefill worker's clock; relative to a pull's arrival once in a ``PulledKv``). Cached tokens take 0 s."""

    start_s: float
    duration_s: float
    tokens: int


@dataclasses.dataclass(frozen=True)
class PulledKv:
    """What a pull hands over: the prompt tokens covered and the sequence hashes of their full blocks; how long
    the pull waited for the prefill to finish, and the steps that computed the KV (relative to its arrival)."""

    num_tokens: int
    block_hashes: tuple[int, ...]
    waited_s: float = 0.0
    computed: tuple[ComputedKv, ...] = ()


@dataclasses.dataclass(frozen=True)
class RemotePrefill:
    """Where a decode leg's blocks are held: transfer parameters a prefill worker returned."""

    worker_id: str
    address: str
    handle: str
    num_tokens: int
    # Announced before the prefill ran (the paired order): the pull waits for it, and the decode leg's prompt
    # is the prefill leg's, whose first token comes with the KV.
    pipelined: bool = False

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> RemotePrefill:
        """Raises ``KvTransferFailed`` naming what is missing or malformed."""
        try:
            source = cls(str(params[REMOTE_ENGINE_ID]), str(params[REMOTE_ADDRESS]), str(params[REMOTE_HANDLE]),
                         int(params[REMOTE_NUM_TOKENS]), params.get(PIPELINED) is True)
        except (KeyError, TypeError, ValueError) as e:
            raise KvTransferFailed(f"the transfer parameters lack a valid {e}") from None
        if not (source.worker_id and source.address and source.handle) or source.num_tokens <= 0:
            raise KvTransferFailed("the transfer parameters name no prefill worker, address or handle")
        return source


def wants_remote_decode(params: Mapping[str, Any] | None) -> bool:
    return bool(params) and params.get(DO_REMOTE_DECODE) is True  # type: ignore[union-attr]


def remote_prefill(params: Mapping[str, Any] | None) -> RemotePrefill | None:
    """The prefill worker a decode leg pulls from; None for a request that prefills here."""
    if not params or params.get(DO_REMOTE_PREFILL) is not True:
        return None
    return RemotePrefill.parse(params)


class KvPuller(Protocol):
    """Takes the blocks a prefill worker holds (transfer_grpc.GrpcKvPuller)."""

    async def pull(self, source: RemotePrefill) -> PulledKv:
        """Raises ``KvTransferFailed`` when the hold or its worker cannot be found."""


def matched_blocks(pulled: PulledKv, prompt_blocks: Sequence[StoredBlock]) -> list[StoredBlock]:
    """The decode prompt's leading full blocks that the pull covers.

    Raises ``KvTransferFailed`` when the pulled blocks are of another prompt (not even the first matches).
    """
    matched = []
    for block, pulled_hash in zip(prompt_blocks, pulled.block_hashes, strict=False):
        if block.block_hash != pulled_hash:
            break
        matched.append(block)
    if pulled.block_hashes and not matched:
        raise KvTransferFailed("the transferred KV blocks belong to another prompt")
    return matched


@dataclasses.dataclass
class _Hold:
    request_id: str
    blocks: list[int]  # sequence hashes the hold has a reference on, in order
    partial: bool  # and a private tail block
    num_tokens: int
    prompt_hashes: tuple[int, ...]  # the full blocks of the prompt, what a pull reports
    computed: tuple[ComputedKv, ...]  # the steps that computed its KV, on this worker's clock
    ended: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # pulled, released or expired
    timer: asyncio.TimerHandle | None = None


class KvHolds:
    """The prefill side: blocks kept after a remote-decode prefill until pulled, released or expired."""

    def __init__(self, cache: KvCache, settings: TransferSettings, worker_id: str = "", address: str = "",
                 now: Callable[[], float] = time.monotonic):
        self._cache = cache
        self._settings = settings
        self._now = now  # the engine's clock, which the steps' times in ``computed`` are on
        self._holds: dict[str, _Hold] = {}
        # Handles announced before their prefill finished (the paired order): set when the hold is complete
        # or will never be.
        self._pending: dict[str, asyncio.Event] = {}
        self.worker_id = worker_id
        self.address = address
        self._transfers, self._held_blocks = transfer_metrics()

    def identify(self, worker_id: str, address: str) -> None:
        """Names this worker in the parameters it hands out (known once its server is bound)."""
        self.worker_id, self.address = worker_id, address

    @property
    def held_blocks(self) -> int:
        return sum(len(h.blocks) + h.partial for h in self._holds.values())

    def __len__(self) -> int:
        return len(self._holds)

    def reserve(self, request_id: str, num_tokens: int) -> dict[str, Any]:
        """Announces the hold a prefill leg will leave (``hold`` with the handle): the transfer parameters, marked
        ``pipelined``, which a decode leg may pull with before the prefill finished."""
        handle = self._new_handle(request_id)
        self._pending[handle] = asyncio.Event()
        return {**self._params(handle, num_tokens), PIPELINED: True}

    def hold(self, request_id: str, blocks: Sequence[StoredBlock], partial: bool, num_tokens: int,
             computed: Sequence[ComputedKv] = (), handle: str = "") -> dict[str, Any]:
        """Takes over a finished sequence's block references, under ``handle`` when ``reserve`` announced one
        (a pull waiting for it is answered); returns the transfer parameters naming them."""
        handle = handle or self._new_handle(request_id)
        n_full = num_tokens // self._cache.block_size
        hold = _Hold(request_id, [b.block_hash for b in blocks], partial, num_tokens,
                     tuple(b.block_hash for b in blocks[:n_full]), tuple(computed))
        if self._settings.hold_timeout_s > 0:
            hold.timer = asyncio.get_running_loop().call_later(self._settings.hold_timeout_s, self._expire, handle)
        self._holds[handle] = hold
        self._held_blocks.inc(len(hold.blocks) + partial)
        if (pending := self._pending.pop(handle, None)) is not None:
            pending.set()
        return self._params(handle, num_tokens)

    def pull(self, worker_id: str, handle: str) -> PulledKv:
        """Hands a complete hold over and frees its blocks here. Raises ``KeyError`` for an unknown handle,
        one still pending, or another worker's."""
        return self._take(worker_id, handle, self._now())

    async def take(self, worker_id: str, handle: str) -> PulledKv:
        """``pull``, waiting first for a hold announced before its prefill finished (a pull cancelled meanwhile
        leaves it alone)."""
        arrived = self._now()
        if worker_id == self.worker_id and (pending := self._pending.get(handle)) is not None:
            await pending.wait()
        return self._take(worker_id, handle, arrived)

    async def until_ended(self, handle: str) -> None:
        """Returns once the hold under ``handle`` is pulled, released or expired (at once if it is none)."""
        if (hold := self._holds.get(handle)) is not None:
            await hold.ended.wait()

    def _take(self, worker_id: str, handle: str, arrived: float) -> PulledKv:
        if worker_id != self.worker_id or handle not in self._holds:
            raise KeyError(handle)
        hold = self._end(handle, "pulled")
        computed = tuple(dataclasses.replace(c, start_s=c.start_s - arrived) for c in hold.computed)
        return PulledKv(hold.num_tokens, hold.prompt_hashes, self._now() - arrived, computed)

    def _new_handle(self, request_id: str) -> str:
        return f"{request_id}:{secrets.token_hex(8)}"  # unguessable: a stale or foreign handle never matches

    def _params(self, handle: str, num_tokens: int) -> dict[str, Any]:
        return {DO_REMOTE_PREFILL: True, REMOTE_ENGINE_ID: self.worker_id, REMOTE_ADDRESS: self.address,
                REMOTE_HANDLE: handle, REMOTE_NUM_TOKENS: num_tokens}

    def release(self, handle: str) -> bool:
        """Frees a hold nobody will pull, or withdraws an announced one whose prefill will not finish (a pull
        waiting for it finds nothing); False when there is none (pulled, released or expired already)."""
        if (pending := self._pending.pop(handle, None)) is not None:
            pending.set()
            return True
        if handle not in self._holds:
            return False
        hold = self._end(handle, "released")
        log.info("KV blocks held for request %s released: its decode leg will not come", hold.request_id)
        return True

    def release_params(self, raw: bytes) -> bool:
        """``release`` for the transfer parameters as this worker handed them out (JSON bytes); False for
        parameters that are not this worker's or name no hold."""
        try:
            params = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(params, dict) or params.get(REMOTE_ENGINE_ID) != self.worker_id:
            return False
        handle = params.get(REMOTE_HANDLE)
        return isinstance(handle, str) and self.release(handle)

    def release_all(self) -> None:
        """Frees every hold (engine shutdown or reset)."""
        self._withdraw_pending()
        for handle in list(self._holds):
            self._end(handle, "released")

    def discard_all(self) -> None:
        """Forgets every hold without touching the cache (the engine cleared it after a failure)."""
        self._withdraw_pending()
        for handle in list(self._holds):
            hold = self._holds.pop(handle)
            if hold.timer is not None:
                hold.timer.cancel()
            self._held_blocks.dec(len(hold.blocks) + hold.partial)
            self._transfers.labels("released").inc()

    def _withdraw_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for event in pending.values():
            event.set()

    def _expire(self, handle: str) -> None:
        if handle in self._holds:
            hold = self._end(handle, "expired")
            log.info("KV blocks held for request %s expired unpulled after %g s", hold.request_id,
                     self._settings.hold_timeout_s)

    def _end(self, handle: str, outcome: str) -> _Hold:
        hold = self._holds.pop(handle)
        if hold.timer is not None:
            hold.timer.cancel()
        self._cache.release(hold.blocks)
        if hold.partial:
            self._cache.release_partial()
        self._held_blocks.dec(len(hold.blocks) + hold.partial)
        self._transfers.labels(outcome).inc()
        hold.ended.set()
        return hold
