"""The SGLang worker's pure request/output mapping (services/workers/sglang/sampling.py): every field, every refusal.

That the names produced here are SGLang's own is checked against SGLang's classes in
tests/engine_env/sglang (run in .venv-sglang).
"""

from __future__ import annotations

import re

import pytest

from services.workers.engine import (
    EngineBusy,
    EngineError,
    EngineRequest,
    FinishReason,
    GuidedDecoding,
    RequestRejected,
    SamplingParams,
    TokenLogprob,
)
from services.workers.sglang import sampling
from services.workers.sglang.sampling import EngineLimits, NewTokens
from services.workers.thinking_budget import ThinkingMarkers

pytestmark = pytest.mark.unit

LIMITS = EngineLimits(max_model_len=100)
PROMPT = (11, 12, 13, 14)


def req(**kw) -> EngineRequest:
    kw.setdefault("token_ids", PROMPT)
    return EngineRequest(request_id="r1", **kw)


def params(request: EngineRequest, limits: EngineLimits = LIMITS) -> dict:
    return sampling.request_kwargs(request, "r1-0", limits)["sampling_params"]


# -- the request --------------------------------------------------------------------------------------


def test_plain_request_is_token_ids_in_a_stream_with_sglang_defaults_left_alone():
    kwargs = sampling.request_kwargs(req(), "r1-0", LIMITS)
    assert kwargs == {"input_ids": [11, 12, 13, 14], "rid": "r1-0", "stream": True,
                      "sampling_params": {"n": 1, "max_new_tokens": 96, "min_new_tokens": 0, "ignore_eos": False,
                                          "stop_token_ids": None}}


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", 0.3), ("top_p", 0.9), ("top_k", 7), ("min_p", 0.05), ("frequency_penalty", 0.5),
    ("presence_penalty", -0.5), ("repetition_penalty", 1.2)])
def test_each_sampling_knob_keeps_its_name(field, value):
    assert params(req(sampling=SamplingParams(**{field: value})))[field] == value


def test_top_k_minus_one_passes_through_as_sglangs_whole_vocabulary():
    assert params(req(sampling=SamplingParams(top_k=-1)))["top_k"] == -1


