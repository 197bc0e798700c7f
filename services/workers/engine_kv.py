"""An engine's own KV cache events, translated into Meshfront's block hashes (no zmq, no engine import).

vLLM and SGLang publish the same event shapes (SGLang ported vLLM's): ``BlockStored`` (the
engine's hashes of one or more full blocks, the parent block's engine hash, the blocks' token
ids), ``BlockRemoved`` (engine hashes only) and ``AllBlocksCleared``. Their hashes are internal
(vLLM's are SHA-256 based), so the routers must never see them: the translator recomputes each
stored block's hashes from its token ids with Meshfront's chained XXH3 scheme
(``services.common.hashing``, what the preprocessor computes for a prompt) and keeps a map from
the engine's hashes to ours, because removals carry only the engine's.

Rules that keep the router's view exact:
- only blocks of the engine's real block size are indexed (vLLM also reports partial blocks and
  other KV cache groups' blocks; a prompt hash never matches those);
- a stored block whose parent the translator does not know (its store was lost, or it was a
  skipped partial block) cannot be chained, so it is skipped and counted, never guessed;
- an engine reporting a block it already holds again (vLLM re-announces prefix-cache hits) is a
  no-op; two engine hashes for the same tokens (a LoRA or a cache salt makes them differ) share
  one of ours, which is removed only when the last of them is.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Hashable, Sequence

from services.common.hashing import block_hashes, chain_hash
from services.common.kv_events import KvEventListener, StoredBlock

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class BlocksStored:
    engine_hashes: Sequence[Hashable]
    parent_engine_hash: Hashable | None
    token_ids: Sequence[int]
    # Tokens per block in this event (a partial block reports fewer).
    block_size: int
    # The salts below are keyword-only: two optional fields side by side are too easy to swap by position.
    _: dataclasses.KW_ONLY
    # Per block, the content hashes of the media whose tokens it holds (hashing.block_hashes' block_mm_infos);
    # None: text only.
    block_mm_infos: Sequence[Sequence[int] | None] | None = None
    # The LoRA adapter the blocks were computed under (None: the base model): it salts our hashes as the
    # preprocessor salts a request's (services/common/hashing.py).
    lora_name: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class BlocksRemoved:
    engine_hashes: Sequence[Hashable]


@dataclasses.dataclass(frozen=True, slots=True)
class CacheCleared:
    pass


EngineKvEvent = BlocksStored | BlocksRemoved | CacheCleared


class BlockHashTranslator:
    """Feeds ``listener`` (the NATS publisher) Meshfront hashes for an engine's events."""

    def __init__(self, listener: KvEventListener, block_size: int):
        self.listener = listener
        self.block_size = block_size
        self._ours: dict[Hashable, int] = {}  # engine hash -> our sequence hash
        self._refs: collections.Counter[int] = collections.Counter()  # our hash -> engine hashes mapped to it
        self.skipped_blocks = 0

    def __len__(self) -> int:
        return len(self._ours)

    def apply(self, event: EngineKvEvent) -> None:
        if isinstance(event, BlocksStored):
            self.stored(event)
        elif isinstance(event, BlocksRemoved):
            self.removed(event.engine_hashes)
        elif isinstance(event, CacheCleared):
            self.cleared()
        else:
            raise TypeError(f"not an engine KV event: {event!r}")

    def stored(self, event: BlocksStored) -> None:
        n = len(event.engine_hashes)
        if event.block_size != self.block_size or len(event.token_ids) != n * self.block_size:
            return  # partial block or another cache group's: no prompt hash can match it
        parent: int | None = None
        if event.parent_engine_hash is not None:
            found = self._ours.get(event.parent_engine_hash)
            if found is None:
                self._skip(n, "its parent block is unknown")
                return
            parent = found
        run: list[StoredBlock] = []
        run_parent = parent
        locals_ = block_hashes(event.token_ids, self.block_size, block_mm_infos=event.block_mm_infos,
                               lora_name=event.lora_name)
        for engine_hash, local in zip(event.engine_hashes, locals_, strict=True):
            ours = chain_hash(parent, local)
            if engine_hash in self._ours:  # announced again (a prefix-cache hit): nothing new
                self._flush(run, run_parent)
                run, run_parent = [], ours
            else:
                self._ours[engine_hash] = ours
                self._refs[ours] += 1
                if self._refs[ours] == 1:
                    run.append(StoredBlock(ours, local))
                else:  # the same tokens under another engine hash: the router already has it
                    self._flush(run, run_parent)
                    run, run_parent = [], ours
            parent = ours
        self._flush(run, run_parent)

    def _flush(self, run: list[StoredBlock], parent: int | None) -> None:
        if run:
            self.listener.stored(run, parent)

    def removed(self, engine_hashes: Sequence[Hashable]) -> None:
        gone: list[int] = []
        for engine_hash in engine_hashes:
            ours = self._ours.pop(engine_hash, None)
            if ours is None:
                continue  # a block we never indexed (partial, other group, or skipped)
            self._refs[ours] -= 1
            if self._refs[ours] == 0:
                del self._refs[ours]
                gone.append(ours)
        if gone:
            self.listener.removed(gone)

    def cleared(self) -> None:
        self._ours.clear()
        self._refs.clear()
        self.listener.cleared()

    def _skip(self, blocks: int, why: str) -> None:
        self.skipped_blocks += blocks
        log.warning("not indexing %d stored block(s): %s (%d skipped so far)", blocks, why, self.skipped_blocks)
