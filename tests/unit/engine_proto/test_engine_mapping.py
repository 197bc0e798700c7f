"""Our worker requests and responses against SMG's engine proto classes (the pinned smg-grpc-proto package),
for each of the three services: every field the mapping sets exists there, and reads back as we meant."""

from __future__ import annotations

import pytest
from meshfront.common.v1 import common_pb2
from smg_grpc_proto import sglang_scheduler_pb2, trtllm_service_pb2, vllm_engine_pb2

from services.common.cards import ENGINE_PROTOCOLS, SGLANG_SCHEDULER, TRTLLM_SERVICE, VLLM_ENGINE
from services.common.engine_proto import (
    EngineStream,
    abort_request,
    embed_request,
    generate_request,
    refusal,
    with_defaults,
)

F = common_pb2


def _request(**guided) -> common_pb2.PreprocessedRequest:
    return common_pb2.PreprocessedRequest(
        request_id="r", model="m", token_ids=[5, 6, 7], eos_token_ids=[2],
        sampling=common_pb2.SamplingOptions(temperature=0.5, top_p=0.9, top_k=40, seed=(1 << 40) + 7,
                                            frequency_penalty=0.1, presence_penalty=0.2, repetition_penalty=1.1,
                                            min_p=0.05, guided_decoding=common_pb2.GuidedDecoding(**guided)),
        stop=common_pb2.StopConditions(max_tokens=9, stop=["never sent"], stop_token_ids_hidden=[3, 2],
                                       min_tokens=1, ignore_eos=True),
        output=common_pb2.OutputOptions(logprobs=2))