def test_unset_knobs_take_the_models_generation_config_defaults_and_set_ones_win():
    limits = EngineLimits(max_model_len=100, defaults={"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                                                       "repetition_penalty": 1.05})
    p = params(req(sampling=SamplingParams(temperature=1.0, top_k=5)), limits)
    assert (p["temperature"], p["top_p"], p["top_k"], p["min_p"], p["repetition_penalty"]) == (1.0, 0.95, 5, 0.0, 1.05)


def test_only_the_knobs_sglangs_server_defaults_are_taken_from_the_defaults():
    # SGLang's get_default_sampling_params never returns penalties other than repetition's; a
    # stray key must not leak into the request either.
    limits = EngineLimits(max_model_len=100, defaults={"frequency_penalty": 1.0, "max_new_tokens": 5})
    p = params(req(), limits)
    assert "frequency_penalty" not in p
    assert p["max_new_tokens"] == 96


def test_seed_is_sglangs_sampling_seed_when_the_engine_is_deterministic():
    p = params(req(sampling=SamplingParams(seed=1234)), EngineLimits(max_model_len=100, seeded=True))
    assert p["sampling_seed"] == 1234
    assert "seed" not in p


def test_seed_is_refused_when_sglang_would_ignore_it():
    with pytest.raises(RequestRejected, match="--enable-deterministic-inference"):
        params(req(sampling=SamplingParams(seed=1234)))


def test_no_seed_sends_no_sampling_seed():
    assert "sampling_seed" not in params(req(), EngineLimits(max_model_len=100, seeded=True))


def test_max_tokens_is_max_new_tokens_capped_at_the_room_left():
    assert params(req(max_tokens=10))["max_new_tokens"] == 10
    assert params(req(max_tokens=500))["max_new_tokens"] == 96
    # Unset: up to the context window, never SGLang's own default of 128.
    assert params(req())["max_new_tokens"] == 96


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_non_positive_max_tokens_is_refused(max_tokens):
    with pytest.raises(RequestRejected, match="max_tokens"):
        params(req(max_tokens=max_tokens))


def test_empty_prompt_and_prompt_filling_the_window_are_refused():
    with pytest.raises(RequestRejected, match="empty"):
        params(req(token_ids=()))
    with pytest.raises(RequestRejected, match="context window is 100"):
        params(req(token_ids=tuple(range(100))))
    assert params(req(token_ids=tuple(range(99))))["max_new_tokens"] == 1


def test_min_tokens_is_min_new_tokens():
    assert params(req(min_tokens=3))["min_new_tokens"] == 3


def test_min_tokens_and_guided_decoding_are_refused_without_sglangs_tokenizer():
    no_tokenizer = EngineLimits(max_model_len=100, has_tokenizer=False)
    with pytest.raises(RequestRejected, match="min_tokens.*--skip-tokenizer-init"):
        params(req(min_tokens=1), no_tokenizer)
    with pytest.raises(RequestRejected, match="guided decoding.*--skip-tokenizer-init"):
        params(req(guided=GuidedDecoding(regex="a+")), no_tokenizer)
    assert params(req(), no_tokenizer)["min_new_tokens"] == 0


def test_eos_and_stop_ids_are_one_deduplicated_stop_list_in_order():
    p = params(req(eos_token_ids=(2, 7), stop_token_ids=(9, 2, 9)))
    assert p["stop_token_ids"] == [2, 7, 9]


def test_ignore_eos_passes_through_without_stop_ids():
    p = params(req(ignore_eos=True))
    assert p["ignore_eos"] is True
    assert p["stop_token_ids"] is None


def test_ignore_eos_with_stop_ids_is_refused_because_sglang_would_ignore_both():
    with pytest.raises(RequestRejected, match="ignore_eos"):
        params(req(ignore_eos=True, stop_token_ids=(9,)))


def test_no_logprobs_asks_for_none():
    kwargs = sampling.request_kwargs(req(), "x", LIMITS)
    assert "return_logprob" not in kwargs and "top_logprobs_num" not in kwargs
    assert "logprobs" not in kwargs["sampling_params"]


@pytest.mark.parametrize("n", [0, 5])
def test_logprobs_are_request_level_fields(n):
    kwargs = sampling.request_kwargs(req(logprobs=n), "x", LIMITS)
    assert (kwargs["return_logprob"], kwargs["top_logprobs_num"]) == (True, n)


def test_negative_logprobs_are_refused():
    with pytest.raises(RequestRejected, match="logprobs"):
        sampling.request_kwargs(req(logprobs=-1), "x", LIMITS)


# -- guided decoding -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("guided", "expected"), [
    (GuidedDecoding(json_schema='{"type": "integer"}'), {"json_schema": '{"type": "integer"}'}),
    (GuidedDecoding(json_object=True), {"json_schema": '{"type": "object"}'}),
    (GuidedDecoding(regex=r"\d+"), {"regex": r"\d+"}),
    (GuidedDecoding(grammar='root ::= "yes" | "no"'), {"ebnf": 'root ::= "yes" | "no"'}),
    (GuidedDecoding(structural_tag='{"type": "structural_tag"}'), {"structural_tag": '{"type": "structural_tag"}'}),
])
def test_each_constraint_lands_in_its_sglang_field(guided, expected):
    p = params(req(guided=guided))
    assert {k: p[k] for k in ("json_schema", "regex", "ebnf", "structural_tag") if k in p} == expected


def test_choice_is_a_regex_matching_exactly_the_choices_literally():
    choices = ("yes", "no", "a.b (c)|d*", "x\\y", "[1]{2}^$+?", "tab\tand space #&~")
    p = params(req(guided=GuidedDecoding(choice=choices)))
    assert set(p) & {"json_schema", "ebnf"} == set()
    pattern = re.compile(p["regex"])
    for choice in choices:
        assert pattern.fullmatch(choice), choice
    for other in ("ye", "yesno", "aXb (c)|d*", "a.b (c)", "d*", "x\\\\y", ""):
        assert not pattern.fullmatch(other), other


def test_choice_regex_escapes_only_regex_metacharacters():
    # re.escape would also escape spaces, '#', '&', '~': escapes xgrammar does not know.
    assert sampling.choice_regex(["a b#&~", "1.5"]) == r"(a b#&~|1\.5)"


def test_guided_decoding_without_a_constraint_is_refused():
    with pytest.raises(RequestRejected, match="without a constraint"):
        params(req(guided=GuidedDecoding()))


# -- outputs ---------------------------------------------------------------------------------------------


EOS, STOPS = (2, 7), (9,)


@pytest.mark.parametrize(("reason", "expected"), [
    (None, FinishReason.NONE),
    ({"type": "length", "length": 16}, FinishReason.LENGTH),
    ({"type": "stop", "matched": 2}, FinishReason.EOS),
    ({"type": "stop", "matched": 7}, FinishReason.EOS),
    ({"type": "stop", "matched": 9}, FinishReason.STOP),
    ({"type": "stop", "matched": 1234}, FinishReason.EOS),  # a grammar's end on its last id
    ({"type": "stop", "matched": "</s>"}, FinishReason.STOP),
    ({"type": "abort", "message": "Abort in waiting queue"}, FinishReason.CANCELLED),
    ({"type": "something new"}, FinishReason.ERROR),
])
def test_finish_reasons(reason, expected):
    assert sampling.finish_reason(reason, EOS, STOPS) == expected


