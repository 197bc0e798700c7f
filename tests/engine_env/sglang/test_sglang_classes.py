"""The SGLang worker's names checked against SGLang 0.5.23's own classes (no GPU, no model).

- the request mapping builds SGLang's ``SamplingParams`` (normalized and verified as its tokenizer
  manager does) and ``GenerateReqInput``, and binds to ``Engine.async_generate``: a wrong field name
  fails here, never silently;
- KV events produced by SGLang's own recorder and publisher decode to Meshfront's block hashes;
- flags go through SGLang's own ``sglang serve`` parser.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import json
import time
from array import array
from pathlib import Path

import msgspec
import pytest
import xgrammar
from sglang.srt.disaggregation.kv_events import (
    EventPublisherFactory,
    KVEventBatch,
    KVEventsConfig,
    StorageMedium,
    ZmqEventPublisher,
)
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.radix_cache import RadixKey, TreeNode
from sglang.srt.sampling.sampling_params import SamplingParams as SglSamplingParams
from sglang.srt.server_args import ServerArgs

from services.common.hashing import block_hashes, sequence_hashes
from services.workers.config import ConfigError
from services.workers.engine import EngineRequest, GuidedDecoding, SamplingParams
from services.workers.engine_kv import BlockHashTranslator, BlocksStored, CacheCleared
from services.workers.engine_kv_zmq import ZmqKvSubscriber
from services.workers.sglang import engine as sglang_engine
from services.workers.sglang import sampling, transfer
from services.workers.sglang.config import OWNED_ENGINE_FLAGS, parse_config
from services.workers.sglang.kv_events import batch_decoder, events_config, media_pads

VOCAB = 151_936


class _Tokenizer:
    """Stands for SGLang's tokenizer in SamplingParams.normalize (which needs one only for stop strings)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        raise AssertionError("the worker never sends stop strings")


LIMITS = sampling.EngineLimits(max_model_len=4096, defaults={"temperature": 0.6, "top_p": 0.95}, seeded=True)
PROMPT = (151644, 872, 198, 9707)
REQUESTS = {
    "plain": EngineRequest("plain", PROMPT),
    "every_knob": EngineRequest(
        "every_knob", PROMPT,
        SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=7, min_p=0.05, frequency_penalty=0.1,
                       presence_penalty=0.2, repetition_penalty=1.1),
        max_tokens=32, min_tokens=4, eos_token_ids=(151645, 151643), stop_token_ids=(151657,), logprobs=3),
    "greedy_ignore_eos": EngineRequest("greedy", PROMPT, SamplingParams(temperature=0.0, top_k=-1), max_tokens=8,
                                       ignore_eos=True, logprobs=0),
    "json_schema": EngineRequest("js", PROMPT, guided=GuidedDecoding(json_schema='{"type": "integer"}')),
    "json_object": EngineRequest("jo", PROMPT, guided=GuidedDecoding(json_object=True)),
    "regex": EngineRequest("re", PROMPT, guided=GuidedDecoding(regex=r"[0-9]{3}")),
    "choice": EngineRequest("ch", PROMPT, guided=GuidedDecoding(choice=("yes", "no (maybe)", "a.b", "x y#z"))),
    "grammar": EngineRequest("gr", PROMPT, guided=GuidedDecoding(grammar='root ::= "yes" | "no"')),
}


def sglang_params(request: EngineRequest) -> SglSamplingParams:
    """What SGLang's TokenizerManager builds from the request (_create_tokenized_object)."""
    params = SglSamplingParams(**sampling.request_kwargs(request, "rid-0", LIMITS)["sampling_params"])
    params.normalize(_Tokenizer())
    params.verify(VOCAB)
    return params


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_request_builds_and_verifies_sglangs_sampling_params(name):
    params = sglang_params(REQUESTS[name])
    assert params.max_new_tokens == (REQUESTS[name].max_tokens or 4096 - len(PROMPT))
    assert params.n == 1


