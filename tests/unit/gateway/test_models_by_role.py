"""/v1/models lists each model once, whatever roles its workers play in disaggregated serving."""

from __future__ import annotations

import pytest

from services.common.discovery import BOTH, DECODE, PREFILL, ModelCard, WorkerCard
from services.gateway.models_api import get_model, list_models

pytestmark = pytest.mark.unit


def test_a_model_served_by_prefill_decode_and_both_workers_is_listed_once():
    cards = [WorkerCard(f"w{i}", f"h:{i}", ModelCard("m", "/m", context_length=4096), role=role)
             for i, role in enumerate((PREFILL, PREFILL, DECODE, BOTH))]
    other = [WorkerCard("x", "h:9", ModelCard("n", "/n"), role=DECODE)]
    body = list_models({"m": cards, "n": other})
    assert [e["id"] for e in body["data"]] == ["m", "n"]
    assert body["data"][0]["context_window"] == 4096
    assert get_model({"m": cards}, "m")["id"] == "m"
