"""The embedding worker's batching queue and request checks, with a plain function as the model.

The model stand-in returns, per input, ``[len(ids), sum(ids)]``, so every row says which input it
belongs to, and it records each batch it was given: the tests see exactly how requests were gathered.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from services.common.errors import InvalidRequest
from services.workers.embed.batcher import EmbedBatcher, _Item, _Job, take_batch
from services.workers.embed.model import EmbeddingShape
from services.workers.embed.service import check_dimensions, check_inputs, to_little_endian_bytes

pytestmark = pytest.mark.unit


class RecordingModel:
    """Blocks each batch until released, so a test can queue requests while one is 'running'."""

    def __init__(self, hold_first: bool = False) -> None:
        self.batches: list[list[list[int]]] = []
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self.running = threading.Event()

    def __call__(self, batch: list[Sequence[int]]) -> np.ndarray:
        self.batches.append([list(ids) for ids in batch])
        self.running.set()
        self.release.wait(10)
        return np.array([[len(ids), sum(ids)] for ids in batch], dtype=np.float32)


async def started(model, **kw) -> EmbedBatcher:
    batcher = EmbedBatcher(model, **kw)
    batcher.start()
    return batcher


async def test_a_lone_request_runs_at_once_and_keeps_its_order():
    model = RecordingModel()
    batcher = await started(model)
    try:
        out = await asyncio.wait_for(batcher.embed([[1, 2], [5], [7, 7, 7]]), 5)
        assert out.tolist() == [[2, 3], [1, 5], [3, 21]]
        assert model.batches == [[[1, 2], [5], [7, 7, 7]]]
    finally:
        await batcher.close()


async def test_requests_that_arrive_while_a_batch_runs_share_the_next_forward_pass():
    model = RecordingModel(hold_first=True)
    batcher = await started(model, max_batch_size=32)
    try:
        first = asyncio.create_task(batcher.embed([[1]]))
        await asyncio.to_thread(model.running.wait, 5)
        # Eight callers queue while the first batch is still in the model.
        waiting = [asyncio.create_task(batcher.embed([[10 + i], [20 + i]])) for i in range(8)]
        await asyncio.sleep(0.05)
        model.release.set()
        assert (await asyncio.wait_for(first, 5)).tolist() == [[1, 1]]
        results = await asyncio.wait_for(asyncio.gather(*waiting), 5)
        for i, out in enumerate(results):
            assert out.tolist() == [[1, 10 + i], [1, 20 + i]]
        assert [len(b) for b in model.batches] == [1, 16]
        assert batcher.batch_sizes == collections.Counter({1: 1, 16: 1})
    finally:
        await batcher.close()


async def test_batches_are_bounded_by_size_and_by_padded_tokens():
    model = RecordingModel(hold_first=True)
    batcher = await started(model, max_batch_size=4, max_batch_tokens=12)
    try:
        first = asyncio.create_task(batcher.embed([[0]]))
        await asyncio.to_thread(model.running.wait, 5)
        short = asyncio.create_task(batcher.embed([[1]] * 6))  # 6 one-token inputs: batches of at most 4
        long = asyncio.create_task(batcher.embed([[2] * 6, [3] * 6, [4] * 6]))  # 2 x 6 = 12 tokens fit, 3 do not
        await asyncio.sleep(0.05)
        model.release.set()
        await asyncio.wait_for(asyncio.gather(first, short, long), 5)
        sizes = [len(b) for b in model.batches]
        assert sizes == [1, 4, 2, 2, 1]
        # The padded size (inputs x longest) of every batch stays within the budget, except a lone input.
        for batch in model.batches:
            assert len(batch) * max(map(len, batch)) <= 12 or len(batch) == 1
        assert long.result()[:, 1].tolist() == [12, 18, 24]
    finally:
        await batcher.close()


async def test_a_cancelled_caller_has_its_queued_inputs_skipped():
    model = RecordingModel(hold_first=True)
    batcher = await started(model)
    try:
        first = asyncio.create_task(batcher.embed([[1]]))
        await asyncio.to_thread(model.running.wait, 5)
        gone = asyncio.create_task(batcher.embed([[99], [98]]))
        kept = asyncio.create_task(batcher.embed([[5]]))
        await asyncio.sleep(0.05)
        gone.cancel()
        model.release.set()
        assert (await asyncio.wait_for(kept, 5)).tolist() == [[1, 5]]
        await first
        assert [[99], [98]] not in model.batches and all([99] not in b for b in model.batches)
    finally:
        await batcher.close()


async def test_a_failing_forward_pass_fails_every_caller_in_its_batch_and_the_batcher_goes_on():
    calls = []

    def flaky(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return np.zeros((len(batch), 2), dtype=np.float32)

    batcher = await started(flaky)
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            await asyncio.wait_for(batcher.embed([[1], [2]]), 5)
        assert (await asyncio.wait_for(batcher.embed([[3]]), 5)).shape == (1, 2)
    finally:
        await batcher.close()


async def test_close_fails_what_is_still_queued():
    model = RecordingModel(hold_first=True)
    batcher = await started(model)
    first = asyncio.create_task(batcher.embed([[1]]))
    await asyncio.to_thread(model.running.wait, 5)
    queued = asyncio.create_task(batcher.embed([[2]]))
    await asyncio.sleep(0.02)
    await batcher.close()
    model.release.set()
    with pytest.raises(RuntimeError, match="shutting down"):
        await asyncio.wait_for(queued, 5)
    first.cancel()


def test_take_batch_always_takes_one_input_even_past_the_token_budget():
    loop = asyncio.new_event_loop()
    try:
        job = _Job(loop.create_future(), [None, None], 2)
        queue = collections.deque([_Item(job, 0, [1] * 50), _Item(job, 1, [1])])
        assert [len(i.token_ids) for i in take_batch(queue, 8, 10)] == [50]
        assert [len(i.token_ids) for i in take_batch(queue, 8, 10)] == [1]
        assert take_batch(queue, 8, 10) == []
    finally:
        loop.close()


SHAPE = EmbeddingShape(dimensions=384, max_input_tokens=256, vocab_size=30522, pad_token_id=0, pooling="mean",
                       normalize=True)


def test_dimensions_may_only_restate_the_models_size():
    check_dimensions(None, SHAPE, "m")
    check_dimensions(384, SHAPE, "m")
    with pytest.raises(InvalidRequest) as e:
        check_dimensions(128, SHAPE, "m")
    assert e.value.param == "dimensions" and "384" in e.value.message and "128" in e.value.message


@pytest.mark.parametrize(("inputs", "fragment"), [
    ([], "must not be empty"),
    ([[101, 102], []], "'input[1]' has no tokens"),
    ([[1] * 257], "maximum input length is 256 tokens; 'input[0]' has 257"),
    ([[101, 30522]], "token id 30522 in 'input[0]' is out of range"),
])
def test_inputs_are_checked_by_the_worker_too(inputs, fragment):
    with pytest.raises(InvalidRequest) as e:
        check_inputs(inputs, SHAPE)
    assert e.value.param == "input" and fragment in e.value.message


def test_embeddings_travel_as_little_endian_float32():
    row = np.array([1.0, -2.5, 3.25], dtype=np.float32)
    raw = to_little_endian_bytes(row)
    assert raw == b"\x00\x00\x80?\x00\x00 \xc0\x00\x00P@"
    assert np.frombuffer(raw, dtype="<f4").tolist() == [1.0, -2.5, 3.25]
    assert to_little_endian_bytes(row.astype(">f4")) == raw  # big-endian input is converted, not copied as is
