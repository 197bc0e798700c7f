"""meshfront attach's decisions: the card of a stock engine, its load report, when it is registered, DNS changes,
and the engine's KV events turned into the block hashes the preprocessor computes for a prompt."""

from __future__ import annotations

import pytest
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2

from services.common.cards import WorkerCard
from services.common.hashing import block_hashes, sequence_hashes
from services.workers.attach import convert
from services.workers.attach.core import (
    HEALTHY,
    SGLANG_SCHEDULER,
    SLOW,
    UNHEALTHY,
    VLLM_ENGINE,
    AttachSettings,
    CannotAttach,
    EngineInfo,
    EngineLoad,
    Health,
    address_of,
    card_for,
    load_report,
    split_dns_target,
    target_changes,
    worker_id,
)
from services.workers.engine_kv import BlockHashTranslator, BlocksStored
from services.workers.kv_events import BlockMirror

pytestmark = pytest.mark.unit

BS = 4


def settings(**kw) -> AttachSettings:
    return AttachSettings(**{"protocol": VLLM_ENGINE, "namespace": "ns1", **kw})


def info(model_dir, **kw) -> EngineInfo:
    return EngineInfo(**{"served_model_name": "tiny", "model_path": str(model_dir), "context_length": 512,
                         "block_size": 16, **kw})


