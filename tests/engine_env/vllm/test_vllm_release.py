"""The vLLM decode worker's release of its prefill peer's held blocks, against vLLM 0.32's own classes: the method
the adapter calls exists with the signature it is called with, and gets the prefill leg's params as given.

    .venv-vllm/bin/python -m pytest tests/engine_env/vllm -o addopts="--import-mode=importlib"

(No engine runs: NixlConnector needs the `nixl` package and a GPU, tools/disagg_vllm_gpu.py checks the blocks come
free on a GPU day.)
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from unittest import mock

import orjson
import yaml
from meshfront.worker.v1 import kv_transfer_pb2
from vllm.config import KVTransferConfig
from vllm.v1.engine.async_llm import AsyncLLM

from services.workers.vllm import transfer
from services.workers.vllm.engine import VllmEngine
from services.workers.vllm.release_grpc import KvReleaseServicer

# What vLLM's NixlConnector returns from a finished prefill (nixl/pull_scheduler.py request_finished).
NIXL_RETURNED = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[3, 4]],
                 "remote_engine_id": "e-1", "remote_request_id": "r-1", "remote_host": "10.0.0.2",
                 "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 5}
MANIFESTS = Path(__file__).parents[3] / "deploy" / "k8s" / "components" / "disagg-vllm"


def test_vllm_frees_a_rejected_transfer_from_the_decode_side_with_these_arguments():
    method = AsyncLLM.notify_kv_transfer_request_rejected
    assert inspect.iscoroutinefunction(method)
    params = inspect.signature(method).parameters
    assert list(params)[:3] == ["self", "request_id", "kv_transfer_params"]
    assert all(p.kind == p.KEYWORD_ONLY or p.default is not p.empty for p in list(params.values())[3:])


def engine_with_autospec_llm() -> tuple[VllmEngine, mock.NonCallableMagicMock]:
    """A VllmEngine whose AsyncLLM is vLLM's own class specced: a call that does not fit its signature fails."""
    llm = mock.create_autospec(AsyncLLM, instance=True)
    engine = VllmEngine(engine_args=None)
    engine._llm = llm  # what start() sets
    return engine, llm


async def test_the_adapter_passes_the_prefill_legs_params_to_vllm_under_a_fresh_request_id():
    engine, llm = engine_with_autospec_llm()
    await engine.release_kv(dict(NIXL_RETURNED))
    await engine.release_kv(dict(NIXL_RETURNED))
    calls = llm.notify_kv_transfer_request_rejected.await_args_list
    assert [c.args[1] for c in calls] == [NIXL_RETURNED, NIXL_RETURNED]
    ids = [c.args[0] for c in calls]
    assert len(set(ids)) == 2 and all(i.startswith("meshfront-release-") for i in ids)


async def test_the_worker_release_rpc_reaches_vllm_only_for_a_remote_prefill():
    engine, llm = engine_with_autospec_llm()
    servicer = KvReleaseServicer(engine.release_kv)
    got = await servicer.ReleaseKv(kv_transfer_pb2.ReleaseKvRequest(kv_transfer_params=orjson.dumps(NIXL_RETURNED)),
                                   None)
    assert got.released and llm.notify_kv_transfer_request_rejected.await_args.args[1] == NIXL_RETURNED
    got = await servicer.ReleaseKv(kv_transfer_pb2.ReleaseKvRequest(kv_transfer_params=b"{}"), None)
    assert not got.released and llm.notify_kv_transfer_request_rejected.await_count == 1


def test_the_kubernetes_pools_kv_transfer_config_is_a_nixl_config_vllm_accepts_for_their_roles():
    for role in ("prefill", "decode"):
        (deployment,) = [d for d in yaml.safe_load_all((MANIFESTS / f"vllm-{role}.yaml").read_text()) if d]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        config = KVTransferConfig(**json.loads(args[args.index("--kv-transfer-config") + 1]))
        assert config.kv_connector == "NixlConnector"
        assert transfer.role_errors(role, config) == [], role
