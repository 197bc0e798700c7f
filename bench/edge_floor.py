"""The ``edge`` shape of ``python -m bench mesh``: Envoy, its transcoder and a stand-in gateway (the floor).

The stand-in serves the gateway's ``ChatCompletions`` RPC behind the shipped Envoy config with no
mesh behind it: it reads the request's ``max_tokens`` and streams pre-rendered
``chat.completion.chunk`` events (one ``HttpBody`` per token, as the gateway writes when tokens come
one at a time), then the usage chunk and ``data: [DONE]``. Whatever the design adds on top of this
(preprocessing, routing, the postprocessor, workers, every internal hop) is its cost over the floor,
so the bench prints each shape's CPU per request as a ratio to it.

Pacing: a mocker at speed-up ``s`` takes about ``MOCKER_STEP_MS / s`` per decode step, and every
running stream gets one token per step. The stand-in reproduces that with one shared ticker (every
open stream writes its next chunk on each tick), so the edge sees the same message rate per stream
as with a real engine; speed-up 0 (instant) writes every chunk at once. The stand-in lives in bench/
because it is a measuring device, not a product shape.

Run alone: ``python -m bench.edge_floor --host 127.0.0.1 --port 9100 --step-ms 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import orjson

from services.launcher import envoy_config
from services.launcher.plan import VENV_BIN, ProcessSpec, free_port
from services.launcher.processes import Mesh, wait_port

FLOOR = "edge"
# The mocker's decode step at speed-up 1: ~6 ms with an empty cache to ~12 ms at c=128 (bench/cli.py).
MOCKER_STEP_MS = 10.0
WORD = " word"  # one content token per chunk, as the demo model's tokens are


def step_ms(speedup: float) -> float:
    """The ticker's interval for a mocker speed-up (0 = instant: no ticker)."""
    return 0.0 if speedup <= 0 else MOCKER_STEP_MS / speedup


