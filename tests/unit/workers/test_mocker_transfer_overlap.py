"""The mocker's pipelined KV transfer (services/workers/mocker/transfer.py, ``--kv-transfer-overlap``): a prefill leg
announces its hold before computing, the decode leg's pull waits for the prefill, and the decode worker waits only
for what one link could not have moved while the prefill computed, layer by layer. On virtual clocks: one per
engine, as two workers have (the pull's times are relative to its arrival, so none is shared)."""

from __future__ import annotations

import asyncio

import pytest

from services.workers.engine import EngineRequest, FinishReason, KvTransferFailed, SamplingParams
from services.workers.mocker.config import MockerEngineConfig
from services.workers.mocker.engine import MockerEngine
from services.workers.mocker.outputs import OutputPolicy
from services.workers.mocker.transfer import (
    DO_REMOTE_DECODE,
    PIPELINED,
    REMOTE_HANDLE,
    ComputedKv,
    PulledKv,
    RemotePrefill,
    TransferSettings,
    transfer_metrics,
)
from tests.unit.workers.conftest import FakeClock

pytestmark = pytest.mark.unit

EOS = (151645, 151643)
LONG = [100 + i % 5000 for i in range(2000)]  # 125 blocks: 10.5 ms over 25 GB/s; ~180 ms of default prefill
REMOTE_DECODE = {DO_REMOTE_DECODE: True}
SETTINGS = TransferSettings(overlap=True)  # 2 MiB blocks, 25 GB/s, 32 layers


def pulled(*computed: tuple[float, float, int], waited_s: float = 0.0) -> PulledKv:
    return PulledKv(0, (), waited_s, tuple(ComputedKv(*c) for c in computed))


# -- the link model ---------------------------------------------------------------------------------------------


def test_without_overlap_or_a_record_of_the_steps_the_whole_transfer_follows_the_pull():
    total = SETTINGS.seconds(100)
    assert total == pytest.approx(100 * 2 * 1024 * 1024 / 25e9)
    assert SETTINGS.exposed_seconds(100, pulled()) == total
    assert TransferSettings().exposed_seconds(100, pulled((0.0, 0.5, 1600), waited_s=0.5)) == total


def test_kv_computed_before_the_pull_arrived_leaves_only_after_it():
    # The sequential order: the prefill finished 80 ms before the pull came; nothing could move before it.
    total = SETTINGS.seconds(100)
    assert SETTINGS.exposed_seconds(100, pulled((-0.1, 0.02, 1600))) == pytest.approx(total)


def test_a_long_prefill_hides_all_but_the_last_layer_s_share():
    # The pull came as the prefill began; the step (0.2 s) is far longer than the transfer (8.4 ms): each layer's
    # slice leaves as it is computed, so once the pull is answered at the step's end only the last layer's is left.
    total = SETTINGS.seconds(100)
    assert SETTINGS.exposed_seconds(100, pulled((0.0, 0.2, 1600), waited_s=0.2)) == pytest.approx(total / 32)


def test_a_slow_link_still_takes_its_bytes_time():
    # 20 MB blocks at 2 GB/s: 1 s of transfer behind a 0.2 s prefill. The link starts with the first layer's KV
    # (after 0.2/32 s) and runs flat out: what is left at the step's end is the rest of the second.
    slow = TransferSettings(block_bytes=20_000_000, bandwidth_gbs=2.0, overlap=True)
    total = slow.seconds(100)
    assert total == pytest.approx(1.0)
    assert slow.exposed_seconds(100, pulled((0.0, 0.2, 1600), waited_s=0.2)) == pytest.approx(0.2 / 32 + 1.0 - 0.2)
    # The speed-up divides the link's time as it divides the steps'.
    fast = TransferSettings(block_bytes=20_000_000, bandwidth_gbs=2.0, speedup_ratio=2.0, overlap=True)
    assert fast.exposed_seconds(100, pulled((0.0, 0.1, 1600), waited_s=0.1)) == pytest.approx(0.1 / 32 + 0.5 - 0.1)


def test_a_chunked_prefill_streams_each_chunk_and_cached_kv_from_the_start():
    # 400 cached tokens (there when the pull came), then two 600-token chunks of 0.1 s each, back to back.
    total = SETTINGS.seconds(100)
    steps = ((0.0, 0.0, 400), (0.0, 0.1, 600), (0.1, 0.1, 600))
    per_token = total / 1600
    # The last chunk's last layer is computed at 0.2 s; its slice is all that is left when the pull is answered.
    assert SETTINGS.exposed_seconds(100, pulled(*steps, waited_s=0.2)) == pytest.approx(600 * per_token / 32)
    # Answered later (the reply was slow to leave), less is left; never less than nothing.
    assert SETTINGS.exposed_seconds(100, pulled(*steps, waited_s=0.3)) == 0.0


# -- the two legs ----------------------------------------------------------------------------------------------


class LocalPuller:
    """The decode side's puller, reaching a prefill engine in this process as the gRPC servicer does."""

    def __init__(self, engines: dict[str, MockerEngine]):
        self.engines = engines

    async def pull(self, source: RemotePrefill) -> PulledKv:
        try:
            return await self.engines[source.worker_id].holds.take(source.worker_id, source.handle)
        except KeyError:
            raise KvTransferFailed("no such KV blocks") from None


