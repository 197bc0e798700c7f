"""The vLLM adapter against vLLM 0.32's own classes; runs in .venv-vllm only, no engine started:

    .venv-vllm/bin/python -m pytest tests/engine_env/vllm -o addopts="--import-mode=importlib"

A wrong field name, a constraint vLLM would refuse, an event shape that changed, KV connector
parameters vLLM reads from elsewhere: each fails here rather than on a user's request. (`make test`
runs it; the main run ignores tests/engine_env.)
"""

from __future__ import annotations

import msgspec
import pytest
from vllm.config import KVTransferConfig
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from vllm.exceptions import QueueOverflowError, VLLMValidationError
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.request import Request

from services.common.hashing import block_hashes, sequence_hashes
from services.workers.config import ConfigError
from services.workers.engine import (
    EngineBusy,
    EngineError,
    EngineRequest,
    GuidedDecoding,
    RequestRejected,
    SamplingParams,
)
from services.workers.engine_kv import BlockHashTranslator
from services.workers.vllm import transfer
from services.workers.vllm.config import parse_config
from services.workers.vllm.engine import VLLM_ERRORS, engine_error, sampling_params
from services.workers.vllm.kv_events import batch_decoder

DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
KNOBS = SamplingParams(temperature=0.5, top_p=0.9, top_k=5, seed=2**63, min_p=0.1, frequency_penalty=0.2,
                       presence_penalty=0.3, repetition_penalty=1.1)


def req(**kw) -> EngineRequest:
    return EngineRequest(request_id="r", token_ids=[1, 2, 3], **kw)


def test_every_knob_lands_in_vllms_sampling_params():
    p = sampling_params(req(sampling=KNOBS, max_tokens=7, min_tokens=2, eos_token_ids=(9,), stop_token_ids=(4,),
                            logprobs=3), max_model_len=100, defaults=DEFAULTS)
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.min_p) == (0.5, pytest.approx(0.9), 5, 2**63,
                                                                   pytest.approx(0.1))
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == pytest.approx((0.2, 0.3, 1.1))
    assert (p.max_tokens, p.min_tokens, p.stop_token_ids, p.logprobs) == (7, 2, [9, 4], 3)
    assert p.detokenize is False and p.output_kind == RequestOutputKind.DELTA and p.n == 1


def test_unset_knobs_take_the_models_defaults():
    p = sampling_params(req(), max_model_len=100, defaults=DEFAULTS)
    assert (p.temperature, p.top_p, p.top_k) == (0.7, pytest.approx(0.8), 20)


@pytest.mark.parametrize(("guided", "field", "value"), [
    (GuidedDecoding(json_schema='{"type": "string"}'), "json", '{"type": "string"}'),
    (GuidedDecoding(json_object=True), "json_object", True),
    (GuidedDecoding(regex="[ab]+"), "regex", "[ab]+"),
    (GuidedDecoding(choice=("x", "y")), "choice", ["x", "y"]),
    (GuidedDecoding(grammar='root ::= "a"'), "grammar", 'root ::= "a"'),
])
def test_each_guided_kind_becomes_vllms_structured_outputs(guided, field, value):
    structured = sampling_params(req(guided=guided), max_model_len=100, defaults={}).structured_outputs
    assert getattr(structured, field) == value


@pytest.mark.parametrize("knobs", [SamplingParams(top_p=0.0), SamplingParams(temperature=-1.0),
                                   SamplingParams(repetition_penalty=0.0), SamplingParams(top_k=-5)])
def test_what_vllm_refuses_is_the_clients_fault(knobs):
    with pytest.raises(RequestRejected):
        sampling_params(req(sampling=knobs), max_model_len=100, defaults={})


@pytest.mark.parametrize(("raised", "expected"), [
    (VLLMValidationError("bad"), RequestRejected), (ValueError("bad"), RequestRejected),
    (QueueOverflowError(), EngineBusy), (EngineDeadError(), EngineError),
])
def test_vllms_errors_map_to_the_worker_glues(raised, expected):
    assert isinstance(raised, VLLM_ERRORS)  # what the stream's loop catches
    mapped = engine_error(raised)
    assert type(mapped) is expected


