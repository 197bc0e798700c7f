"""``python -m bench.token_path``: the all-in-one gateway's Python per token, without gRPC on either side.

A paced engine hands every running request one token per decode step, and the all-in-one gateway then
runs, per token and request: the multiplexed call's delivery and wake-up (``MuxCall``'s inbox), the
postprocessor's ``_attempt`` and response builder (detokenizing), ``Postprocessor.generate``, the
in-process client, ``Pipeline._stream`` and ``_delta``, the renderer's ``sse`` and the ``HttpBody``.
This runs exactly that chain (the product's code, the demo model's real tokenizer) for ``--requests``
concurrent requests fed one token per step, with a ``sleep(0)`` standing for the write to Envoy, and
reports process CPU µs per token: the part of the gateway's CPU per request that is ours, not gRPC's
(a mesh run cannot separate them, and on a shared machine its CPU per request moves by more than this).

Before/after a change: run it on both commits (``git worktree`` or ``git archive``), same hour. The
figure includes the feeding loop (building one worker message per token, about 1 µs).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

from google.api import httpbody_pb2
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.router.v1 import router_pb2
from meshfront.worker.v1 import worker_pb2

from services.allinone.clients import InProcessPostprocessor
from services.common.mux_client import MuxCall
from services.gateway.core.nvext import NvExt
from services.gateway.core.pipeline import Pipeline, _RoutedChoice
from services.gateway.core.route_lease import RouteLease
from services.gateway.core.trace import RequestTrace
from services.gateway.openai.extensions import ResponseExtensions
from services.gateway.openai.render import renderer_for
from services.postprocessor.service import Postprocessor

PROMPT_TOKENS = 200


class _Stream:
    """What a ``MuxCall`` asks of its stream (a cancel: none happens here); no gRPC call behind it."""

    def cancel(self, seq_id: int) -> None:
        pass


class _Workers:
    """A ``WorkerClient`` whose calls are the product's ``MuxCall``, fed by ``run`` as a worker's demux would."""

    def __init__(self) -> None:
        self.calls: list[MuxCall] = []

    def generate(self, address: str, request: object) -> MuxCall:
        call: MuxCall = MuxCall(_Stream(), len(self.calls))  # type: ignore[arg-type]  # only cancel is used
        self.calls.append(call)
        return call


async def _request(pipeline: Pipeline, model_dir: str, i: int, tokens: int) -> int:
    """One streamed chat request from the pipeline's stream to HttpBody frames; returns the frames sent."""
    gen = postprocessor_pb2.GenerateRequest(worker_address="worker", worker_id="worker")
    gen.options.model_dir = model_dir
    gen.request.request_id = f"r{i}"
    gen.request.token_ids.extend(range(100, 100 + PROMPT_TOKENS))
    gen.request.stop.max_tokens = tokens
    gen.request.stop.ignore_eos = True
    trace = RequestTrace()
    renderer = renderer_for(chat=True, request_id=f"chatcmpl-{i}", model="meshfront/demo-qwen", n_choices=1,
                            want_logprobs=False, include_usage=True,
                            nvext=ResponseExtensions(NvExt(), trace, f"r{i}"))
    lease = RouteLease(pipeline.leases, f"r{i}", router_pb2.RouteResponse())  # no first-token report asked
    load = pipeline.workers.choice("meshfront/demo-qwen", "worker", "", PROMPT_TOKENS)  # as routed choices do
    choice = _RoutedChoice(0, True, PROMPT_TOKENS, lease, gen, load)
    frames = 0
    async for deltas in pipeline._stream(choice):
        data = renderer.sse(deltas)
        if data:
            httpbody_pb2.HttpBody(content_type="text/event-stream", data=data)
            frames += 1
        await asyncio.sleep(0)  # the write to Envoy: a suspension per frame
    return frames


async def run(model_dir: str, requests: int, tokens: int, rounds: int) -> list[float]:
    """CPU µs per token of each round (``requests`` concurrent requests of ``tokens`` tokens)."""
    workers = _Workers()
    post = Postprocessor(workers=workers)
    pipeline = Pipeline(None, None, InProcessPostprocessor(post))  # type: ignore[arg-type]  # only post is used
    out = []
    try:
        for _ in range(rounds):
            workers.calls.clear()
            tasks = [asyncio.create_task(_request(pipeline, model_dir, i, tokens)) for i in range(requests)]
            while len(workers.calls) < requests:  # every request has opened its worker call
                await asyncio.sleep(0.001)
            gc.collect()
            t0 = time.process_time()
            for step in range(tokens):
                for call in workers.calls:
                    message = worker_pb2.GenerateResponse(token_ids=[1000 + step % 500])
                    if step == 0:
                        message.prompt_tokens = PROMPT_TOKENS
                    if step == tokens - 1:
                        message.finish_reason = common_pb2.FINISH_REASON_LENGTH
                    call.deliver(message)
                for _ in range(6):  # every request takes its token and "writes" its frame
                    await asyncio.sleep(0)
            frames = await asyncio.gather(*tasks)
            out.append((time.process_time() - t0) / (requests * tokens) * 1e6)
            if min(frames) < tokens:
                raise RuntimeError(f"a request sent {min(frames)} frames for {tokens} tokens")
    finally:
        await post.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.token_path", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=128, help="concurrent requests (one token each per step)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--model-dir", default="", help="default: the demo model (built on first use)")
    args = p.parse_args(argv)
    model_dir = args.model_dir
    if not model_dir:
        from services.launcher.plan import ROOT
        from services.models.build import build_demo_model

        model_dir = str(build_demo_model(ROOT / "build" / "models" / "demo-qwen"))
    import uvloop  # as every Meshfront service runs (services/common/grpc_server.py)

    per_token = uvloop.run(run(model_dir, args.requests, args.tokens, args.rounds))
    print(f"{args.requests} requests x {args.tokens} tokens, {args.rounds} rounds: CPU µs per token median "
          f"{statistics.median(per_token):.2f}, min {min(per_token):.2f} "
          f"({statistics.median(per_token) * args.tokens / 1000:.2f} ms per request)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