def test_aborts_sglang_decided_are_errors_by_status():
    rejected = sampling.abort_error({"type": "abort", "message": "bad grammar", "status_code": 400, "err_type": "x"})
    assert type(rejected) is RequestRejected and str(rejected) == "bad grammar"
    busy = sampling.abort_error({"type": "abort", "message": "queue full", "status_code": 503, "err_type": None})
    assert type(busy) is EngineBusy and str(busy) == "queue full"
    failed = sampling.abort_error({"type": "abort", "message": "boom", "status_code": 500, "err_type": None})
    assert type(failed) is EngineError and "boom" in str(failed)


def test_plain_aborts_and_other_finishes_are_no_errors():
    assert sampling.abort_error({"type": "abort", "message": "Abort in waiting queue"}) is None
    assert sampling.abort_error({"type": "abort", "message": "x", "status_code": None, "err_type": None}) is None
    assert sampling.abort_error({"type": "stop", "matched": 2}) is None
    assert sampling.abort_error(None) is None


def test_new_tokens_cut_cumulative_outputs_at_what_was_sent():
    out = {"output_ids": [5, 6, 7, 8], "meta_info": {}}
    assert sampling.new_tokens(out, 0, None) == NewTokens([5, 6, 7, 8], None, None)
    assert sampling.new_tokens(out, 3, None).token_ids == [8]
    assert sampling.new_tokens(out, 4, None).token_ids == []


def test_new_tokens_copy_so_that_sglang_growing_its_list_changes_nothing():
    ids = [5, 6]
    new = sampling.new_tokens({"output_ids": ids, "meta_info": {}}, 0, None)
    ids.append(7)
    assert new.token_ids == [5, 6]


def lp(token_id, logprob):
    return (logprob, token_id, None)  # SGLang's (logprob, token_id, text) without text


def test_logprobs_of_new_tokens_with_alternatives_best_first():
    meta = {"output_token_logprobs": [lp(5, -0.1), lp(6, -2.0)],
            "output_top_logprobs": [[lp(5, -0.1), lp(8, -3.0), lp(9, -4.0)], [lp(4, -0.5), lp(6, -2.0), lp(1, -9.0)]]}
    out = {"output_ids": [5, 6], "meta_info": meta}
    new = sampling.new_tokens(out, 1, 2)
    assert new.token_ids == [6]
    assert sampling.token_logprobs(new, 2) == [TokenLogprob(6, -2.0, ((4, -0.5), (6, -2.0)))]
    assert sampling.token_logprobs(sampling.new_tokens(out, 0, 1), 1)[0] == TokenLogprob(5, -0.1, ((5, -0.1),))


def test_logprobs_without_alternatives_read_no_top_lists():
    # With top_logprobs_num 0 SGLang sends no output_top_logprobs at all.
    out = {"output_ids": [5], "meta_info": {"output_token_logprobs": [lp(5, -1.5)]}}
    new = sampling.new_tokens(out, 0, 0)
    assert sampling.token_logprobs(new, 0) == [TokenLogprob(5, -1.5, ())]


def test_a_logprob_for_another_token_is_an_error_not_a_wrong_answer():
    out = {"output_ids": [5], "meta_info": {"output_token_logprobs": [lp(6, -1.5)]}}
    with pytest.raises(ValueError, match="token 6"):
        sampling.token_logprobs(sampling.new_tokens(out, 0, 0), 0)


# -- thinking budget (SGLang's processor itself: tests/engine_env/sglang/test_sglang_thinking_budget.py) ----------

THINKING = ThinkingMarkers(151667, 151668, "<think>", "</think>")


def test_a_thinking_budget_names_the_engines_processor_and_goes_in_custom_params():
    limits = EngineLimits(max_model_len=100, thinking=THINKING, thinking_processor='{"callable": "00"}')
    for budget in (0, 32):
        kwargs = sampling.request_kwargs(req(max_thinking_tokens=budget), "r1-0", limits)
        assert kwargs["custom_logit_processor"] == '{"callable": "00"}'
        assert kwargs["sampling_params"]["custom_params"] == {"thinking_budget": budget}
    without = sampling.request_kwargs(req(), "r1-0", limits)
    assert "custom_logit_processor" not in without and "custom_params" not in without["sampling_params"]


def test_without_a_processor_a_budget_is_refused_saying_why():
    limits = EngineLimits(max_model_len=100, thinking=ThinkingMarkers(why_not="no markers here"))
    with pytest.raises(RequestRejected, match="no markers here") as e:
        sampling.request_kwargs(req(max_thinking_tokens=8), "r1-0", limits)
    assert e.value.param == "nvext.max_thinking_tokens"


@pytest.mark.parametrize(("thinking", "processor"), [(THINKING, ""), (ThinkingMarkers(why_not="none"), "{}")])
def test_markers_and_processor_must_agree(thinking, processor):
    with pytest.raises(ValueError, match="exactly when"):
        EngineLimits(max_model_len=100, thinking=thinking, thinking_processor=processor)
