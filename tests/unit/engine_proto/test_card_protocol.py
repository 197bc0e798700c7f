"""WorkerCard.engine_protocol: what the registrar writes and the postprocessor reads to pick a worker's wire."""

from __future__ import annotations

import orjson
import pytest

from services.common.cards import ENGINE_PROTOCOLS, ModelCard, WorkerCard


@pytest.mark.parametrize("protocol", ["", *ENGINE_PROTOCOLS])
def test_engine_protocol_round_trips_through_json(protocol):
    card = WorkerCard("w", "h:1", ModelCard("m", "/m"), engine_protocol=protocol)
    assert WorkerCard.from_json(card.to_json()).engine_protocol == protocol


def test_a_card_from_before_the_field_is_our_own_worker_and_an_unknown_protocol_fails():
    old = orjson.loads(WorkerCard("w", "h:1", ModelCard("m", "/m")).to_json())
    del old["engine_protocol"]
    assert WorkerCard.from_json(orjson.dumps(old)).engine_protocol == ""
    with pytest.raises(ValueError, match="engine_protocol"):
        WorkerCard.from_json(orjson.dumps({**old, "engine_protocol": "openai_http"}))
