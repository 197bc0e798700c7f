"""X-Dynamo-Session-ID on the way to the router, and Dynamo's mesh-wide families (worker_metrics.py,
frontend_metrics.MeshCollector) over real worker cards, without a mesh."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.common.discovery import DECODE, PREFILL, ModelCard, WorkerCard
from services.common.errors import InvalidRequest
from services.gateway.core.openai_request import parse_chat
from services.gateway.frontend_metrics import DynamoRecorder, Outcome
from services.gateway.worker_metrics import NEW_REQUEST, ONGOING_REQUEST, WorkerView

pytestmark = pytest.mark.unit

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def test_the_session_header_becomes_the_routes_affinity_key():
    hints = parse_chat(BODY, {"x-dynamo-session-id": " conv-7 "}).route_hints()
    assert (hints.affinity_session_id, hints.session_id) == ("conv-7", "")
    assert parse_chat(BODY, {}).route_hints().affinity_session_id == ""
    with pytest.raises(InvalidRequest, match="x-dynamo-session-id") as e:
        parse_chat(BODY, {"x-dynamo-session-id": "x" * 257})
    assert e.value.param == "x-dynamo-session-id"


def card(worker_id: str, role: str = DECODE, blocks: int = 100) -> WorkerCard:
    return WorkerCard(worker_id, "127.0.0.1:1", ModelCard("m", "/tmp", context_length=4096, block_size=16),
                      total_kv_blocks=blocks, max_num_batched_tokens=2048, max_num_seqs=256, role=role)


def samples(recorder: DynamoRecorder) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(recorder.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def worker_labels(worker_id: str, kind: str = "decode") -> tuple[tuple[str, str], ...]:
    return (("dp_rank", "0"), ("worker_id", worker_id), ("worker_type", kind))


def test_a_choices_load_moves_from_prefill_to_decode_and_its_last_numbers_stay():
    view = WorkerView()
    load = view.choice("m", "d1", "p1", prompt_tokens=40)
    assert view.prefill_tokens["p1"] == 40 and view.decode_tokens["d1"] == 0
    load.first_output(40)
    assert view.prefill_tokens["p1"] == 0 and view.decode_tokens["d1"] == 40
    assert view.last["p1"].input_tokens == 40 and view.last["p1"].ttft_s is not None
    load.moved("d1", "p1")  # the decode leg's start: no migration
    load.moved("d2", "")  # a migration after output: its blocks go with it
    assert view.decode_tokens["d1"] == 0 and view.decode_tokens["d2"] == 40
    load.ended(5)
    load.ended(0)  # the request's cleanup after the stream's own end: nothing more
    assert view.decode_tokens["d2"] == 0 and view.last["d2"].itl_s is not None
    early = view.choice("m", "d1", "", 8)
    early.moved("d3", "")  # moved before any output: the new worker computes the prompt
    assert view.prefill_tokens["d1"] == 0 and view.prefill_tokens["d3"] == 8
    early.ended(0)
    assert view.prefill_tokens["d3"] == 0
    assert view.migrations == {("m", ONGOING_REQUEST): 1, ("m", NEW_REQUEST): 1}


def test_mesh_families_follow_the_cards_and_a_gone_worker_loses_its_series():
    recorder = DynamoRecorder("dyn")
    cards = {"m": [card("w1", blocks=100), card("w2", blocks=120), card("p1", PREFILL)]}
    recorder.watch(lambda: cards, migration_limit=3)
    view = recorder.mesh.view
    load = view.choice("m", "w1", "", 30)
    load.first_output(30)
    got = samples(recorder)
    assert got[("dyn_model_total_kv_blocks", (("model", "m"),))] == 120  # the largest card's
    assert got[("dyn_model_context_length", (("model", "m"),))] == 4096
    assert got[("dyn_model_kv_cache_block_size", (("model", "m"),))] == 16
    assert got[("dyn_model_max_num_seqs", (("model", "m"),))] == 256
    assert got[("dyn_model_migration_limit", (("model", "m"),))] == 3
    assert got[("dyn_worker_active_decode_blocks", worker_labels("w1"))] == 2  # 30 tokens in blocks of 16
    assert got[("dyn_worker_active_prefill_tokens", worker_labels("p1", "prefill"))] == 0
    assert got[("dyn_worker_last_input_sequence_tokens", worker_labels("w1"))] == 30
    load.ended(1)
    cards["m"] = [card("w2")]  # w1 left discovery
    got = samples(recorder)
    assert not [k for k in got if ("worker_id", "w1") in k[1]]
    assert "w1" not in view.last and got[("dyn_worker_active_decode_blocks", worker_labels("w2"))] == 0


def test_queued_cancelled_rejected_and_disconnected_follow_each_outcome():
    recorder = DynamoRecorder("dyn2")

    def end(reason: str, status: str, first: bool, stream: bool = True) -> None:
        recorder.started("m")
        if first:
            recorder.first_token("m", 0.1)
        assert samples(recorder)[("dyn2_queued_requests", (("model", "m"),))] == (0 if first else 1)
        recorder.ended(Outcome("m", "chat", stream, status, reason, True, 1.0, first_token=first))

    end("CANCELLED", "499", first=True)
    end("OVERLOADED", "503", first=False, stream=False)
    got = samples(recorder)
    assert got[("dyn2_queued_requests", (("model", "m"),))] == 0
    assert got[("dyn2_model_cancellation_total",
                (("endpoint", "chat_completions"), ("model", "m"), ("request_type", "stream")))] == 1
    assert got[("dyn2_model_rejection_total", (("endpoint", "chat_completions"), ("model", "m")))] == 1
    assert got[("dyn2_disconnected_clients", ())] == 1
