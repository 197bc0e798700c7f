"""The vLLM worker's legs of a disaggregated request (pure; tests/engine_env/vllm checks vLLM's own classes)."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.workers.engine import EngineRequest
from services.workers.vllm import sampling, transfer

pytestmark = pytest.mark.unit

# What vLLM's NixlConnector returns from a finished prefill (nixl/pull_scheduler.py request_finished).
NIXL_RETURNED = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[3, 4]],
                 "remote_engine_id": "e-1", "remote_request_id": "r-1", "remote_host": "10.0.0.2",
                 "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 20, "transfer_mode": "pull"}


def request(**kw) -> EngineRequest:
    return EngineRequest(request_id="r", token_ids=list(range(20)), **kw)


def test_a_prefill_leg_makes_one_token_and_asks_vllm_for_a_remote_decode():
    kw = sampling.sampling_kwargs(request(max_tokens=50, min_tokens=5, kv_transfer_params={"do_remote_decode": True}),
                                  max_model_len=100, defaults={})
    assert (kw["max_tokens"], kw["min_tokens"]) == (1, 1)
    assert kw["extra_args"] == {"kv_transfer_params": {"do_remote_decode": True}}


def test_a_decode_leg_passes_the_prefill_workers_params_as_given_and_keeps_its_budget():
    kw = sampling.sampling_kwargs(request(max_tokens=50, kv_transfer_params=NIXL_RETURNED), max_model_len=100,
                                  defaults={})
    assert kw["max_tokens"] == 50 and kw["extra_args"] == {"kv_transfer_params": NIXL_RETURNED}
    # A copy: vLLM's connectors write into the dict (do_remote_prefill turns False once loaded).
    kw["extra_args"]["kv_transfer_params"]["do_remote_prefill"] = False
    assert NIXL_RETURNED["do_remote_prefill"] is True


def test_an_ordinary_request_has_no_extra_args():
    assert "extra_args" not in sampling.sampling_kwargs(request(max_tokens=5), max_model_len=100, defaults={})


@pytest.mark.parametrize(("params", "leg"), [
    (None, transfer.Leg.WHOLE), ({}, transfer.Leg.WHOLE), ({"do_remote_decode": True}, transfer.Leg.PREFILL),
    (NIXL_RETURNED, transfer.Leg.DECODE), ({"do_remote_decode": "yes"}, transfer.Leg.DECODE),
])
def test_which_leg_the_params_make(params, leg):
    assert transfer.leg(params) is leg


def test_what_a_prefill_leg_returns():
    assert transfer.returned_params(NIXL_RETURNED) == NIXL_RETURNED
    # A connector that shares blocks by content (vLLM's ExampleConnector, LMCache) returns none.
    assert transfer.returned_params(None) == {}


@dataclasses.dataclass
class FakeKvTransferConfig:
    """The fields and properties of vLLM's KVTransferConfig that the check reads (tests/engine_env/vllm
    checks the real class)."""

    kv_connector: str | None
    kv_role: str | None

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_consumer", "kv_both")


@pytest.mark.parametrize(("mode", "config", "error"), [
    ("agg", None, None),
    ("prefill", None, "--disaggregation-mode prefill needs vLLM's --kv-transfer-config"),
    ("decode", FakeKvTransferConfig(None, None), "--disaggregation-mode decode needs vLLM's --kv-transfer-config"),
    ("prefill", FakeKvTransferConfig("NixlConnector", "kv_consumer"), "not kv_consumer"),
    ("decode", FakeKvTransferConfig("NixlConnector", "kv_producer"), "not kv_producer"),
    ("prefill", FakeKvTransferConfig("NixlConnector", "kv_both"), None),
    ("decode", FakeKvTransferConfig("NixlConnector", "kv_consumer"), None),
])
def test_a_role_needs_a_connector_that_can_play_it(mode, config, error):
    errors = transfer.role_errors(mode, config)
    assert errors == [] if error is None else (len(errors) == 1 and error in errors[0]), errors


# -- the release: a vLLM decode worker frees its prefill peer's held blocks -----------------------------------

def test_a_release_passes_a_prefill_legs_params_as_given():
    raw = orjson.dumps(NIXL_RETURNED)
    assert transfer.release_params(raw) == NIXL_RETURNED


@pytest.mark.parametrize("raw", [b"", b"{}", b'{"do_remote_prefill": false}', b'{"remote_engine_id": "e-1"}'])
def test_params_that_name_no_remote_prefill_hold_nothing_to_release(raw):
    assert transfer.release_params(raw) is None


@pytest.mark.parametrize("raw", [b"[1]", b"not json", b'"x"'])
def test_params_that_are_no_json_object_are_the_callers_mistake(raw):
    with pytest.raises(InvalidRequest) as e:
        transfer.release_params(raw)
    assert e.value.param == "kv_transfer_params"


def test_each_release_is_its_own_request_on_the_decode_engine():
    first, second = transfer.release_request_id(), transfer.release_request_id()
    assert first != second and first.startswith("meshfront-release-")
