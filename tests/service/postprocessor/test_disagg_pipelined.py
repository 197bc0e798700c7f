"""The paired order of a disaggregated request on two real mockers with ``--kv-transfer-overlap``: the prefill
mocker announces its hold before computing, the postprocessor opens the decode leg at once
(services/postprocessor/disagg_paired.py), and the decode mocker's pull waits at the prefill mocker over gRPC until
the prompt is computed (services/workers/mocker/transfer.py). The same pieces and fixtures as
test_disagg_legs.py, which runs the sequential order."""

from __future__ import annotations

import pytest
from meshfront.common.v1 import common_pb2

from services.workers.mocker.sequence import full_blocks
from services.workers.mocker.transfer import transfer_metrics
from tests.service.postprocessor.disagg_mockers import (
    PROMPT,
    TOKENS,
    collect,
    hang_up_during_the_prefill,
    pulled,
    request,
    wait_idle,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

OVERLAP = "--kv-transfer-overlap"


async def test_both_legs_at_once_answer_as_one_worker_does(demo_model_dir, mockers, post):
    prefill = await mockers("--speedup-ratio", "1", OVERLAP)
    decode = await mockers("--speedup-ratio", "1", OVERLAP)
    want = await collect(post, request(demo_model_dir, prefill))  # aggregated
    prefill.engine.cache.clear()  # so that the prefill leg computes its prompt again
    before = pulled()
    got = await collect(post, request(demo_model_dir, decode, prefill))
    assert [i for r in got for i in r.token_ids] == [i for r in want for i in r.token_ids]
    assert sum(r.completion_tokens for r in got) == TOKENS and got[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert got[0].completion_tokens == 1 and got[0].prompt_tokens == len(PROMPT)
    assert (got[1].worker_id, got[1].prefill_worker_id) == (decode.id, prefill.id)
    # One pull, whose answer said when the prefill computed the prompt; the decode worker has it cached.
    assert pulled() == before + 1
    assert all(decode.engine.cache.contains(b.block_hash) for b in full_blocks(PROMPT, 16))
    await wait_idle(prefill, decode)


async def test_a_one_token_request_frees_the_hold_at_once(demo_model_dir, mockers, post):
    # The answer is the prefill leg's token: the postprocessor cancels both legs, and the cancel of the prefill
    # leg (whose finish waits for a pull) frees the blocks, whether or not the decode leg's pull had arrived.
    prefill = await mockers("--speedup-ratio", "0", OVERLAP)
    decode = await mockers("--speedup-ratio", "0", OVERLAP)
    released = transfer_metrics()[0].labels("released")._value.get()
    before = pulled()
    got = await collect(post, request(demo_model_dir, decode, prefill, tokens=1))
    assert sum(r.completion_tokens for r in got) == 1 and got[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    await wait_idle(prefill, decode)  # not after the 30 s hold timeout
    ended = (transfer_metrics()[0].labels("released")._value.get() - released) + (pulled() - before)
    assert ended == 1 and len(prefill.engine.holds) == 0


async def test_cancel_during_the_prefill_frees_both_workers(demo_model_dir, mockers, post):
    prefill = await mockers("--speedup-ratio", "0.02", OVERLAP)  # a prefill of seconds
    decode = await mockers("--speedup-ratio", "0", OVERLAP)
    await hang_up_during_the_prefill(post, request(demo_model_dir, decode, prefill), prefill)
    await wait_idle(prefill, decode)
    assert len(prefill.engine.holds) == 0
