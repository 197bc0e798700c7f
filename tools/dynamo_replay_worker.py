"""A Dynamo 1.6.1 worker that answers every request with scripted token ids (runs in ``.venv-dynamo``).

``tools/dynamo_replay.py`` starts it next to ``python -m dynamo.frontend``. It registers one model per
``--model NAME=TOOL_PARSER,REASONING_PARSER,DEFAULT_THINKING_MODE`` (empty for none) on an endpoint of its
own, with the parser names in the model card's runtime config, as an engine worker's ``--dyn-tool-call-parser`` /
``--dyn-reasoning-parser`` put them there (and ``default_thinking_mode`` in its runtime data, as a worker's
``--default-thinking-mode`` does), so Dynamo's frontend parses what this worker emits with its own
parsers. What to emit is read from ``--script`` on every request (the replay tool rewrites it before each
one): ``{"chunks": [[id, ...], ...]}``, one response message per chunk, the last with ``finish_reason``.
A request's prompt is written to ``--script`` + ``.prompt`` so the tool can check what the template did.

This file imports only Dynamo's public Python API; it is not part of Meshfront's services.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
from typing import Any

import uvloop
from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model
from dynamo.runtime import DistributedRuntime, dynamo_worker


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--script", required=True, type=pathlib.Path)
    p.add_argument("--namespace", default="replay")
    p.add_argument("--model", action="append", required=True,
                   help="NAME=TOOL_PARSER,REASONING_PARSER,DEFAULT_THINKING_MODE")
    return p.parse_args()


def make_handler(script: pathlib.Path):
    async def generate(request: dict[str, Any], context: Any = None):
        prompt = request.get("token_ids") or []
        script.with_suffix(".prompt").write_text(json.dumps(prompt))
        chunks = json.loads(script.read_text())["chunks"]
        total = sum(len(c) for c in chunks)
        for i, ids in enumerate(chunks):
            out: dict[str, Any] = {"token_ids": list(ids), "index": 0}
            if i == len(chunks) - 1:
                out["finish_reason"] = "stop"
                out["completion_usage"] = {"prompt_tokens": len(prompt), "completion_tokens": total,
                                           "total_tokens": len(prompt) + total}
            yield out
    return generate


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    args = parse_args()
    handler = make_handler(args.script)
    endpoints = []
    for i, spec in enumerate(args.model):
        name, _, parsers = spec.partition("=")
        tool, reasoning, thinking = (parsers.split(",") + ["", ""])[:3]
        endpoint = runtime.endpoint(f"{args.namespace}.replay{i}.generate")
        cfg = ModelRuntimeConfig()
        cfg.tool_call_parser = tool or None
        cfg.reasoning_parser = reasoning or None
        if thinking:
            cfg.set_engine_specific("default_thinking_mode", json.dumps(thinking))  # as sglang/register.py does
        await register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint,
                             args.model_path, name, worker_type=WorkerType.Aggregated, runtime_config=cfg)
        endpoints.append(endpoint)
    await asyncio.gather(*(e.serve_endpoint(handler) for e in endpoints))


if __name__ == "__main__":
    uvloop.run(worker())