def test_every_field_lands_where_sglang_reads_it():
    params = sglang_params(REQUESTS["every_knob"])
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, 40, 0.05)
    assert (params.frequency_penalty, params.presence_penalty, params.repetition_penalty) == (0.1, 0.2, 1.1)
    assert params.sampling_seed == 7
    assert (params.max_new_tokens, params.min_new_tokens, params.ignore_eos) == (32, 4, False)
    assert params.stop_token_ids == {151645, 151643, 151657}
    assert (params.json_schema, params.regex, params.ebnf) == (None, None, None)


def test_greedy_and_ignore_eos_as_sglang_sees_them():
    params = sglang_params(REQUESTS["greedy_ignore_eos"])
    assert params.top_k == 1  # SGLang's greedy: temperature 0 becomes top_k 1
    assert params.ignore_eos is True
    assert params.stop_token_ids is None


def test_unset_knobs_carry_the_models_defaults_into_sglang():
    params = sglang_params(REQUESTS["plain"])
    assert (params.temperature, params.top_p) == (0.6, 0.95)


@pytest.mark.parametrize(("name", "field", "value"), [
    ("json_schema", "json_schema", '{"type": "integer"}'),
    ("json_object", "json_schema", '{"type": "object"}'),
    ("regex", "regex", "[0-9]{3}"),
    ("grammar", "ebnf", 'root ::= "yes" | "no"'),
])
def test_guided_decoding_lands_in_sglangs_grammar_fields(name, field, value):
    assert getattr(sglang_params(REQUESTS[name]), field) == value


def test_the_choice_regex_compiles_in_sglangs_default_grammar_backend():
    regex = sglang_params(REQUESTS["choice"]).regex
    xgrammar.Grammar.from_regex(regex)  # raises on a regex xgrammar cannot read
    assert regex == r"(yes|no \(maybe\)|a\.b|x y#z)"


def test_every_name_the_mapping_sends_is_a_sampling_params_field():
    fields = set(SglSamplingParams.__struct_fields__)
    sent = set(sampling.KNOBS) | {"sampling_seed", "n", "max_new_tokens", "min_new_tokens", "ignore_eos",
                                  "stop_token_ids", "json_schema", "regex", "ebnf"}
    assert sent <= fields


def test_the_defaultable_knobs_are_the_ones_sglangs_server_defaults():
    from sglang.srt.configs.model_config import ModelConfig
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9, top_k=20, min_p=0.05,
                              repetition_penalty=1.1, max_new_tokens=99)

    class Model:  # the two attributes get_default_sampling_params reads
        sampling_defaults = "model"
        hf_generation_config = config

    defaults = ModelConfig.get_default_sampling_params(Model())
    assert set(defaults) == set(sampling.DEFAULTABLE)


def test_sglangs_own_validation_still_applies_and_raises_value_error():
    # The engine turns SGLang's ValueErrors into RequestRejected.
    with pytest.raises(ValueError, match="min_new_tokens"):
        sglang_params(EngineRequest("x", PROMPT, max_tokens=2, min_tokens=5))
    with pytest.raises(ValueError, match="top_p"):
        sglang_params(EngineRequest("x", PROMPT, SamplingParams(top_p=0.0)))


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_generate_req_input_takes_the_request_kwargs(name):
    request = REQUESTS[name]
    kwargs = sampling.request_kwargs(request, "rid-0", LIMITS)
    obj = GenerateReqInput(**kwargs)
    obj.normalize_batch_and_arguments()
    assert obj.is_single
    assert (obj.input_ids, obj.rid, obj.stream) == (list(PROMPT), "rid-0", True)
    assert obj.return_logprob is (request.logprobs is not None)
    assert obj.top_logprobs_num == (request.logprobs or 0)
    assert obj.logprob_start_len == -1  # the output's logprobs only
    assert obj.sampling_params == kwargs["sampling_params"]


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_engine_async_generate_accepts_the_request_kwargs(name):
    kwargs = sampling.request_kwargs(REQUESTS[name], "rid-0", LIMITS)
    inspect.signature(Engine.async_generate).bind(object(), **kwargs)


def test_the_engine_reads_resolved_fields_serverargs_has():
    fields = {f.name for f in msgspec.structs.fields(ServerArgs)}
    assert set(sglang_engine.RESOLVED_FIELDS) <= fields