def test_vllms_own_event_batches_become_meshfront_hashes():
    bs, tokens = 4, list(range(50, 62))
    events = [BlockStored(block_hashes=[b"e0", b"e1"], parent_block_hash=None, token_ids=tokens[:8], block_size=bs,
                          lora_id=None, medium="GPU", lora_name=None),
              BlockStored(block_hashes=[b"e2"], parent_block_hash=b"e1", token_ids=tokens[8:], block_size=bs,
                          lora_id=None, medium="GPU", lora_name=None),
              BlockStored(block_hashes=[b"cpu"], parent_block_hash=None, token_ids=tokens[:4], block_size=bs,
                          lora_id=None, medium="CPU", lora_name=None),
              BlockRemoved(block_hashes=[b"e2"], medium="GPU"),
              AllBlocksCleared()]
    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=1.0, events=events))
    calls = []

    class Listener:
        def stored(self, blocks, parent_hash):
            calls.append(("stored", [b.block_hash for b in blocks], parent_hash))

        def removed(self, hashes):
            calls.append(("removed", list(hashes)))

        def cleared(self):
            calls.append(("cleared",))

    translator = BlockHashTranslator(Listener(), bs)
    for event in batch_decoder()(payload):
        translator.apply(event)
    ours = sequence_hashes(block_hashes(tokens, bs))
    assert calls == [("stored", ours[:2], None), ("stored", ours[2:], ours[1]), ("removed", ours[2:]), ("cleared",)]


def test_pass_through_flags_reach_vllms_engine_args(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    cfg = parse_config(["--model-dir", str(model), "--model-name", "served", "--tensor-parallel-size", "2",
                        "--max-model-len", "2048", "--block-size", "32", "--no-enable-prefix-caching",
                        "--quantization", "fp8", "--enable-lora"], env={})
    args = cfg.engine_args()
    assert (args.model, args.served_model_name) == (str(model), ["served"])
    assert (args.tensor_parallel_size, args.max_model_len, args.block_size) == (2, 2048, 32)
    assert (args.enable_prefix_caching, args.quantization, args.enable_lora) == (False, "fp8", True)
    assert args.kv_events_config.enable_kv_cache_events and args.kv_events_config.endpoint == cfg.kv_events_endpoint


def test_a_prefill_legs_params_reach_vllms_request_as_its_connector_reads_them():
    p = sampling_params(req(max_tokens=40, kv_transfer_params={"do_remote_decode": True}), max_model_len=100,
                        defaults={})
    request = Request("r", [1, 2, 3], p, None)
    assert request.kv_transfer_params == {"do_remote_decode": True} and request.max_tokens == 1


def test_a_decode_legs_params_reach_vllms_request_untouched():
    returned = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[7, 8]],
                "remote_engine_id": "e", "remote_request_id": "r0", "remote_host": "10.0.0.2", "remote_port": 5600,
                "tp_size": 1}
    request = Request("r", [1, 2, 3], sampling_params(req(max_tokens=9, kv_transfer_params=returned),
                                                      max_model_len=100, defaults={}), None)
    assert request.kv_transfer_params == returned and request.max_tokens == 9


NIXL = '{"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"backends": ["UCX"]}}'


def test_kv_transfer_config_passes_through_to_vllms_own_class(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    cfg = parse_config(["--model-dir", str(model), "--disaggregation-mode", "prefill", "--kv-transfer-config", NIXL],
                       env={})
    kv = cfg.engine_args().kv_transfer_config
    assert isinstance(kv, KVTransferConfig)
    assert (kv.kv_connector, kv.kv_role, kv.kv_connector_extra_config) == ("NixlConnector", "kv_both",
                                                                           {"backends": ["UCX"]})
    assert cfg.worker(context_length=1, block_size=1).role == "prefill"


@pytest.mark.parametrize(("mode", "flags", "error"), [
    ("decode", (), "needs vLLM's --kv-transfer-config"),
    ("prefill", ("--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}'),
     "not kv_consumer"),
    ("decode", ("--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}'),
     "not kv_producer"),
])
def test_a_role_vllms_connector_cannot_play_is_refused(tmp_path, mode, flags, error):
    model = tmp_path / "m"
    model.mkdir()
    cfg = parse_config(["--model-dir", str(model), "--disaggregation-mode", mode, *flags], env={})
    with pytest.raises(ConfigError, match=error):
        cfg.engine_args()


@pytest.mark.parametrize(("role", "producer", "consumer"), [("kv_producer", True, False), ("kv_consumer", False, True),
                                                            ("kv_both", True, True)])
def test_the_role_check_reads_vllms_own_properties(role, producer, consumer):
    kv = KVTransferConfig(kv_connector="NixlConnector", kv_role=role)
    assert (kv.is_kv_producer, kv.is_kv_consumer) == (producer, consumer)
    assert (transfer.role_errors("prefill", kv) == []) == producer
    assert (transfer.role_errors("decode", kv) == []) == consumer