def test_vllm_request_carries_every_knob():
    out = generate_request(VLLM_ENGINE, _request(regex="a+"), "r-0", 100)
    assert isinstance(out, vllm_engine_pb2.GenerateRequest)
    p = out.sampling_params
    assert (out.request_id, list(out.tokenized.input_ids), out.stream) == ("r-0", [5, 6, 7], True)
    assert (p.temperature, p.top_k, p.max_tokens, p.min_tokens, p.ignore_eos, p.logprobs, p.n) == (
        pytest.approx(0.5), 40, 9, 1, True, 2, 1)
    assert (p.top_p, p.min_p, p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == pytest.approx(
        (0.9, 0.05, 0.1, 0.2, 1.1))
    assert p.seed == 7  # the low 31 bits of a 64-bit seed
    assert list(p.stop_token_ids) == [2, 3] and not p.stop  # EOS and hidden ids; stop strings stay ours
    assert p.WhichOneof("constraint") == "regex" and p.regex == "a+"
    assert not out.HasField("data_parallel_rank")


def test_vllm_unset_knobs_stay_unset_for_the_engines_defaults():
    req = common_pb2.PreprocessedRequest(request_id="r", token_ids=[1], dp_rank=0,
                                         sampling=common_pb2.SamplingOptions(top_k=-1))
    out = generate_request(VLLM_ENGINE, req, "r-0", 100)
    p = out.sampling_params
    assert not p.HasField("temperature") and not p.HasField("max_tokens") and not p.HasField("logprobs")
    assert not p.HasField("seed") and p.top_k == 0 and p.WhichOneof("constraint") is None
    assert out.HasField("data_parallel_rank") and out.data_parallel_rank == 0


@pytest.mark.parametrize(("guided", "field", "value"), [
    ({"json_schema": '{"type": "string"}'}, "json_schema", '{"type": "string"}'),
    ({"json_object": True}, "json_object", True),
    ({"grammar": "root ::= x"}, "grammar", "root ::= x"),
    ({"structural_tag": "{}"}, "structural_tag", "{}"),
])
def test_vllm_constraints(guided, field, value):
    p = generate_request(VLLM_ENGINE, _request(**guided), "r", 100).sampling_params
    assert p.WhichOneof("constraint") == field and getattr(p, field) == value
    p = generate_request(VLLM_ENGINE, _request(choice=["yes", "no"]), "r", 100).sampling_params
    assert list(p.choice.choices) == ["yes", "no"]


def test_sglang_request_carries_every_knob_and_its_unset_defaults_are_openais():
    req = _request(grammar="root ::= x")
    req.sampling.ClearField("seed")
    req.lora.name = "my-adapter"
    out = generate_request(SGLANG_SCHEDULER, req, "r-0", 100)
    assert isinstance(out, sglang_scheduler_pb2.GenerateRequest)
    p = out.sampling_params
    assert (p.top_k, p.max_new_tokens, p.min_new_tokens, p.ignore_eos, p.n) == (40, 9, 1, True, 1)
    assert (p.temperature, p.top_p, p.min_p, p.repetition_penalty) == pytest.approx((0.5, 0.9, 0.05, 1.1))
    assert list(p.stop_token_ids) == [2, 3] and p.ebnf_grammar == "root ::= x"
    assert (out.return_logprob, out.top_logprobs_num, out.lora_id, out.stream) == (True, 2, "my-adapter", True)
    bare = generate_request(SGLANG_SCHEDULER, common_pb2.PreprocessedRequest(token_ids=[1]), "r", 100)
    assert (bare.sampling_params.temperature, bare.sampling_params.top_p, bare.sampling_params.top_k,
            bare.sampling_params.repetition_penalty) == (1.0, 1.0, -1, 1.0)  # not the proto's zeros (greedy)
    assert not bare.return_logprob and not bare.sampling_params.HasField("max_new_tokens")
    json_object = generate_request(SGLANG_SCHEDULER, _request(json_object=True), "r", 100).sampling_params
    assert json_object.json_schema == '{"type": "object"}'


def test_trtllm_request_carries_every_knob_and_sizes_max_tokens_from_the_context():
    out = generate_request(TRTLLM_SERVICE, _request(json_schema="{}"), "r-0", 100)
    assert isinstance(out, trtllm_service_pb2.GenerateRequest)
    c = out.sampling_config
    assert (c.beam_width, c.num_return_sequences, c.top_k, c.seed, c.min_tokens) == (1, 1, 40, (1 << 40) + 7, 1)
    assert (c.temperature, c.top_p, c.min_p, c.frequency_penalty, c.presence_penalty,
            c.repetition_penalty) == pytest.approx((0.5, 0.9, 0.05, 0.1, 0.2, 1.1))
    assert (out.max_tokens, out.streaming, out.ignore_eos, out.output_config.logprobs) == (9, True, True, 2)
    assert list(out.tokenized.input_token_ids) == [5, 6, 7] and list(out.stop_token_ids) == [2, 3]
    assert out.guided_decoding.guide_type == trtllm_service_pb2.GuidedDecodingParams.GUIDE_TYPE_JSON_SCHEMA
    bare = generate_request(TRTLLM_SERVICE, common_pb2.PreprocessedRequest(token_ids=[1, 2]), "r", 100)
    assert bare.max_tokens == 98 and not bare.HasField("guided_decoding")


@pytest.mark.parametrize("protocol", ENGINE_PROTOCOLS)
def test_what_no_proto_carries_is_refused_with_the_reason(protocol):
    assert refusal(protocol, common_pb2.PreprocessedRequest(token_ids=[1])) is None
    media = common_pb2.PreprocessedRequest(token_ids=[1], media=[common_pb2.MediaItem(modality="image")])
    assert "images" in str(refusal(protocol, media))
    assert "disaggregated" in str(refusal(protocol, common_pb2.PreprocessedRequest(token_ids=[1]),
                                          disaggregated=True))
    leg = common_pb2.PreprocessedRequest(disaggregation=common_pb2.DisaggregationParams(
        role=common_pb2.DISAGGREGATION_ROLE_PREFILL))
    assert "disaggregated" in str(refusal(protocol, leg))
    thinking = common_pb2.PreprocessedRequest(stop=common_pb2.StopConditions(max_thinking_tokens=5))
    refused = refusal(protocol, thinking)
    assert refused is not None and refused.param == "max_thinking_tokens"


def test_what_one_proto_lacks_is_refused_for_that_engine_only():
    lora = common_pb2.PreprocessedRequest(lora=common_pb2.LoraAdapter(name="a", path="/a"))
    assert refusal(SGLANG_SCHEDULER, lora) is None
    assert "LoRA" in str(refusal(VLLM_ENGINE, lora)) and "LoRA" in str(refusal(TRTLLM_SERVICE, lora))
    seed = common_pb2.PreprocessedRequest(sampling=common_pb2.SamplingOptions(seed=1))
    assert refusal(VLLM_ENGINE, seed) is None and refusal(TRTLLM_SERVICE, seed) is None
    assert "seed" in str(refusal(SGLANG_SCHEDULER, seed))
    choice = common_pb2.PreprocessedRequest(sampling=common_pb2.SamplingOptions(
        guided_decoding=common_pb2.GuidedDecoding(choice=["a", "b"])))
    assert refusal(VLLM_ENGINE, choice) is None
    assert "choice" in str(refusal(SGLANG_SCHEDULER, choice)) and "choice" in str(refusal(TRTLLM_SERVICE, choice))
    ranked = common_pb2.PreprocessedRequest(dp_rank=1)
    assert "rank" in str(refusal(TRTLLM_SERVICE, ranked)) and refusal(VLLM_ENGINE, ranked) is None


def test_vllm_stream_reads_chunks_and_a_complete_that_repeats_the_last_delta():
    pb = vllm_engine_pb2
    stream = EngineStream(eos_token_ids=[2])
    top = pb.TopLogProbs(values=[-0.1, -2.0], token_ids=[10, 11])
    first = stream.read([pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
        token_ids=[10], prompt_tokens=3, cached_tokens=2,
        output_logprobs=pb.OutputLogProbs(token_logprobs=[-0.1], token_ids=[10], top_logprobs=[top])))])
    assert (list(first.token_ids), first.prompt_tokens, first.cached_tokens, first.finish_reason) == ([10], 3, 2, 0)
    assert first.logprobs[0].token_id == 10 and [t.token_id for t in first.logprobs[0].top] == [10, 11]
    # The last delta and the complete message that repeats it, arrived together: one response, ids once.
    done = stream.read([pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[12, 2], prompt_tokens=3)),
                        pb.GenerateResponse(complete=pb.GenerateComplete(output_ids=[12, 2], finish_reason="stop",
                                                                         matched_token_id=2, prompt_tokens=3))])
    assert list(done.token_ids) == [12, 2] and done.finish_reason == F.FINISH_REASON_EOS


