"""One simulated sequence: its tokens, the KV blocks it holds and how far its prefill got."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence as Seq
from typing import Protocol

from services.common.hashing import BlockMmInfos, block_hashes, sequence_hashes
from services.common.kv_events import StoredBlock
from services.workers.engine import FinishReason, TokenStream
from services.workers.mocker.transfer import ComputedKv


class OutputPlan(Protocol):
    """Decides the token at each output position (see outputs.py)."""

    def token_at(self, index: int) -> tuple[int, FinishReason]:
        """The token at output position ``index`` and whether it ends the sequence."""


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def chain_hash(parent: int | None, tokens_hash: int) -> int:
    """The sequence hash of a block whose predecessor has sequence hash ``parent``."""
    if parent is None:
        return tokens_hash
    # sequence_hashes chains from its first element, so chaining [parent, local] yields exactly
    # the hash services.common.hashing defines for the block after ``parent``.
    return sequence_hashes((parent, tokens_hash))[1]


def full_blocks(token_ids: Seq[int], block_size: int, mm_infos: BlockMmInfos | None = None,
                lora_name: str | None = None) -> list[StoredBlock]:
    """The full blocks of ``token_ids`` with their sequence and local hashes; ``mm_infos`` salts the blocks
    holding media with its content hashes, and ``lora_name`` every block with a LoRA adapter's name, as the
    preprocessor's hashes for the router are (one adapter's blocks are never another's or the base's)."""
    local = block_hashes(token_ids, block_size, block_mm_infos=mm_infos, lora_name=lora_name)
    return [StoredBlock(s, t) for s, t in zip(sequence_hashes(local), local, strict=True)]


@dataclasses.dataclass(eq=False, slots=True)
class Sequence:
    """Scheduler state of one request. Identity equality: two requests are never the same."""

    request_id: str
    prompt: list[int]
    plan: OutputPlan
    # Full blocks of the prompt, hashed once when the request arrives.
    prompt_blocks: list[StoredBlock]
    # Per block of the prompt, the content hashes of the media it holds (hashing.media_block_infos); None: text.
    mm_infos: list[list[int] | None] | None = None
    stream: TokenStream | None = None
    # Alternatives per token when the request wants logprobs; None when it does not.
    top_logprobs: int | None = None
    output: list[int] = dataclasses.field(default_factory=list)
    state: SeqState = SeqState.WAITING
    # Full blocks this sequence holds a reference on, in order, and whether it holds a tail block.
    held: list[StoredBlock] = dataclasses.field(default_factory=list)
    holds_partial: bool = False
    # Tokens whose KV is computed, and how many must be before decoding starts.
    num_computed: int = 0
    prefill_target: int = 0
    # Prompt tokens found in the cache at first admission; None until admitted.
    cached_tokens: int | None = None
    # Disaggregation (transfer.py). A prefill leg keeps its blocks when it finishes, for a decode worker to pull.
    hold_on_finish: bool = False
    transfer_handle: str = ""  # set when it finished and its blocks are held
    reserved_handle: str = ""  # the hold announced before the prefill ran (the paired order)
    # The steps that computed its prompt's KV, for a pipelined transfer (transfer.ComputedKv, timed by the
    # engine); a preempted sequence starts over.
    kv_computed: list[ComputedKv] = dataclasses.field(default_factory=list)
    # A decode leg: blocks pulled from a prefill worker, referenced on its behalf until it is admitted, and the
    # prompt tokens whose KV they brought (computed at admission, once; a preempted sequence recomputes).
    pinned: list[int] = dataclasses.field(default_factory=list)
    transferred_tokens: int = 0
    # A pipelined decode leg: its prompt is the prefill leg's, whose first token came with the KV.
    first_token_with_kv: bool = False
    # The LoRA adapter the sequence runs with (None: the base model): it salts every block hash.
    lora_name: str | None = None

    @property
    def total_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def finished(self) -> bool:
        return self.state is SeqState.FINISHED

    def blocks_for_admission(self, block_size: int) -> list[StoredBlock]:
        """Full blocks of every token so far (prompt plus output, after a preemption)."""
        if not self.output:
            return self.prompt_blocks
        return full_blocks(self.prompt + self.output, block_size, self.mm_infos, self.lora_name)

    def tail_block(self, block_size: int) -> StoredBlock:
        """The block made of the last ``block_size`` tokens, which just filled up."""
        start = self.total_tokens - block_size
        n_prompt = len(self.prompt)
        tokens = self.prompt[start:] + self.output[max(0, start - n_prompt):]
        index = start // block_size  # the prompt's last block may fill up while decoding, with media in it
        mm = self.mm_infos[index] if self.mm_infos and index < len(self.mm_infos) else None
        local = block_hashes(tokens, block_size, block_mm_infos=[mm], lora_name=self.lora_name)[0]
        parent = self.held[-1].block_hash if self.held else None
        return StoredBlock(chain_hash(parent, local), local)