@pytest.fixture
async def pair(tokenizer):
    """A prefill engine and a decode engine, each on its own virtual clock."""
    policy = OutputPolicy.build(tokenizer)
    engines: dict[str, MockerEngine] = {}
    clocks = (FakeClock(), FakeClock())

    def make(clock: FakeClock, **cfg) -> MockerEngine:
        return MockerEngine(MockerEngineConfig(kv_transfer_overlap=True, **cfg), policy, eos_token_ids=EOS, clock=clock,
                            puller=LocalPuller(engines))

    prefill = engines["prefill-1"] = make(clocks[0], kv_hold_timeout_s=0)
    prefill.holds.identify("prefill-1", "127.0.0.1:1")
    decode = make(clocks[1])
    yield prefill, decode, clocks[1]
    for engine in (prefill, decode):
        await engine.close()
        assert engine.cache.active_blocks == 0 and len(engine.holds) == 0
        assert not engine.scheduler.has_work()


def req(prompt, rid="r", **kw) -> EngineRequest:
    return EngineRequest(rid, list(prompt), sampling=SamplingParams(seed=7), **kw)


async def tokens_of(gen) -> list[int]:
    return [t async for out in gen for t in out.token_ids]


async def test_both_legs_at_once_hide_the_transfer_behind_the_prefill(pair):
    prefill, decode, decode_clock = pair
    reference = MockerEngine(MockerEngineConfig(speedup_ratio=0), prefill.outputs, eos_token_ids=EOS)
    try:
        agg = await tokens_of(reference.generate(req(LONG, "agg", max_tokens=6)))
    finally:
        await reference.close()
    leg = prefill.generate(req(LONG, max_tokens=6, kv_transfer_params=REMOTE_DECODE))
    announced = await leg.__anext__()
    # The announcement comes before any token, naming a hold that does not exist yet.
    assert announced.token_ids == [] and announced.kv_transfer_params[PIPELINED] is True
    assert prefill.holds.held_blocks == 0
    # The decode leg opens at once, with the prefill leg's prompt (the paired order), and its pull waits.
    decoded = asyncio.ensure_future(tokens_of(decode.generate(
        req(LONG, "d", max_tokens=6, kv_transfer_params=announced.kv_transfer_params))))
    first = await tokens_of(leg)
    rest = await decoded
    # Its output starts with the prefill leg's first token (the caller drops that copy) and continues the
    # aggregated answer token for token.
    assert first == agg[:1] and rest == agg
    # The transfer (125 blocks: 10.5 ms) streamed during the ~180 ms prefill: only the last layer's share was
    # left when the pull was answered.
    whole = decode.transfer.seconds(125)
    assert decode_clock.sleeps[0] == pytest.approx(whole / 32)
    # ... and then one decode step computed the second token (no step for the first, which came with the KV).
    assert decode.steps == 5


async def test_without_overlap_the_prefill_leg_announces_nothing_and_the_transfer_follows_it(tokenizer):
    engine = MockerEngine(MockerEngineConfig(), OutputPolicy.build(tokenizer), eos_token_ids=EOS, clock=FakeClock())
    try:
        outputs = [out async for out in engine.generate(req(LONG, max_tokens=6, kv_transfer_params=REMOTE_DECODE))]
        assert outputs[0].token_ids and PIPELINED not in outputs[-1].kv_transfer_params
        assert engine.holds.release(outputs[-1].kv_transfer_params[REMOTE_HANDLE])
    finally:
        await engine.close()


async def test_a_pull_waiting_for_a_prefill_that_is_cancelled_is_refused_and_nothing_stays_held(pair):
    prefill, decode, _ = pair
    leg = prefill.generate(req(LONG, max_tokens=6, kv_transfer_params=REMOTE_DECODE))
    announced = await leg.__anext__()
    decoded = asyncio.ensure_future(tokens_of(decode.generate(
        req(LONG, "d", max_tokens=6, kv_transfer_params=announced.kv_transfer_params))))
    await asyncio.sleep(0)
    await leg.aclose()  # the caller hung up mid-prefill
    with pytest.raises(KvTransferFailed):
        await decoded
    assert prefill.cache.active_blocks == 0 and decode.cache.active_blocks == 0


async def test_a_cancelled_pull_leaves_the_hold_for_another(pair):
    prefill, _, _ = pair
    leg = prefill.generate(req(LONG, max_tokens=6, kv_transfer_params=REMOTE_DECODE))
    handle = (await leg.__anext__()).kv_transfer_params[REMOTE_HANDLE]
    waiting = asyncio.ensure_future(prefill.holds.take("prefill-1", handle))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    token = await leg.__anext__()
    taken = await prefill.holds.take("prefill-1", handle)
    assert taken.num_tokens == len(LONG) and len(taken.block_hashes) == 125 and taken.computed
    assert prefill.cache.active_blocks == 0
    # The leg's finish follows the pull, with the parameters the sequential order would have used.
    last = await leg.__anext__()
    assert token.token_ids and token.finish_reason is FinishReason.NONE
    assert last.token_ids == [] and last.finish_reason is FinishReason.LENGTH and last.kv_transfer_params
    with pytest.raises(StopAsyncIteration):
        await leg.__anext__()


async def test_a_prefill_leg_cancelled_after_its_token_frees_the_unpulled_hold(pair):
    # The paired order's caller needs no decode leg (a one-token answer, or the client left): it cancels both legs.
    prefill, _, _ = pair
    released = transfer_metrics()[0].labels("released")._value.get()
    leg = prefill.generate(req(LONG, max_tokens=6, kv_transfer_params=REMOTE_DECODE))
    await leg.__anext__()
    token = await leg.__anext__()
    assert token.token_ids and prefill.holds.held_blocks == 126  # 125 full blocks and the tail
    await leg.aclose()
    assert prefill.holds.held_blocks == 0 and prefill.cache.active_blocks == 0
    assert transfer_metrics()[0].labels("released")._value.get() == released + 1