def render_chunks(model: str, tokens: int, prompt_tokens: int = 200) -> list[bytes]:
    """The SSE frames one request receives: role, ``tokens`` content chunks, finish, usage, [DONE]."""
    head = {"id": "chatcmpl-floor", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def frame(choices: list, **extra) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n"

    out = [frame([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    out += [frame([{"index": 0, "delta": {"content": WORD}, "finish_reason": None}]) for _ in range(tokens)]
    out.append(frame([{"index": 0, "delta": {}, "finish_reason": "length"}]))
    out.append(frame([], usage={"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                                "total_tokens": prompt_tokens + tokens, "prompt_tokens_details": {"cached_tokens": 0}}))
    out.append(b"data: [DONE]\n\n")
    return out


class Ticker:
    """One clock for every open stream: ``wait`` returns at the next tick (an engine's decode step)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._tick = asyncio.Event()
        self._waiters = 0
        self._task: asyncio.Task | None = None

    async def wait(self) -> None:
        if self.interval_s <= 0:
            return
        self._waiters += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            await self._tick.wait()
        finally:
            self._waiters -= 1

    async def _run(self) -> None:
        while self._waiters:  # stops when nothing waits: an idle floor burns no CPU
            await asyncio.sleep(self.interval_s)
            tick, self._tick = self._tick, asyncio.Event()
            tick.set()


async def serve(host: str, port: int, interval_s: float) -> None:
    from google.api import httpbody_pb2
    from meshfront.gateway.v1 import gateway_pb2_grpc

    ticker = Ticker(interval_s)
    rendered: dict[tuple[str, int], list[httpbody_pb2.HttpBody]] = {}

    class FloorGateway(gateway_pb2_grpc.GatewayServiceServicer):
        async def ChatCompletions(self, request: httpbody_pb2.HttpBody, context) -> AsyncIterator:
            body = orjson.loads(request.data)
            key = (str(body.get("model", "")), int(body.get("max_tokens") or 16))
            if key not in rendered:
                rendered[key] = [httpbody_pb2.HttpBody(content_type="text/event-stream", data=f)
                                 for f in render_chunks(*key)]
            frames = rendered[key]
            yield frames[0]
            for frame in frames[1:-3]:  # content: one per decode step
                await ticker.wait()
                yield frame
            yield httpbody_pb2.HttpBody(content_type="text/event-stream", data=b"".join(f.data for f in frames[-3:]))

    await serve_stand_in(host, port, lambda server: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(
        FloorGateway(), server))


async def serve_stand_in(host: str, port: int, add: Callable[[Any], None]) -> None:
    """A plain grpc.aio server with health, ``add(server)`` adding the stand-in's servicer; until SIGTERM/SIGINT."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.aio.server()
    add(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await server.stop(1)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.edge_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--step-ms", type=float, default=0.0, help="decode step: one chunk per stream per step (0 = all "
                   "at once)")
    args = p.parse_args(argv)
    import uvloop  # as every Meshfront service runs (services/common/grpc_server.py)

    uvloop.run(serve(args.host, args.port, args.step_ms / 1000.0))


class EdgeFloorMesh(Mesh):
    """Envoy with the shipped config in front of the stand-in, under the launcher's process handling."""

    def __init__(self, log_dir: pathlib.Path, speedup: float):
        super().__init__(plan=None, log_dir=log_dir)  # type: ignore[arg-type]  # no launcher plan here
        self.http_port, self.admin_port, self.gateway_port = free_port(), free_port(), free_port()
        self.step_ms = step_ms(speedup)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _gateway_spec(self) -> ProcessSpec:
        return ProcessSpec("gateway-0", [sys.executable, "-m", "bench.edge_floor", "--port", str(self.gateway_port),
                                         "--step-ms", f"{self.step_ms:g}"], self.gateway_port,
                           {"PYTHONUNBUFFERED": "1"})

    def _stage_specs(self) -> list[ProcessSpec]:
        """The processes behind the stand-in gateway: none here (bench/split_floor.py has three)."""
        return []

    def start(self, timeout: float = 60.0) -> EdgeFloorMesh:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        envoy_yaml = self.log_dir / "envoy.yaml"
        envoy_yaml.write_text(envoy_config.render(listen_host="127.0.0.1", listen_port=self.http_port,
                                                  admin_port=self.admin_port,
                                                  gateways=[("127.0.0.1", self.gateway_port)]))
        deadline = time.monotonic() + timeout
        try:
            for spec in (*self._stage_specs(), self._gateway_spec()):
                self.start_process(spec)
            self.start_process(ProcessSpec("envoy", [str(VENV_BIN / "envoy"), "-c", str(envoy_yaml), "--concurrency",
                                                     "1", "--log-level", "warn", "--base-id", str(self.http_port)],
                                           self.http_port))
            for name, spec in self.specs.items():
                if not wait_port(spec.ready_port, deadline):
                    raise RuntimeError(f"{name} did not open port {spec.ready_port}:\n{self.logs(name)}")
            self._wait_routed(deadline)
        except BaseException:
            print(self.all_logs())
            self.stop()
            raise
        return self

    def _wait_routed(self, deadline: float) -> None:
        """Until a chat request comes back through Envoy (its health check has found the stand-in)."""
        import urllib.request

        body = orjson.dumps({"model": "floor", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                             "stream": True})
        while time.monotonic() < deadline:
            req = urllib.request.Request(f"{self.url}/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=2) as r:
                    if b"[DONE]" in r.read():
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"Envoy did not route to the stand-in gateway in time\n{self.all_logs()}")


def ratio_values(rows: Sequence[tuple[str, int, dict[str, float]]]) -> list[tuple[str, int, float, float]]:
    """(shape, concurrency, total ratio, front ratio) of every shape measured at a concurrency the floor was:
    CPU per request in total, and in the front (every process except workers and NATS), over the floor's.
    ``rows`` are (shape, concurrency, CPU ms per request by group with ``total``) of one run."""
    floor = {c: cpu for shape, c, cpu in rows if shape == FLOOR}
    return [(shape, c, cpu["total"] / floor[c]["total"], front_ms(cpu) / front_ms(floor[c]))
            for shape, c, cpu in rows if shape != FLOOR and c in floor]


def ratios(rows: Sequence[tuple[str, int, dict[str, float]]]) -> list[str]:
    """One line per shape and concurrency of ``ratio_values``."""
    return [f"{shape} c={c}: {total:.2f}x the floor's CPU per request in total, {front:.2f}x in the front "
            f"(without workers and NATS)" for shape, c, total, front in ratio_values(rows)]


def ratio_spread(rounds: Sequence[Sequence[tuple[str, int, dict[str, float]]]]) -> list[str]:
    """The ratios of several rounds, each against its own round's floor: one line per shape and concurrency
    with the median and the range. On a shared machine one run's ratio moves by a fifth either way, so a
    goal is read from the median of interleaved rounds, never from one run."""
    seen: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for rows in rounds:
        for shape, c, total, front in ratio_values(rows):
            seen.setdefault((shape, c), []).append((total, front))
    out = []
    for (shape, c), values in seen.items():
        totals, fronts = sorted(t for t, _ in values), sorted(f for _, f in values)
        out.append(f"{shape} c={c} over {len(values)} rounds: the front {statistics.median(fronts):.2f}x the floor "
                   f"(median; {fronts[0]:.2f}-{fronts[-1]:.2f}), in total {statistics.median(totals):.2f}x "
                   f"({totals[0]:.2f}-{totals[-1]:.2f})")
    return out


def front_ms(cpu: dict[str, float]) -> float:
    return cpu["total"] - cpu.get("workers", 0.0) - cpu.get("nats", 0.0)


if __name__ == "__main__":
    main()
