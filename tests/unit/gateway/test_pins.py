"""Worker pins are read the same way by every generation front end (services/gateway/core/pins.py).

Dynamo's header overrides: ``x-worker-instance-id`` sets ``backend_instance_id`` and ``decode_worker_id``,
``x-prefill-instance-id`` sets ``prefill_worker_id``, and a header wins over the body's ``nvext``.
"""

from __future__ import annotations

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.anthropic.request import parse_messages
from services.gateway.core.request import GenerationRequest
from services.gateway.kserve import protocol
from services.gateway.kserve.request import parse_request
from services.gateway.openai.request import parse_chat, parse_completion
from services.gateway.responses_api.conversation import to_chat
from services.gateway.responses_api.request import parse_responses

pytestmark = pytest.mark.unit

HEADERS = {"x-worker-instance-id": "dc-1", "x-prefill-instance-id": "pf-1"}
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(headers: dict[str, str]) -> GenerationRequest:
    return parse_chat(orjson.dumps({"model": "m", "messages": MESSAGES}), headers)


def completion(headers: dict[str, str]) -> GenerationRequest:
    return parse_completion(orjson.dumps({"model": "m", "prompt": "hi"}), headers)


def messages(headers: dict[str, str]) -> GenerationRequest:
    return parse_messages(orjson.dumps({"model": "m", "max_tokens": 4, "messages": MESSAGES}), headers)


def responses(headers: dict[str, str]) -> GenerationRequest:
    req = parse_responses(orjson.dumps({"model": "m", "input": "hi"}), headers)
    return to_chat(req, req.items)


def kserve(headers: dict[str, str]) -> GenerationRequest:
    req = protocol.ModelInferRequest(model_name="m", id="c")
    req.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hi")
    return parse_request(req, headers).parsed


FRONT_ENDS = [chat, completion, messages, responses, kserve]


@pytest.mark.parametrize("parse", FRONT_ENDS)
def test_every_front_end_routes_by_both_pin_headers(parse):
    req = parse(HEADERS)
    hints = req.route_hints()
    assert (req.worker_id, hints.prefill_worker_id, hints.decode_worker_id) == ("dc-1", "pf-1", "dc-1")


@pytest.mark.parametrize("parse", FRONT_ENDS)
def test_without_pins_the_router_chooses(parse):
    req = parse({})
    hints = req.route_hints()
    assert (req.worker_id, hints.prefill_worker_id, hints.decode_worker_id) == ("", "", "")


@pytest.mark.parametrize("parse", FRONT_ENDS)
@pytest.mark.parametrize(("header", "param"), [("x-worker-instance-id", "nvext.backend_instance_id"),
                                               ("x-prefill-instance-id", "nvext.prefill_worker_id")])
def test_a_pin_header_that_is_no_worker_id_is_a_400_on_every_front_end(parse, header, param):
    with pytest.raises(InvalidRequest) as e:
        parse({header: "x" * 200})
    assert e.value.param == param and header.startswith("x-")


def test_the_worker_header_pins_the_decode_worker_over_the_body():
    body = {"model": "m", "messages": MESSAGES,
            "nvext": {"backend_instance_id": "b", "decode_worker_id": "d", "prefill_worker_id": "p"}}
    req = parse_chat(orjson.dumps(body), {"x-worker-instance-id": "h"})
    hints = req.route_hints()
    assert (req.worker_id, hints.decode_worker_id, hints.prefill_worker_id) == ("h", "h", "p")
    # Without the header the body's pins stand as sent: backend_instance_id does not set the decode pin.
    req = parse_chat(orjson.dumps(body))
    hints = req.route_hints()
    assert (req.worker_id, hints.decode_worker_id, hints.prefill_worker_id) == ("b", "d", "p")
