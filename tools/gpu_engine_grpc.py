"""The stock-engine gRPC checks of tests/engine/test_vllm_grpc.py for a GPU day: two `vllm serve --grpc` engines on the
GPU, attached with `meshfront run --engine-grpc`, driven through Envoy with the openai SDK.

    PYTHONPATH=$PWD:$PWD/gen/python python tools/gpu_engine_grpc.py [--model-dir DIR] [--timeout-s 600]

Runs in an environment with a CUDA build of vLLM, ``smg-grpc-servicer`` and the mesh's dependencies (a vLLM image
with ``requirements/engine-worker.txt`` and ``pip install smg-grpc-servicer==0.14.1``); on the demo model by default
(services/models/build.py). The engines get a third of the GPU's memory each. Checks, one PASS/FAIL line each, exit
status 1 on any failure; TTFT and the whole request's time are printed for the record, never judged:

1. streaming and not give the same greedy tokens;
2. a repeated long prompt is served from the engine that cached it (cached_tokens >= 4 blocks);
3. a client that hangs up mid-stream leaves both engines nothing running within 1 s (GetLoads);
4. an engine SIGKILLed mid-stream: the stream finishes with the undisturbed text, the card leaves.

Everything started is stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import openai
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from services.launcher.plan import free_port
from services.workers.attach.core import VLLM_ENGINE, worker_id
from tests.mesh.chaos_client import stream_then_hang_up

MODEL = "meshfront/demo-qwen"
GPU_BLOCK = 16  # vLLM's default block size on a GPU
FAILED: list[str] = []


def check(name: str, fn: Callable[[], str]) -> None:
    try:
        print(f"PASS {name}: {fn()}", flush=True)
    except Exception as e:  # noqa: BLE001 - every check is reported, then the next runs
        FAILED.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)


def start(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "VLLM_HOST_IP": "127.0.0.1"})


def running(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        loads = vllm_engine_pb2_grpc.VllmEngineStub(channel).GetLoads(vllm_engine_pb2.GetLoadsRequest(), timeout=5)
    return sum(load.num_running_reqs + load.num_waiting_reqs for load in loads.loads)


def wait_models(client: openai.OpenAI, count: int, timeout_s: float) -> None:
    """Until /health lists ``count`` live engines for the model (the mesh's own count, as the engine tests read it)."""
    import json
    import urllib.request

    deadline = time.monotonic() + timeout_s
    url = str(client.base_url).removesuffix("/v1/")
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(  # noqa: S310 - ours
                f"{url}/health", timeout=2) as r:
            if json.loads(r.read()).get("models", {}).get(MODEL, 0) == count:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{MODEL} did not reach {count} live engines in {timeout_s:.0f} s")


def run_checks(client: openai.OpenAI, http_port: int, engines: dict[str, subprocess.Popen]) -> None:
    messages: Any = [{"role": "user", "content": "Say something."}]

    def streaming() -> str:
        started = time.monotonic()
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0,
                                                     stream=True, extra_body={"ignore_eos": True}))
        whole = time.monotonic() - started
        done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0,
                                              extra_body={"ignore_eos": True})
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == done.choices[0].message.content, (text, done.choices[0].message.content)
        return f"32 tokens streamed in {whole * 1000:.0f} ms"

    def kv_routing() -> str:
        prompt: Any = [{"role": "user", "content": " ".join(f"item {i} of the shared prefix;" for i in range(120))}]
        client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=2)
        cached = []
        for _ in range(4):
            time.sleep(0.5)
            again = client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=2)
            details = again.usage.prompt_tokens_details if again.usage else None
            cached.append(details.cached_tokens or 0 if details else 0)
        assert all(c >= 4 * GPU_BLOCK for c in cached), cached
        return f"cached tokens {cached}"

    def cancel() -> str:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 4000,
                "ignore_eos": True}
        stream_then_hang_up(http_port, body, frames=3)
        started = time.monotonic()
        while any(running(a) for a in engines):
            assert time.monotonic() - started < 1.0, "an engine still runs the request 1 s after the client left"
            time.sleep(0.02)
        return f"engines idle {(time.monotonic() - started) * 1000:.0f} ms after the hang-up"

    def kill_mid_stream() -> str:
        ask: Any = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400,
               "temperature": 0}
        undisturbed = client.chat.completions.create(**ask, extra_body={"ignore_eos": True}).choices[0].message.content
        by_id = {worker_id(VLLM_ENGINE, a): a for a in engines}
        parts, serving = [], ""
        for chunk in client.chat.completions.create(**ask, stream=True, extra_body={
                "ignore_eos": True, "nvext": {"extra_fields": ["worker_id"]}}):
            serving = serving or by_id[chunk.model_extra["nvext"]["worker_id"]["decode_worker_id"]]
            parts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
            if len(parts) == 4:
                os.killpg(engines[serving].pid, signal.SIGKILL)
        assert "".join(parts) == undisturbed
        wait_models(client, 1, 15)
        return f"killed {serving}; the stream finished on the other engine"

    for name, fn in (("streaming", streaming), ("kv routing", kv_routing), ("cancel frees the engine", cancel),
                     ("engine killed mid-stream", kill_mid_stream)):
        check(name, fn)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="", help="default: the demo model with weights (services/models/build.py)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="for the engines to load and register")
    p.add_argument("--log-dir", default="gpu_engine_grpc_logs", help="the engines' and the mesh's logs")
    args = p.parse_args()
    if not args.model_dir:
        from services.models.build import default_test_model_dir

        args.model_dir = str(default_test_model_dir(with_weights=True))
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    engines: dict[str, subprocess.Popen] = {}
    procs: list[subprocess.Popen] = []
    try:
        for i in range(2):
            address = f"127.0.0.1:{free_port()}"
            engines[address] = start([sys.executable, "-m", "vllm.entrypoints.launchers.grpc_server", "--model",
                                      args.model_dir, "--served-model-name", MODEL, "--host", "127.0.0.1", "--port",
                                      address.rsplit(":", 1)[1], "--gpu-memory-utilization", "0.3",
                                      "--max-model-len", "4096"], logs / f"engine-{i}.log")
        http_port = free_port()
        procs.append(start([sys.executable, "-c", "from services.cli import main; main()", "run", *(
            f for a in engines for f in ("--engine-grpc", a)), "--model-dir", args.model_dir, "--model-name", MODEL,
            "--router-mode", "kv", "--free-ports", "--http-port", str(http_port), "--embedding-workers", "0",
            "--image-workers", "0", "--video-workers", "0"], logs / "mesh.log"))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0,
                               timeout=120)

        def registered() -> str:
            wait_models(client, 2, args.timeout_s)
            return "both cards live"

        check("two engines registered", registered)
        if not FAILED:
            run_checks(client, http_port, engines)
    finally:
        for proc in [*procs, *engines.values()]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [*procs, *engines.values()]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    print(f"logs in {logs}; {len(FAILED)} failed: {FAILED}" if FAILED else f"all passed; logs in {logs}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
