"""The vLLM worker's request mapping (pure; the engine tier checks vLLM accepts it)."""

from __future__ import annotations

import dataclasses

import pytest

from services.workers.engine import (
    EngineRequest,
    FinishReason,
    GuidedDecoding,
    RequestRejected,
    SamplingParams,
    TokenLogprob,
)
from services.workers.vllm import sampling

pytestmark = pytest.mark.unit

DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}


def request(**kw) -> EngineRequest:
    return EngineRequest(request_id="r", token_ids=[1, 2, 3], **kw)


def test_unset_knobs_take_the_models_defaults_and_set_ones_win():
    kw = sampling.sampling_kwargs(request(sampling=SamplingParams(temperature=0.0)), max_model_len=100,
                                  defaults=DEFAULTS)
    assert (kw["temperature"], kw["top_p"], kw["top_k"]) == (0.0, 0.8, 20)


def test_every_sampling_knob_is_mapped():
    knobs = SamplingParams(temperature=0.5, top_p=0.9, top_k=5, seed=7, min_p=0.1, frequency_penalty=0.2,
                           presence_penalty=0.3, repetition_penalty=1.1)
    kw = sampling.sampling_kwargs(request(sampling=knobs), max_model_len=100, defaults={})
    for field in dataclasses.fields(SamplingParams):
        assert kw[field.name] == getattr(knobs, field.name), field.name


def test_stops_and_lengths():
    kw = sampling.sampling_kwargs(request(max_tokens=500, min_tokens=2, eos_token_ids=(9, 8), stop_token_ids=(7, 9),
                                          ignore_eos=False, logprobs=3), max_model_len=100, defaults={})
    assert kw["max_tokens"] == 97  # clipped to the room the context window leaves
    assert kw["min_tokens"] == 2 and kw["stop_token_ids"] == [9, 8, 7] and kw["logprobs"] == 3
    assert kw["detokenize"] is False and kw["n"] == 1
    assert sampling.sampling_kwargs(request(), max_model_len=100, defaults={"max_tokens": 10})["max_tokens"] == 10
    assert sampling.sampling_kwargs(request(), max_model_len=100, defaults={})["max_tokens"] == 97


@pytest.mark.parametrize(("guided", "expected"), [
    (GuidedDecoding(json_schema='{"type": "string"}'), {"json": '{"type": "string"}'}),
    (GuidedDecoding(json_object=True), {"json_object": True}),
    (GuidedDecoding(regex="[ab]+"), {"regex": "[ab]+"}),
    (GuidedDecoding(choice=("x", "y")), {"choice": ["x", "y"]}),
    (GuidedDecoding(grammar='root ::= "a"'), {"grammar": 'root ::= "a"'}),
    (GuidedDecoding(structural_tag='{"type": "structural_tag"}'), {"structural_tag": '{"type": "structural_tag"}'}),
])
def test_guided_decoding_becomes_structured_outputs(guided, expected):
    assert sampling.sampling_kwargs(request(guided=guided), max_model_len=100, defaults={})[
        "structured_outputs"] == expected


@pytest.mark.parametrize(("req", "message"), [
    (EngineRequest(request_id="r", token_ids=[]), "empty"),
    (EngineRequest(request_id="r", token_ids=list(range(100))), "context window is 100"),
    (EngineRequest(request_id="r", token_ids=[1], max_tokens=0), "at least 1"),
])
def test_requests_it_cannot_serve_are_refused(req, message):
    with pytest.raises(RequestRejected, match=message):
        sampling.sampling_kwargs(req, max_model_len=100, defaults={})


@pytest.mark.parametrize(("reason", "stop", "expected"), [
    (None, None, FinishReason.NONE), ("length", None, FinishReason.LENGTH), ("stop", None, FinishReason.EOS),
    ("stop", 9, FinishReason.EOS), ("stop", 7, FinishReason.STOP), ("abort", None, FinishReason.CANCELLED),
    ("error", None, FinishReason.ERROR),
])
def test_finish_reasons_map_as_the_mocker_reports_them(reason, stop, expected):
    assert sampling.finish_reason(reason, stop, (9,)) == expected


@dataclasses.dataclass
class Logprob:  # vLLM's shape: logprob and rank
    logprob: float
    rank: int


def test_logprobs_keep_the_sampled_token_and_the_best_alternatives_in_rank_order():
    positions = [{5: Logprob(-3.0, 4), 1: Logprob(-0.1, 1), 2: Logprob(-1.0, 2)}]
    assert sampling.token_logprobs([5], positions, 2) == [TokenLogprob(5, -3.0, ((1, -0.1), (2, -1.0)))]
    with pytest.raises(ValueError):
        sampling.token_logprobs([5], [None], 2)
