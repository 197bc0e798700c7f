"""Worker pins are read the same way by every generation front end (services/gateway/core/pins.py).

Dynamo's header overrides: ``x-worker-instance-id`` sets ``backend_instance_id`` and ``decode_worker_id``,
``x-prefill-instance-id`` sets ``prefill_worker_id``, and a header wins over the body's ``nvext``.
"""

from __future__ import annotations

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.anthropic.request import parse_messages
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.core.pins import named_as_sent
from services.gateway.core.request import GenerationRequest
from services.gateway.kserve import protocol
from services.gateway.kserve.request import parse_request
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
@pytest.mark.parametrize("header", ["x-worker-instance-id", "x-prefill-instance-id"])
def test_a_pin_header_that_is_no_worker_id_is_a_400_naming_the_header_on_every_front_end(parse, header):
    with pytest.raises(InvalidRequest) as e:
        parse({header: "x" * 200})
    assert e.value.param == header and f"'{header}'" in e.value.message


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


# The router's errors name a pin by its body field ('nvext.<field>', services/router/disagg.py); the gateway
# renames it to the header where a header set the pin, or where the API has no nvext to set it with.
UNKNOWN_PREFILL = InvalidRequest("'nvext.prefill_worker_id' names worker bogus, which does not serve model `m`",
                                 param="nvext.prefill_worker_id")
PREFILL_AS_WORKER = InvalidRequest("'nvext.backend_instance_id' names worker pf, a prefill worker of model `m`: "
                                   "pin its prefill leg with 'nvext.prefill_worker_id'",
                                   param="nvext.backend_instance_id")


@pytest.mark.parametrize("parse", FRONT_ENDS)
def test_a_router_error_about_a_pin_header_names_the_header_on_every_front_end(parse):
    names = parse(HEADERS).route_hints().pin_names
    e = named_as_sent(UNKNOWN_PREFILL, names)
    assert e.message == "The x-prefill-instance-id header names worker bogus, which does not serve model `m`"
    assert e.param == "x-prefill-instance-id" and isinstance(e, InvalidRequest)
    e = named_as_sent(PREFILL_AS_WORKER, names)
    assert e.param == "x-worker-instance-id" and e.message.startswith("The x-worker-instance-id header names worker")
    assert "nvext" not in named_as_sent(InvalidRequest("'nvext.decode_worker_id' names worker d",
                                                       param="nvext.decode_worker_id"), names).message


def test_a_router_error_about_a_body_pin_names_the_body_field():
    body = {"model": "m", "messages": MESSAGES,
            "nvext": {"backend_instance_id": "pf", "prefill_worker_id": "bogus"}}
    names = parse_chat(orjson.dumps(body), {}).route_hints().pin_names
    assert named_as_sent(UNKNOWN_PREFILL, names) is UNKNOWN_PREFILL
    assert named_as_sent(PREFILL_AS_WORKER, names) is PREFILL_AS_WORKER
    # Each pin is named as it came: the worker pin by its header, the prefill pin by the body field.
    names = parse_chat(orjson.dumps(body), {"x-worker-instance-id": "pf"}).route_hints().pin_names
    assert named_as_sent(UNKNOWN_PREFILL, names) is UNKNOWN_PREFILL
    e = named_as_sent(PREFILL_AS_WORKER, names)
    assert e.param == "x-worker-instance-id"
    assert e.message.endswith("pin its prefill leg with 'nvext.prefill_worker_id'")  # this client has nvext


@pytest.mark.parametrize("parse", [messages, responses])
def test_without_nvext_the_router_error_names_the_headers_even_in_its_advice(parse):
    e = named_as_sent(PREFILL_AS_WORKER, parse({}).route_hints().pin_names)
    assert e.message.endswith("pin its prefill leg with the x-prefill-instance-id header")
    assert "nvext" not in e.message + e.param