def test_card_is_a_workers_card_with_the_engines_protocol(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    card = card_for(settings(tool_call_parser="hermes", reasoning_parser="qwen3"), "10.0.0.7:50051", info(tmp_path),
                    total_kv_blocks=300)
    assert (card.model.name, card.model.context_length, card.model.block_size) == ("tiny", 512, 16)
    assert (card.model.tool_call_parser, card.model.reasoning_parser) == ("hermes", "qwen3")
    assert (card.address, card.namespace, card.total_kv_blocks) == ("10.0.0.7:50051", "ns1", 300)
    assert card.engine_protocol == VLLM_ENGINE and card.kind == "vllm-grpc"
    assert card.worker_id == worker_id(VLLM_ENGINE, "10.0.0.7:50051") != worker_id(VLLM_ENGINE, "10.0.0.8:50051")
    assert card.model.model_files  # the tokenizer's files go to the Object Store, named by digest


def test_flags_win_over_the_engine(tmp_path):
    other = tmp_path / "here"
    other.mkdir()
    card = card_for(settings(model_name="served", model_dir=str(other), block_size=32), "e:1", info(tmp_path))
    assert (card.model.name, card.model.model_dir, card.model.block_size) == ("served", str(other), 32)


@pytest.mark.parametrize(("change", "flags", "why"), [
    ({"model_path": "/nowhere/at/all"}, {}, "--model-dir"),
    ({"block_size": 0}, {}, "--block-size"),
    ({"context_length": 0}, {}, "context length"),
    ({"is_generation": False}, {}, "embedding"),
    ({"data_parallel_size": 2}, {}, "data-parallel"),
])
def test_an_engine_the_card_cannot_describe_is_refused_with_the_reason(tmp_path, change, flags, why):
    with pytest.raises(CannotAttach, match=why):
        card_for(settings(**flags), "e:1", info(tmp_path, **change))


def test_load_report_in_blocks():
    assert load_report(EngineLoad(running=3, waiting=2, token_usage=0.25, total_tokens=1600), 16) == {
        "active_blocks": 25, "waiting": 2, "running": 3, "total_blocks": 100}
    assert load_report(EngineLoad(running=0, waiting=0, token_usage=0.5), 16)["total_blocks"] == 0


def test_health_drops_an_unhealthy_engine_at_once_and_a_slow_one_after_two_checks():
    h = Health()
    assert [h.observe(x) for x in (UNHEALTHY, HEALTHY, HEALTHY, UNHEALTHY, UNHEALTHY, HEALTHY)] == [
        None, "register", None, "deregister", None, "register"]
    assert [h.observe(x) for x in (SLOW, HEALTHY, SLOW, SLOW, SLOW, HEALTHY)] == [
        None, None, None, "deregister", None, "register"]


def test_dns_changes_and_targets():
    assert target_changes(["a:1", "b:1"], ["b:1", "c:1"]) == (["c:1"], ["a:1"])
    assert target_changes(["a:1"], []) == ([], ["a:1"])
    assert split_dns_target("engines.ns.svc.cluster.local:50051") == ("engines.ns.svc.cluster.local", 50051)
    for bad in ("engines", "engines:", ":50051", "engines:http", "engines:70000"):
        with pytest.raises(ValueError, match="NAME:PORT"):
            split_dns_target(bad)
    assert address_of("fd00::7", 50051) == "[fd00::7]:50051"


def _stored(hashes, parent, tokens, **fields) -> common_pb2.KvCacheEvent:
    blocks = [common_pb2.KvBlock(block_hash=h, token_ids=tokens[i * BS:(i + 1) * BS], block_size=BS)
              for i, h in enumerate(hashes)]
    stored = common_pb2.KvBlocksStored(blocks=blocks, **fields)
    if parent is not None:
        stored.parent_block_hash = parent
    return common_pb2.KvCacheEvent(stored=stored)


def _mirror(events) -> BlockMirror:
    mirror = BlockMirror()
    translator = BlockHashTranslator(mirror, BS)
    for event in events:
        translator.apply(event)
    return mirror


def test_engine_kv_events_carry_the_preprocessors_hashes():
    tokens = list(range(100, 112))  # three full blocks
    batch = common_pb2.KvEventBatch(sequence_number=1, events=[
        _stored([-5, 6], None, tokens[:8]), _stored([7], 6, tokens[8:12])])
    mirror = _mirror(convert.kv_events(batch, BS))
    assert [row[0] for row in mirror.dump()] == sequence_hashes(block_hashes(tokens, BS))
    removed = common_pb2.KvEventBatch(sequence_number=2, events=[
        common_pb2.KvCacheEvent(removed=common_pb2.KvBlocksRemoved(block_hashes=[7]))])
    mirror = _mirror([*convert.kv_events(batch, BS), *convert.kv_events(removed, BS)])
    assert [row[0] for row in mirror.dump()] == sequence_hashes(block_hashes(tokens, BS))[:2]


def test_other_tiers_groups_and_media_blocks_are_not_indexed():
    tokens = list(range(8))
    host = _stored([1], None, tokens, tier=common_pb2.KV_CACHE_TIER_HOST)
    group = _stored([2], None, tokens, group_idx=1)
    remote = _stored([3], None, tokens, locality=common_pb2.KV_CACHE_LOCALITY_REMOTE)
    media = _stored([4], None, tokens)
    media.stored.blocks[0].extra_keys.add(multimodal=common_pb2.KvMultimodalKey(identifier="img", offset=0))
    device = _stored([5], None, tokens, tier=common_pb2.KV_CACHE_TIER_DEVICE)
    events = convert.kv_events(common_pb2.KvEventBatch(events=[host, group, remote, media, device]), BS)
    assert events == [BlocksStored((5,), None, tokens[:BS], BS)]


def test_lora_blocks_are_salted_as_the_preprocessor_salts_them():
    tokens = list(range(4))
    events = convert.kv_events(common_pb2.KvEventBatch(events=[_stored([9], None, tokens, lora_name="sql")]), BS)
    assert [row[0] for row in _mirror(events).dump()] == sequence_hashes(block_hashes(tokens, BS, lora_name="sql"))


def test_engine_info_and_loads_from_vllms_messages(tmp_path):
    model = vllm_engine_pb2.GetModelInfoResponse(served_model_name="m", model_path=str(tmp_path),
                                                 max_context_length=2048, is_generation=True)
    server = vllm_engine_pb2.GetServerInfoResponse(block_size=16, data_parallel_size=0)
    assert convert.engine_info(VLLM_ENGINE, model, server) == EngineInfo("m", str(tmp_path), 2048, 16)
    loads = vllm_engine_pb2.GetLoadsResponse(loads=[vllm_engine_pb2.SchedulerLoad(
        num_running_reqs=2, num_waiting_reqs=1, token_usage=0.5, max_total_num_tokens=640)])
    assert convert.loads(loads) == EngineLoad(running=2, waiting=1, token_usage=0.5, total_tokens=640)
    assert convert.loads(vllm_engine_pb2.GetLoadsResponse()) is None
    record = common_pb2.KvEventBatch(load=common_pb2.EngineLoad(running_requests=4, waiting_requests=0,
                                                                token_usage=0.125))
    assert convert.batch_load(record, 640) == EngineLoad(running=4, waiting=0, token_usage=0.125, total_tokens=640)
    assert convert.batch_load(common_pb2.KvEventBatch(), 640) is None


def test_sglang_page_size_comes_from_its_server_args(tmp_path):
    from smg_grpc_proto.generated import sglang_scheduler_pb2

    model = sglang_scheduler_pb2.GetModelInfoResponse(served_model_name="m", model_path=str(tmp_path),
                                                      max_context_length=1024, is_generation=True)
    server = sglang_scheduler_pb2.GetServerInfoResponse()
    server.server_args.update({"page_size": 32, "dp_size": 1})
    assert convert.engine_info(SGLANG_SCHEDULER, model, server).block_size == 32


def test_trtllm_says_neither_name_nor_block_size_so_the_flags_must(tmp_path):
    from smg_grpc_proto.generated import trtllm_service_pb2

    from services.workers.attach.core import TRTLLM_SERVICE

    model = trtllm_service_pb2.GetModelInfoResponse(model_id=str(tmp_path), max_seq_len=8192)
    info = convert.engine_info(TRTLLM_SERVICE, model, trtllm_service_pb2.GetServerInfoResponse())
    assert info == EngineInfo("", str(tmp_path), 8192, 0)
    with pytest.raises(CannotAttach, match="--block-size"):
        card_for(settings(protocol=TRTLLM_SERVICE), "e:1", info)
    card = card_for(settings(protocol=TRTLLM_SERVICE, block_size=32, model_name="llama"), "e:1", info)
    assert (card.model.name, card.model.block_size, card.kind, card.engine_protocol) == (
        "llama", 32, "trtllm-grpc", TRTLLM_SERVICE)
    assert not convert.PROTOCOLS[TRTLLM_SERVICE].has_loads  # its load comes on the KV event batches alone


def test_the_models_sampling_defaults_go_on_the_card(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    model = vllm_engine_pb2.GetModelInfoResponse(
        served_model_name="m", model_path=str(tmp_path), max_context_length=2048, is_generation=True,
        default_sampling_params_json='{"temperature":0.7,"top_k":20,"top_p":0.8,"max_tokens":99}')
    engine = convert.engine_info(VLLM_ENGINE, model, vllm_engine_pb2.GetServerInfoResponse(block_size=16))
    # In the mesh's order of knobs; max_tokens is the mesh's to size, not a sampling default.
    assert engine.sampling_defaults == (("temperature", 0.7), ("top_p", 0.8), ("top_k", 20.0))
    card = card_for(settings(), "e:1", engine)
    assert WorkerCard.from_json(card.to_json()).sampling_defaults == engine.sampling_defaults


@pytest.mark.parametrize(("raw", "why"), [("{nope", "not JSON"), ("[0.7]", "not a JSON object"),
                                          ('{"temperature": "hot"}', "temperature is not a number")])
def test_sampling_defaults_the_card_cannot_carry_are_refused_with_the_reason(tmp_path, raw, why):
    model = vllm_engine_pb2.GetModelInfoResponse(model_path=str(tmp_path), max_context_length=2048,
                                                 default_sampling_params_json=raw)
    with pytest.raises(CannotAttach, match=why):
        convert.engine_info(VLLM_ENGINE, model, vllm_engine_pb2.GetServerInfoResponse(block_size=16))