def test_the_engine_uses_tokenizer_manager_and_load_snapshot_names_sglang_has():
    from sglang.srt.managers import tokenizer_manager
    from sglang.srt.managers.load_snapshot import LoadSnapshot

    source = inspect.getsource(tokenizer_manager)
    for attribute in ("context_len", "num_reserved_tokens", "model_config", "load_snapshot_reader"):
        assert f"self.{attribute} =" in source, attribute
    for method in ("auto_create_handle_loop", "abort_request"):
        assert callable(getattr(tokenizer_manager.TokenizerManager, method)), method
    assert {"num_running_reqs", "num_waiting_reqs", "num_used_tokens"} <= set(LoadSnapshot.__struct_fields__)
    assert "self._scheduler_init_result = scheduler_init_result" in inspect.getsource(Engine.__init__)


# -- KV events ---------------------------------------------------------------------------------------------

PAGE = 4


class Recording:
    """A KvEventListener recording ("stored", hashes, parent) / ("removed", hashes) / ("cleared",)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def stored(self, blocks, parent_hash) -> None:
        self.events.append(("stored", [b.block_hash for b in blocks], parent_hash))

    def removed(self, hashes) -> None:
        self.events.append(("removed", list(hashes)))

    def cleared(self) -> None:
        self.events.append(("cleared",))


def radix_node(parent: TreeNode, tokens, *, bigram: bool = False) -> TreeNode:
    node = TreeNode()
    node.parent = parent
    node.key = RadixKey(array("q", tokens), is_bigram=bigram)
    return node


def radix_root() -> TreeNode:
    root = TreeNode()  # as RadixCache.reset makes it
    root.key = RadixKey(array("q"))
    root.hash_value = []
    return root


PREFIX, SUFFIX = list(range(100, 108)), list(range(200, 204))


def recorded_events() -> list:
    """What SGLang's radix cache records for: a 2-page node, a 1-page child, the child evicted,
    a page copied to host memory (HiCache), everything cleared."""
    recorder = KVCacheEventRecorder(enabled=True, page_size=PAGE)
    root = radix_root()
    prefix = radix_node(root, PREFIX)
    suffix = radix_node(prefix, SUFFIX)
    recorder.record_store(prefix)
    recorder.record_store(suffix)
    recorder.record_remove(suffix)
    recorder.record_store(radix_node(root, range(300, 304)), medium=StorageMedium.CPU)
    recorder.record_all_cleared()
    return recorder.take()


def expected_hashes(tokens) -> list[int]:
    return sequence_hashes(block_hashes(list(tokens), PAGE))


def test_sglangs_recorded_events_decode_and_translate_to_meshfront_hashes():
    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=recorded_events()))
    events = batch_decoder(media_pads())(payload)
    assert isinstance(events[0], BlocksStored) and events[0].block_size == PAGE  # SGLang merged the run
    listener = Recording()
    translator = BlockHashTranslator(listener, PAGE)
    for event in events:
        translator.apply(event)
    full = expected_hashes(PREFIX + SUFFIX)
    assert listener.events == [("stored", full, None), ("removed", [full[2]]), ("cleared",)]


def test_a_bigram_batch_sglangs_class_cannot_read_is_a_cleared_cache():
    recorder = KVCacheEventRecorder(enabled=True, page_size=PAGE)
    recorder.record_store(radix_node(radix_root(), range(400, 405), bigram=True))  # EAGLE's token pairs
    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=recorder.take()))
    assert batch_decoder(media_pads())(payload) == [CacheCleared()]


def shut(publisher: ZmqEventPublisher) -> None:
    publisher.shutdown()
    atexit.unregister(publisher.shutdown)  # SGLang registers it for interpreter exit as well


def test_events_config_is_read_by_sglang_as_a_zmq_publisher(tmp_path):
    endpoint, replay = f"ipc://{tmp_path}/kv.ipc", f"ipc://{tmp_path}/kv-replay.ipc"
    config = KVEventsConfig.from_cli(events_config(endpoint, replay))
    assert (config.publisher, config.endpoint, config.replay_endpoint, config.format) == ("zmq", endpoint, replay,
                                                                                         "default")
    publisher = EventPublisherFactory.create(events_config(endpoint, replay), 0)
    try:
        assert isinstance(publisher, ZmqEventPublisher)
    finally:
        shut(publisher)


async def test_sglangs_publisher_to_meshfront_hashes_over_zmq_with_a_replayed_first_batch(tmp_path):
    endpoint, replay = f"ipc://{tmp_path}/kv.ipc", f"ipc://{tmp_path}/kv-replay.ipc"
    publisher = EventPublisherFactory.create(events_config(endpoint, replay), 0)
    recorder = KVCacheEventRecorder(enabled=True, page_size=PAGE)
    root = radix_root()
    prefix = radix_node(root, PREFIX)
    listener = Recording()
    translator = BlockHashTranslator(listener, PAGE)
    subscriber = None
    try:
        recorder.record_store(prefix)
        publisher.publish(KVEventBatch(ts=time.time(), events=recorder.take()))  # seq 0: nobody listens yet
        await asyncio.sleep(0.3)
        subscriber = ZmqKvSubscriber(endpoint, replay, batch_decoder(media_pads()), translator.apply)
        subscriber.start()
        await asyncio.sleep(0.3)  # the subscription reaches the PUB socket
        recorder.record_store(radix_node(prefix, SUFFIX))
        publisher.publish(KVEventBatch(ts=time.time(), events=recorder.take()))  # seq 1: live
        deadline = time.monotonic() + 10
        while subscriber.batches < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        full = expected_hashes(PREFIX + SUFFIX)
        # Batch 0 came back through SGLang's replay socket, so batch 1's parent was known.
        assert listener.events == [("stored", full[:2], None), ("stored", full[2:], full[1])]
        assert (subscriber.batches, subscriber.replayed, subscriber.resets) == (2, 1, 0)
    finally:
        if subscriber is not None:
            await subscriber.close()
        shut(publisher)


# -- flags -------------------------------------------------------------------------------------------------


@pytest.fixture
def model_dir(tmp_path) -> Path:
    path = tmp_path / "demo-model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return path


def test_pass_through_flags_land_in_sglangs_server_args(model_dir):
    cfg = parse_config(["--model-dir", str(model_dir), "--model-name", "demo", "--port", "0", "--log-level", "DEBUG",
                        "--tp-size", "2", "--mem-fraction-static", "0.5", "--page-size", "16",
                        "--context-length", "2048", "--enable-deterministic-inference"], env={})
    server_args = cfg.server_args()
    assert isinstance(server_args, ServerArgs)
    assert (server_args.tp_size, server_args.mem_fraction_static, server_args.page_size) == (2, 0.5, 16)
    assert (server_args.context_length, server_args.enable_deterministic_inference) == (2048, True)
    # The worker's own flags: the model, its name and the log level go to SGLang as its own.
    assert (server_args.model_path, server_args.served_model_name) == (str(model_dir), "demo")
    assert server_args.log_level == "debug"
    # --port is the worker's gRPC port; SGLang's (its HTTP server, never started) keeps its default.
    assert (cfg.args.port, server_args.port) == (0, 30000)
    events = KVEventsConfig.from_cli(server_args.kv_events_config)
    assert (events.publisher, events.endpoint, events.replay_endpoint) == ("zmq", cfg.kv_events_endpoint,
                                                                           cfg.kv_replay_endpoint)
    assert cfg.kv_events_endpoint.startswith("ipc://") and cfg.args.worker_id in cfg.kv_events_endpoint


def test_without_registration_there_are_no_kv_events(model_dir):
    server_args = parse_config(["--model-dir", str(model_dir), "--no-register"], env={}).server_args()
    assert server_args.kv_events_config is None


@pytest.mark.parametrize("argv", [["--model-path", "/m"], ["--served-model-name", "x"],
                                  ["--kv-events-config", "{}"], ["--incremental-streaming-output"]])
def test_owned_flags_are_refused_naming_the_replacement(model_dir, argv):
    with pytest.raises(ConfigError) as error:
        parse_config(["--model-dir", str(model_dir), *argv], env={})
    flag = argv[0].split("=")[0]
    assert str(error.value) == f"{flag} is set by the worker: use {OWNED_ENGINE_FLAGS[flag]}"


def test_an_owned_setting_from_sglangs_config_file_is_refused_too(model_dir, tmp_path):
    config = tmp_path / "sglang.yaml"
    config.write_text("incremental-streaming-output: true\n")
    cfg = parse_config(["--model-dir", str(model_dir), "--config", str(config)], env={})
    with pytest.raises(ConfigError, match="incremental_streaming_output"):
        cfg.server_args()


def test_data_parallel_without_registration_has_no_kv_events(model_dir):
    # Registered, each rank publishes on its own port: tests/engine_env/sglang/test_sglang_dp_ranks.py.
    server_args = parse_config(["--model-dir", str(model_dir), "--dp-size", "2", "--no-register"],
                               env={}).server_args()
    assert server_args.dp_size == 2 and server_args.kv_events_config is None


def test_a_misspelt_engine_flag_fails_in_sglangs_parser_naming_it(model_dir, capsys):
    cfg = parse_config(["--model-dir", str(model_dir), "--mem-fraction-statik", "0.5"], env={})
    with pytest.raises(SystemExit) as exit_:
        cfg.server_args()
    assert exit_.value.code == 2
    assert "--mem-fraction-statik" in capsys.readouterr().err


# -- disaggregation: the bootstrap fields ------------------------------------------------------------------


def test_the_bootstrap_fields_are_generate_req_inputs_and_async_generates():
    bootstrap = transfer.Bootstrap("10.0.0.5", 8998, 2**63 - 1)
    kwargs = {**sampling.request_kwargs(REQUESTS["plain"], "rid-0", LIMITS), **bootstrap.request_kwargs()}
    inspect.signature(Engine.async_generate).bind(object(), **kwargs)
    obj = GenerateReqInput(**kwargs)
    obj.normalize_batch_and_arguments()
    assert (obj.bootstrap_host, obj.bootstrap_port, obj.bootstrap_room) == ("10.0.0.5", 8998, 2**63 - 1)


@pytest.mark.parametrize(("mode", "sglangs"), [("prefill", "prefill"), ("decode", "decode"), ("agg", "null")])
def test_the_workers_disaggregation_mode_is_sglangs(model_dir, mode, sglangs):
    argv = ["--model-dir", str(model_dir), "--host", "0.0.0.0", "--disaggregation-mode", mode,
            "--disaggregation-bootstrap-port", "9123", "--disaggregation-transfer-backend", "nixl"]
    cfg = parse_config(argv, env={})
    server_args = cfg.server_args()
    assert cfg.worker(context_length=1, block_size=1).role == {"agg": "both"}.get(mode, mode)
    assert server_args.disaggregation_mode == sglangs
    assert (server_args.disaggregation_bootstrap_port, server_args.disaggregation_transfer_backend) == (9123, "nixl")
    assert server_args.resolved_dict()["disaggregation_bootstrap_port"] == 9123  # what the engine reads
    # A prefill worker's bootstrap server listens on the worker's host; otherwise SGLang keeps its own.
    assert server_args.host == ("0.0.0.0" if mode == "prefill" else "127.0.0.1")


def test_sglangs_decode_server_starts_its_output_with_the_first_token_that_came_with_the_kv():
    """The paired order (services/postprocessor/disagg_paired.py) sends the decode leg the prefill leg's prompt and
    drops the decode leg's copy of the first token: SGLang's decode server commits the prefill server's token, sent
    over in the transfer's metadata, as its request's first output id."""
    from sglang.srt.disaggregation.decode import DecodeTransferQueue

    source = inspect.getsource(DecodeTransferQueue._commit_transfer_to_req)
    assert "self.metadata_buffers.get_buf(idx)" in source and "output_id," in source
    assert "decode_req.req.output_ids.append(committed_output_id)" in source
    assert "committed_output_id = output_id[0].item()" in source
    # And the prefill server waits for the decode server for this long (what the sequential order would wait out).
    from sglang.srt.environ import envs

    assert envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get() == 300