def test_trtllm_stream_takes_the_cumulative_completes_tail_past_the_chunks():
    pb = trtllm_service_pb2
    stream = EngineStream(eos_token_ids=[2])
    stream.read([pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[10, 11]))])
    done = stream.read([pb.GenerateResponse(complete=pb.GenerateComplete(
        output_token_ids=[10, 11, 12], finish_reason="length",
        logprobs=[pb.TokenLogprob(token_id=t, logprob=-1.0) for t in (10, 11, 12)]))])
    assert list(done.token_ids) == [12] and [lp.token_id for lp in done.logprobs] == [12]
    assert done.finish_reason == F.FINISH_REASON_LENGTH


def test_an_unreadable_response_fails_loudly():
    with pytest.raises(ValueError, match="neither chunk nor complete"):
        EngineStream([2]).read([vllm_engine_pb2.GenerateResponse()])


@pytest.mark.parametrize(("reason", "matched", "expected"), [
    ("stop", None, F.FINISH_REASON_EOS), ("stop", 2, F.FINISH_REASON_EOS), ("stop", 3, F.FINISH_REASON_STOP),
    ("length", None, F.FINISH_REASON_LENGTH), ("abort", None, F.FINISH_REASON_CANCELLED),
    ("error", None, F.FINISH_REASON_ERROR)])
def test_sglang_finish_reasons(reason, matched, expected):
    pb = sglang_scheduler_pb2
    complete = pb.GenerateComplete(finish_reason=reason)
    if matched is not None:
        complete.matched_token_id = matched
    assert EngineStream([2]).read([pb.GenerateResponse(complete=complete)]).finish_reason == expected


def test_embed_requests():
    assert list(embed_request(VLLM_ENGINE, "e", [1, 2]).tokenized.input_ids) == [1, 2]
    assert list(embed_request(SGLANG_SCHEDULER, "e", [1, 2]).tokenized.input_ids) == [1, 2]
    assert list(embed_request(TRTLLM_SERVICE, "e", [1, 2]).tokenized.input_token_ids) == [1, 2]
    with pytest.raises(ValueError, match="unknown engine protocol"):
        embed_request("openai", "e", [1])


def test_abort_requests_name_the_engines_sequence():
    assert list(abort_request(VLLM_ENGINE, "r-0").request_ids) == ["r-0"]
    assert abort_request(SGLANG_SCHEDULER, "r-0").request_id == "r-0"
    assert abort_request(TRTLLM_SERVICE, "r-0").request_id == "r-0"


# The demo model's generation_config.json, as vLLM's servicer advertises it (GetModelInfo).
DEFAULTS = (("temperature", 0.7), ("top_p", 0.8), ("top_k", 20.0), ("repetition_penalty", 1.05))


@pytest.mark.parametrize("protocol", ENGINE_PROTOCOLS)
def test_unset_knobs_take_the_models_defaults_and_the_clients_stay_the_clients(protocol):
    req = common_pb2.PreprocessedRequest(request_id="r", token_ids=[1], stop=common_pb2.StopConditions(max_tokens=4),
                                         sampling=common_pb2.SamplingOptions(temperature=0.0))  # greedy, asked
    out = generate_request(protocol, req, "r-0", 100, DEFAULTS)
    p = out.sampling_config if protocol == TRTLLM_SERVICE else out.sampling_params
    assert p.temperature == 0.0  # the client's zero is not "unset"
    assert (p.top_p, p.top_k, p.repetition_penalty) == pytest.approx((0.8, 20, 1.05))
    assert not req.sampling.HasField("top_p")  # the request itself is left as it came


def test_without_defaults_or_with_every_knob_set_the_sampling_message_is_the_requests_own():
    req = _request()
    assert with_defaults(req.sampling, DEFAULTS) is req.sampling
    assert with_defaults(common_pb2.SamplingOptions(), ()) == common_pb2.SamplingOptions()
    with pytest.raises(ValueError, match="max_tokens"):
        with_defaults(common_pb2.SamplingOptions(), (("max_tokens", 5.0),))
