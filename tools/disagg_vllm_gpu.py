"""The vLLM disaggregation check for a GPU day: two `meshfront vllm` workers with vLLM's NixlConnector (the
production KV connector, which vLLM's CPU build cannot run), driven leg by leg over WorkerService.Generate.

    PYTHONPATH=$PWD:$PWD/gen/python python tools/disagg_vllm_gpu.py [--model-dir DIR] [--timeout-s 420]

Runs in an environment with a CUDA build of vLLM and the ``nixl`` package (a vLLM image with
``requirements/engine-worker.txt``); on the demo model by default (services/models/build.py). For each prompt
length (one on a 16-token block boundary, one off it: the decode leg's prompt is the prefill leg's plus the
first token, so on a boundary the decode engine needs one block more than was sent):

1. the prefill worker runs the prefill leg (one token) and returns NixlConnector's params;
2. the decode worker runs the decode leg (prompt + that token) with them;
3. the decode worker runs the whole request aggregated (prefix caching is off, so it computes it all);

and checks that the legs' tokens and log probabilities equal the aggregated run's. Then the release of a held
prefill (docs/engines.md, "Disaggregation"): a prefill leg whose decode leg never comes holds its blocks on the
prefill engine (its ``vllm:kv_cache_usage_perc`` goes up); ``KvTransferService.ReleaseKv`` on the **decode**
worker with its params (what the postprocessor sends when the client hangs up) must bring that usage back down
within RELEASE_WITHIN_S, well inside NixlConnector's 30 s lease. Prints one PASS/FAIL line per check and exits
non-zero on any failure. The workers are stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import grpc
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import kv_transfer_pb2, kv_transfer_pb2_grpc, worker_pb2, worker_pb2_grpc

NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
BLOCK = 16  # vLLM's GPU block size
TOKENS = 24
RELEASE_WITHIN_S = 5.0  # NixlConnector's lease (kv_lease_duration) is 30 s: a release must beat it by far
USAGE = re.compile(r"^vllm:kv_cache_usage_perc(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(model_dir: str, mode: str, port: int, metrics_port: int) -> subprocess.Popen:
    env = {**os.environ, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()), "VLLM_HOST_IP": "127.0.0.1"}
    argv = [sys.executable, "-m", "services.workers.vllm", "--model-dir", model_dir, "--no-register", "--host",
            "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port), "--disaggregation-mode", mode,
            "--kv-transfer-config", NIXL,
            "--gpu-memory-utilization", "0.3", "--max-model-len", "4096", "--no-enable-prefix-caching",
            "--enforce-eager"]
    return subprocess.Popen(argv, env=env, start_new_session=True)


def wait_ready(port: int, proc: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the worker on port {port} exited with {proc.returncode}")
        with contextlib.suppress(grpc.FutureTimeoutError):
            grpc.channel_ready_future(grpc.insecure_channel(f"127.0.0.1:{port}")).result(timeout=2)
            return
    raise SystemExit(f"the worker on port {port} did not serve in time")


def generate(port: int, ids: list[int], max_tokens: int, role: int = 0,
             params: bytes = b"") -> tuple[list[int], list[float], bytes]:
    request = common_pb2.PreprocessedRequest(request_id=f"r{time.monotonic_ns()}", model="m", token_ids=ids)
    request.sampling.temperature = 0.0
    request.stop.max_tokens = max_tokens
    request.stop.ignore_eos = True
    request.output.logprobs = 0
    if role:
        request.disaggregation.role = role  # type: ignore[assignment]
        request.disaggregation.kv_transfer_params = params
    stub = worker_pb2_grpc.WorkerServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    out, logprobs, returned = [], [], b""
    for chunk in stub.Generate(worker_pb2.GenerateRequest(request=request), timeout=120):
        out += chunk.token_ids
        logprobs += [lp.logprob for lp in chunk.logprobs]
        returned = chunk.kv_transfer_params or returned
    return out, logprobs, returned


def check(prefill_port: int, decode_port: int, length: int) -> bool:
    ids = [100 + (i * 7919) % 30000 for i in range(length)]
    first, first_lp, params = generate(prefill_port, ids, 1, common_pb2.DISAGGREGATION_ROLE_PREFILL)
    rest, rest_lp, _ = generate(decode_port, ids + first, TOKENS - 1, common_pb2.DISAGGREGATION_ROLE_DECODE, params)
    whole, whole_lp, _ = generate(decode_port, ids, TOKENS)
    legs, legs_lp = first + rest, first_lp + rest_lp
    close = len(legs_lp) == len(whole_lp) and all(abs(a - b) < 1e-2 for a, b in zip(legs_lp, whole_lp, strict=True))
    ok = legs == whole and close
    print(f"{'PASS' if ok else 'FAIL'} prompt {length} tokens ({'on' if length % BLOCK == 0 else 'off'} a block "
          f"boundary): params {sorted(json.loads(params or b'{}'))}, legs {legs[:8]}..., aggregated {whole[:8]}..., "
          f"max logprob gap {max((abs(a - b) for a, b in zip(legs_lp, whole_lp, strict=False)), default=0):.2e}",
          flush=True)
    return ok


def kv_usage(metrics_port: int) -> float:
    """The engine's KV cache usage (0..1) from its Prometheus page (the worker serves vLLM's metrics too)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        return sum(float(v) for v in USAGE.findall(r.read().decode()))


def check_release(prefill_port: int, decode_port: int, prefill_metrics: int) -> bool:
    """A prefill leg whose decode leg never comes, then the release through the decode worker."""
    before = kv_usage(prefill_metrics)
    ids = [100 + (i * 104729) % 30000 for i in range(64 * BLOCK)]
    _, _, params = generate(prefill_port, ids, 1, common_pb2.DISAGGREGATION_ROLE_PREFILL)
    held = kv_usage(prefill_metrics)
    stub = kv_transfer_pb2_grpc.KvTransferServiceStub(grpc.insecure_channel(f"127.0.0.1:{decode_port}"))
    start = time.monotonic()
    answer = stub.ReleaseKv(kv_transfer_pb2.ReleaseKvRequest(kv_transfer_params=params), timeout=10)
    after = kv_usage(prefill_metrics)
    while after > before + 1e-3 and time.monotonic() - start < RELEASE_WITHIN_S:
        time.sleep(0.05)
        after = kv_usage(prefill_metrics)
    took = time.monotonic() - start
    ok = answer.released and held > before and after <= before + 1e-3
    print(f"{'PASS' if ok else 'FAIL'} release through the decode worker: prefill KV usage {before:.4f} -> held "
          f"{held:.4f} -> {after:.4f} {took:.2f} s after ReleaseKv (released={answer.released})", flush=True)
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default="")
    p.add_argument("--timeout-s", type=float, default=420.0)
    args = p.parse_args()
    model_dir = args.model_dir
    if not model_dir:
        from services.models.build import default_test_model_dir

        model_dir = str(default_test_model_dir(with_weights=True))
    ports = {"prefill": free_port(), "decode": free_port()}
    metrics = {mode: free_port() for mode in ports}
    procs = {mode: start_worker(model_dir, mode, port, metrics[mode]) for mode, port in ports.items()}
    try:
        deadline = time.monotonic() + args.timeout_s
        for mode, port in ports.items():
            wait_ready(port, procs[mode], deadline)
        results = [check(ports["prefill"], ports["decode"], length) for length in (20 * BLOCK, 20 * BLOCK + 5)]
        results.append(check_release(ports["prefill"], ports["decode"], metrics["prefill"]))
        return 0 if all(results) else 1
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
