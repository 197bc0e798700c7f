"""The ``edge-split`` shape of ``python -m bench mesh``: the split mesh's hops with no logic behind them.

The ``edge`` floor (bench/edge_floor.py) is what any shape pays for Envoy and a grpc.aio gateway. The
split shape adds three services and their hops on top. This shape has exactly those hops, carrying
messages of the split mesh's sizes, with every stage reduced to a stand-in that does no work of its own:

- the gateway stand-in reads the body and sends a ``Preprocess`` call (the chat messages as JSON), then
  a ``Route`` call (the returned block hashes), then starts the request on one multiplexed
  ``GenerateStream`` to the postprocessor stand-in, and writes pre-rendered SSE frames for whatever
  came in, in write rounds (services/common/write_rounds.py), as the gateway does;
- the preprocessor stand-in answers a prepared ``PreprocessResponse`` (the prompt's token ids and block
  hashes), the router stand-in a prepared ``RouteResponse``, neither with the services' interceptor;
- the postprocessor stand-in serves ``GenerateStream`` through the mesh's own ``MuxSession`` and gives
  every open request one prepared ``GenerateResponse`` per tick of one shared ticker (the engine step),
  so one message carries the step's responses of every request, as from the real postprocessor.

What it leaves out makes it a lower bound of the split shape: the worker hop (only the workers' and
the postprocessor's reading of it), tokenizing and templating, routing, detokenizing and parsing,
building OpenAI chunks, validation. The split shape's front over this shape is the cost of that logic;
this shape's front over ``edge`` is the cost of the hops alone.

Run one stand-in alone: ``python -m bench.split_floor preprocessor --port 9200``.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import orjson

from bench.edge_floor import EdgeFloorMesh, Ticker, render_chunks, serve_stand_in
from services.launcher.plan import ProcessSpec, free_port

PROMPT_TOKENS = 208  # the bench's prompts with the demo model's chat template
BLOCK_SIZE = 16
TOKEN_ID = 1879  # any id: the stand-ins never decode it


def preprocessor(server: Any) -> None:
    from meshfront.preprocessor.v1 import preprocessor_pb2, preprocessor_pb2_grpc

    answer = preprocessor_pb2.PreprocessResponse(block_hashes=range(1, PROMPT_TOKENS // BLOCK_SIZE + 1))
    answer.request.token_ids.extend([TOKEN_ID] * PROMPT_TOKENS)
    answer.request.eos_token_ids.append(TOKEN_ID + 1)

    class Preprocessor(preprocessor_pb2_grpc.PreprocessorServiceServicer):
        async def Preprocess(self, request, context):
            out = preprocessor_pb2.PreprocessResponse()
            out.CopyFrom(answer)
            out.request.MergeFrom(request.request)  # the id, model and stop conditions the gateway sent
            return out

    preprocessor_pb2_grpc.add_PreprocessorServiceServicer_to_server(Preprocessor(), server)


def router(server: Any) -> None:
    from meshfront.router.v1 import router_pb2, router_pb2_grpc

    answer = router_pb2.RouteResponse(address="127.0.0.1:1", worker_id="stand-in")

    class Router(router_pb2_grpc.RouterServiceServicer):
        async def Route(self, request, context):
            return answer

    router_pb2_grpc.add_RouterServiceServicer_to_server(Router(), server)


def postprocessor(server: Any, step_s: float) -> None:
    from meshfront.common.v1 import common_pb2
    from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc

    from services.common.mux_session import MuxSession

    ticker = Ticker(step_s)
    first = postprocessor_pb2.GenerateResponse(text=" word", completion_tokens=1, prompt_tokens=PROMPT_TOKENS,
                                               token_ids=[TOKEN_ID])
    token = postprocessor_pb2.GenerateResponse(text=" word", completion_tokens=1, token_ids=[TOKEN_ID])
    last = postprocessor_pb2.GenerateResponse(text=" word", completion_tokens=1, token_ids=[TOKEN_ID],
                                              finish_reason=common_pb2.FINISH_REASON_LENGTH)

    async def generate(request) -> AsyncGenerator:
        tokens = request.request.stop.max_tokens
        for i in range(tokens):
            await ticker.wait()
            yield last if i == tokens - 1 else first if i == 0 else token

    class Postprocessor(postprocessor_pb2_grpc.PostprocessorServiceServicer):
        async def GenerateStream(self, request_iterator, context):
            await MuxSession(generate, context.write, postprocessor_pb2.GenerateStreamResponse,
                             "postprocessor.GenerateStream").run(request_iterator)

    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(Postprocessor(), server)


def gateway(server: Any, pre: str, route: str, post: str) -> None:
    import grpc
    from google.api import httpbody_pb2
    from meshfront.gateway.v1 import gateway_pb2_grpc
    from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc
    from meshfront.preprocessor.v1 import preprocessor_pb2, preprocessor_pb2_grpc
    from meshfront.router.v1 import router_pb2, router_pb2_grpc

    from services.common.errors import WorkerFailed
    from services.common.mux_client import MuxStream, Wire
    from services.common.write_rounds import write_in_round

    pre_stub = preprocessor_pb2_grpc.PreprocessorServiceStub(grpc.aio.insecure_channel(pre))
    route_stub = router_pb2_grpc.RouterServiceStub(grpc.aio.insecure_channel(route))
    post_stub = postprocessor_pb2_grpc.PostprocessorServiceStub(grpc.aio.insecure_channel(post))
    wire = Wire(
        open=post_stub.GenerateStream,
        start=lambda seq_id, request: postprocessor_pb2.GenerateStreamRequest(
            start=postprocessor_pb2.GenerateStreamStart(id=seq_id, request=request)),
        cancel=lambda seq_id: postprocessor_pb2.GenerateStreamRequest(
            cancel=postprocessor_pb2.GenerateStreamCancel(id=seq_id)),
        stream_error=lambda e, address: WorkerFailed(f"the postprocessor stand-in's stream failed: {e.code()}"),
        chunk_error=lambda status, address: WorkerFailed(status.message),
        ended=lambda address: WorkerFailed("the postprocessor stand-in ended the stream"), peer="postprocessor")
    streams: list[MuxStream] = []
    rendered: dict[tuple[str, int], list[bytes]] = {}
    ids = itertools.count(1)

    class Gateway(gateway_pb2_grpc.GatewayServiceServicer):
        async def ChatCompletions(self, request: httpbody_pb2.HttpBody, context) -> None:
            body = orjson.loads(request.data)
            key = (str(body.get("model", "")), int(body.get("max_tokens") or 16))
            frames = rendered.get(key) or rendered.setdefault(key, render_chunks(*key))
            ask = preprocessor_pb2.PreprocessRequest(messages_json=orjson.dumps(body.get("messages", [])).decode())
            ask.request.request_id, ask.request.model = f"floor-{next(ids)}", key[0]
            ask.request.stop.max_tokens = key[1]
            prepared = await pre_stub.Preprocess(ask)
            routed = await route_stub.Route(router_pb2.RouteRequest(
                request_id=ask.request.request_id, model=key[0], block_hashes=prepared.block_hashes,
                prompt_tokens=len(prepared.request.token_ids)))
            gen = postprocessor_pb2.GenerateRequest(request=prepared.request, options=prepared.postprocess,
                                                    worker_address=routed.address, worker_id=routed.worker_id)
            if not streams or not streams[0].usable:
                streams[:] = [MuxStream(wire, post)]
            call = streams[0].start(gen)
            sent = 0  # frames written: the role chunk goes with the first token, the tail with the last
            try:
                while True:
                    batch = await call.next_batch()
                    if batch.error is not None:
                        raise batch.error
                    if batch.messages:
                        end = sent + len(batch.messages) + (1 if sent == 0 else 0)
                        if batch.messages[-1].finish_reason:
                            end = len(frames)
                        data = b"".join(frames[sent:end])
                        sent = end
                        await write_in_round(context, httpbody_pb2.HttpBody(content_type="text/event-stream",
                                                                            data=data))
                    if batch.ended:
                        return
            finally:
                call.cancel()

    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(Gateway(), server)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.split_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=("gateway", "preprocessor", "router", "postprocessor"))
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--step-ms", type=float, default=0.0, help="postprocessor: one response per request per step "
                   "(0 = all at once)")
    p.add_argument("--preprocessor", default="", help="gateway: the preprocessor stand-in's address")
    p.add_argument("--router", default="", help="gateway: the router stand-in's address")
    p.add_argument("--postprocessor", default="", help="gateway: the postprocessor stand-in's address")
    args = p.parse_args(argv)
    import uvloop  # as every Meshfront service runs (services/common/grpc_server.py)

    if args.role == "gateway":
        if not (args.preprocessor and args.router and args.postprocessor):
            p.error("the gateway needs --preprocessor, --router and --postprocessor")
        add = lambda server: gateway(server, args.preprocessor, args.router, args.postprocessor)  # noqa: E731
    elif args.role == "postprocessor":
        add = lambda server: postprocessor(server, args.step_ms / 1000.0)  # noqa: E731
    else:
        add = {"preprocessor": preprocessor, "router": router}[args.role]
    uvloop.run(serve_stand_in("127.0.0.1", args.port, add))


class SplitFloorMesh(EdgeFloorMesh):
    """Envoy with the shipped config in front of the four stand-ins, under the launcher's process handling."""

    def __init__(self, log_dir: pathlib.Path, speedup: float):
        super().__init__(log_dir, speedup)
        self.stage_ports = {"preprocessor": free_port(), "router": free_port(), "postprocessor": free_port()}

    def _gateway_spec(self) -> ProcessSpec:
        addresses = [f"--{name}=127.0.0.1:{port}" for name, port in self.stage_ports.items()]
        return ProcessSpec("gateway-0", [sys.executable, "-m", "bench.split_floor", "gateway", "--port",
                                         str(self.gateway_port), *addresses], self.gateway_port,
                           {"PYTHONUNBUFFERED": "1"})

    def _stage_specs(self) -> list[ProcessSpec]:
        pace = {"postprocessor": ["--step-ms", f"{self.step_ms:g}"]}  # the one stand-in with a clock
        return [ProcessSpec(name, [sys.executable, "-m", "bench.split_floor", name, "--port", str(port),
                                   *pace.get(name, [])], port, {"PYTHONUNBUFFERED": "1"})
                for name, port in self.stage_ports.items()]


if __name__ == "__main__":
    main()
