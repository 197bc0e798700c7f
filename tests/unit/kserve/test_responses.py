"""Deltas -> ModelInferResponse: outputs, usage and Triton's final-response marker."""

from __future__ import annotations

import pytest

from services.gateway.kserve.responses import FINAL, ResponseBuilder
from services.gateway.openai.responses import Delta

pytestmark = pytest.mark.unit


def decode(resp, name: str) -> bytes:
    i = [o.name for o in resp.outputs].index(name)
    raw = resp.raw_output_contents[i]
    size = int.from_bytes(raw[:4], "little")
    assert len(raw) == 4 + size and list(resp.outputs[i].shape) == [1] and resp.outputs[i].datatype == "BYTES"
    return raw[4:]


def first(text: str) -> Delta:
    return Delta(index=0, text=text, completion_tokens=1, prompt_tokens=4, counts_prompt=True)


def last(text: str, reason: str = "stop") -> Delta:
    return Delta(index=0, text=text, completion_tokens=1, finish_reason=reason)


def test_unary_response_folds_text_and_reports_usage_without_a_final_marker():
    b = ResponseBuilder("m", "id-1", ("text_output", "finish_reason"), decoupled=False)
    resp = b.data([first("Hel"), Delta(index=0, text="lo", completion_tokens=1), last("!", "length")])
    assert (resp.model_name, resp.model_version, resp.id) == ("m", "1", "id-1")
    assert decode(resp, "text_output") == b"Hello!" and decode(resp, "finish_reason") == b"length"
    assert FINAL not in resp.parameters
    assert resp.parameters["prompt_tokens"].int64_param == 4 and resp.parameters["completion_tokens"].int64_param == 3
    assert b.closing() is None


def test_streamed_responses_mark_only_the_last_as_final():
    b = ResponseBuilder("m", "", ("text_output", "finish_reason"), decoupled=True)
    a = b.data([first("é")])
    z = b.data([last(" ok")])
    assert a.parameters[FINAL].bool_param is False and decode(a, "finish_reason") == b""
    assert "completion_tokens" not in a.parameters
    assert z.parameters[FINAL].bool_param is True and z.parameters["completion_tokens"].int64_param == 2
    assert decode(a, "text_output").decode() == "é"
    assert b.closing() is None


def test_empty_final_response_closes_when_asked_or_when_no_finish_reason_came():
    b = ResponseBuilder("m", "", ("text_output",), decoupled=True, empty_final=True)
    z = b.data([first("a"), last("b")])
    assert z.parameters[FINAL].bool_param is False and [o.name for o in z.outputs] == ["text_output"]
    closing = b.closing()
    assert closing is not None and closing.parameters[FINAL].bool_param and not closing.outputs
    assert closing.parameters["completion_tokens"].int64_param == 2
    cut = ResponseBuilder("m", "", ("text_output",), decoupled=True)
    cut.data([first("a")])
    assert cut.closing().parameters[FINAL].bool_param
