"""The SGLang worker's legs of a disaggregated request: its bootstrap fields (pure; tests/engine_env/sglang checks
them against SGLang's own classes)."""

from __future__ import annotations

import pytest

from services.workers.engine import KvTransferFailed
from services.workers.sglang import transfer

pytestmark = pytest.mark.unit

OWN = {"own_host": "10.0.0.5", "own_port": 8998}


def test_a_prefill_leg_names_this_workers_bootstrap_server_and_a_fresh_room():
    first = transfer.bootstrap_for({"do_remote_decode": True}, **OWN)
    second = transfer.bootstrap_for({"do_remote_decode": True}, **OWN)
    assert first is not None and second is not None
    assert (first.host, first.port) == ("10.0.0.5", 8998) and 0 <= first.room < 2**63
    assert first.room != second.room  # two requests never share a room
    assert first.request_kwargs() == {"bootstrap_host": "10.0.0.5", "bootstrap_port": 8998,
                                      "bootstrap_room": first.room}
    assert first.returned_params() == {"do_remote_prefill": True, **first.request_kwargs()}


def test_a_caller_that_sets_up_both_ends_chooses_the_room():
    chosen = {"do_remote_decode": True, "bootstrap_host": "p", "bootstrap_port": 9000, "bootstrap_room": 7}
    assert transfer.bootstrap_for(chosen, **OWN) == transfer.Bootstrap("p", 9000, 7)


def test_a_decode_leg_takes_what_the_prefill_leg_returned():
    returned = transfer.Bootstrap("10.0.0.5", 8998, 42).returned_params()
    assert transfer.bootstrap_for(returned, **OWN) == transfer.Bootstrap("10.0.0.5", 8998, 42)


@pytest.mark.parametrize(("params", "field"), [
    ({"do_remote_prefill": True, "bootstrap_port": 8998, "bootstrap_room": 1}, "bootstrap_host"),
    ({"do_remote_prefill": True, "bootstrap_host": "h", "bootstrap_port": "8998", "bootstrap_room": 1},
     "bootstrap_port"),
    ({"do_remote_prefill": True, "bootstrap_host": "h", "bootstrap_port": 8998, "bootstrap_room": -1},
     "bootstrap_room"),
    ({"do_remote_prefill": True, "bootstrap_host": "h", "bootstrap_port": 8998, "bootstrap_room": True},
     "bootstrap_room"),
    ({"remote_engine_id": "a vLLM prefill worker's"}, "bootstrap_host"),
])
def test_decode_params_sglang_cannot_resolve_are_a_failed_transfer(params, field):
    with pytest.raises(KvTransferFailed, match=field):
        transfer.bootstrap_for(params, **OWN)


def test_an_ordinary_request_has_no_bootstrap():
    assert transfer.bootstrap_for(None, **OWN) is None and transfer.bootstrap_for({}, **OWN) is None


@pytest.mark.parametrize(("ours", "sglangs"), [("prefill", "prefill"), ("decode", "decode"), ("agg", "null")])
def test_the_workers_mode_is_sglangs(ours, sglangs):
    assert transfer.sglang_mode(ours) == sglangs
