"""The Dynamo oracle: replays model outputs through Dynamo 1.6.1's own frontend and records its split.

For each case (a model output as text, the parser names, the request's extra fields) it starts
``python -m dynamo.frontend`` (file discovery, no NATS) and one scripted worker
(``tools/dynamo_replay_worker.py``) in ``.venv-dynamo`` (built on first use, ``bench/dynamo_peer.py``). The
worker registers a model per (tool-call parser, reasoning parser, default thinking mode) with those names
in its card, as an engine worker's ``--dyn-tool-call-parser`` / ``--dyn-reasoning-parser`` /
``--dyn-default-thinking-mode`` do, and answers each request with the text's token ids under the demo
model's Qwen tokenizer, ``chunk`` tokens per response message. The case is asked for twice, streamed and
whole, and what Dynamo made of it (content, reasoning_content, tool calls, finish_reason) is recorded.

Usage::

    # ad hoc: prints Dynamo's split as JSON
    .venv/bin/python tools/dynamo_replay.py --tool-call-parser hermes --reasoning-parser qwen3 \\
        --text '<think>hmm</think>Hi <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    # goldens: each tests/golden/parsers/dynamo/cases/<name>.yaml becomes tests/golden/parsers/dynamo/<name>.json
    .venv/bin/python tools/dynamo_replay.py tests/golden/parsers/dynamo/cases/hermes.yaml

A case file (YAML) holds ``tool_call_parser``, ``reasoning_parser``, optionally ``default_thinking_mode``,
``parser_version`` (1 or 2: the frontend runs with that ``DYN_PARSER_VERSION``; unset: Dynamo's default,
which picks V1 where a format has one) and ``tools`` (default: the two
tools below when there is a tool-call parser, else none), and ``cases``: each an ``id``, a ``text``,
optionally ``request`` (fields merged into the chat request: ``chat_template_kwargs``, ``reasoning_effort``,
``tool_choice``, …), ``chunk`` (tokens per streamed message, default 1) and any of the file's keys to
override them; ``meshfront`` (``{tool_call_parser: …, reasoning_parser: …}``) names Meshfront's parser where
its name differs from Dynamo's. ``tests/unit/parsers/test_dynamo_goldens.py`` replays Meshfront's parsers against the
goldens without Dynamo.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import yaml
from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import dynamo_peer  # noqa: E402  (the repo root is put on the path above)
from services.launcher.plan import free_port  # noqa: E402
from services.models.build import default_test_model_dir  # noqa: E402

GOLDEN_DIR = ROOT / "tests" / "golden" / "parsers" / "dynamo"
DYNAMO_VERSION = "1.6.1"
# What a case offers the model when its file names a tool-call parser and no tools of its own.
DEFAULT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "days": {"type": "integer"}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "send_message", "description": "Send a message",
                                      "parameters": {"type": "object", "properties": {
                                          "to": {"type": "string"}, "text": {"type": "string"}},
                                          "required": ["to", "text"]}}},
]
MODELS_PER_FRONTEND = 8  # each card holds the tokenizer's files open; more models, more frontends
CASE_KEYS = ("tool_call_parser", "reasoning_parser", "default_thinking_mode", "parser_version", "tools", "meshfront")


def load_case_file(path: pathlib.Path) -> list[dict[str, Any]]:
    """The file's cases with the file-level keys filled in."""
    doc = yaml.safe_load(path.read_text())
    out = []
    for raw in doc["cases"]:
        case = {k: raw.get(k, doc.get(k)) for k in CASE_KEYS}
        case["tool_call_parser"] = case["tool_call_parser"] or ""
        case["reasoning_parser"] = case["reasoning_parser"] or ""
        case["default_thinking_mode"] = case["default_thinking_mode"] or ""
        case["parser_version"] = int(case["parser_version"] or 0)
        case["meshfront"] = case["meshfront"] or {}
        if case["tools"] is None:
            case["tools"] = DEFAULT_TOOLS if case["tool_call_parser"] else []
        case.update(id=raw["id"], text=raw["text"], request=raw.get("request") or {}, chunk=int(raw.get("chunk", 1)))
        out.append(case)
    return out


def model_name(case: dict[str, Any]) -> str:
    return f"replay/{case['tool_call_parser'] or '-'}/{case['reasoning_parser'] or '-'}/" \
           f"{case['default_thinking_mode'] or '-'}"


def text_chunks(tokenizer: Tokenizer, ids: list[int], chunk: int) -> tuple[list[list[int]], list[str]]:
    """The ids in groups of ``chunk`` and the text each group adds, decoded incrementally (a character
    split across tokens comes with the group that completes it)."""
    groups = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    texts, shown, end = [], "", 0
    for group in groups:
        end += len(group)
        text = tokenizer.decode(ids[:end], skip_special_tokens=False)
        if text.endswith("\ufffd") and end < len(ids):
            texts.append("")
            continue
        texts.append(text[len(shown):])
        shown = text
    return groups, texts


def _raise_open_files() -> None:
    """Dynamo's frontend keeps files open per model card; the default soft limit (1024) runs out."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class DynamoFrontend:
    """``python -m dynamo.frontend`` and the scripted worker, for one parser version."""

    def __init__(self, work: pathlib.Path, models: list[str], parser_version: int, model_dir: pathlib.Path):
        self.work, self.models = work, models
        self.port = free_port()
        self.script = work / "script.json"
        self.script.write_text('{"chunks": [[]]}')
        python = str(dynamo_peer.ensure_venv())
        env = {**os.environ, **dynamo_peer.environment(work, 0), "DYN_DISCOVERY_BACKEND": "file",
               "DYN_SELF_HOST_METADATA": "0"}
        env.pop("NATS_SERVER")  # file discovery and the TCP request plane need no NATS
        if parser_version:
            env["DYN_PARSER_VERSION"] = str(parser_version)
        self.procs: list[subprocess.Popen] = []
        for name, argv in (
            ("frontend", [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(self.port),
                          "--discovery-backend", "file", "--router-mode", "round-robin"]),
            ("worker", [python, str(ROOT / "tools" / "dynamo_replay_worker.py"), "--model-path", str(model_dir),
                        "--script", str(self.script), *(a for m in models for a in ("--model", m)),
                        "--namespace", f"replay{os.getpid()}"]),
        ):
            log = open(work / f"{name}.log", "wb")  # noqa: SIM115  (closed with the process)
            self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               preexec_fn=_raise_open_files))
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)

    def wait_ready(self) -> None:
        timeout = 60 + 10 * len(self.models)  # each card loads the tokenizer, a few seconds on a busy machine
        wanted = {m.partition("=")[0] for m in self.models}
        listed: set[str] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                listed = {m["id"] for m in self.client.get("/v1/models").json()["data"]}
                if wanted <= listed:
                    return
            time.sleep(0.3)
        # Dynamo logs why a card did not become a model (an unknown name, no V1 parser for a format).
        reasons = [line for line in (self.work / "frontend.log").read_text(errors="replace").splitlines()
                   if "materialization failed" in line or "ERROR" in line]
        worker = (self.work / "worker.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"Dynamo's frontend did not list {sorted(wanted - listed)} in {timeout:.0f} s:\n"
                           + "\n".join(dict.fromkeys(reasons[-5:])) + f"\nworker log:\n{worker}")

    def close(self) -> None:
        self.client.close()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def ask(self, body: dict[str, Any], groups: list[list[int]]) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
        """(streamed split, whole split, prompt ids) of one scripted output."""
        self.script.write_text(json.dumps({"chunks": groups or [[]]}))
        streamed = fold_stream(self._stream(body))
        prompt = json.loads(self.script.with_suffix(".prompt").read_text())
        response = self.client.post("/v1/chat/completions", json={**body, "stream": False})
        if response.status_code != 200:
            raise RuntimeError(f"Dynamo answered {response.status_code}: {response.text}")
        choice = response.json()["choices"][0]
        message = choice["message"]
        calls = [[c["function"]["name"], c["function"]["arguments"]] for c in message.get("tool_calls") or []]
        whole = {"content": message.get("content") or "", "reasoning": message.get("reasoning_content") or "",
                 "calls": calls, "finish_reason": choice["finish_reason"]}
        return streamed, whole, prompt

    def _stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        with self.client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            if response.status_code != 200:
                raise RuntimeError(f"Dynamo answered {response.status_code}: {response.read().decode()}")
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[6:])


def fold_stream(chunks: Iterator[dict[str, Any]]) -> dict[str, Any]:
    """Folds SSE chunks as an OpenAI client does: text concatenated, calls by index."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or "")
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], ["", ""])
                fn = call.get("function") or {}
                slot[0] += fn.get("name") or ""
                slot[1] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return {"content": "".join(content), "reasoning": "".join(reasoning),
            "calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


def replay(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dynamo's streamed and whole split of every case (one frontend per parser version)."""
    model_dir = default_test_model_dir()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    results = []
    for version in sorted({c["parser_version"] for c in cases}):
        specs = sorted({f"{model_name(c)}={c['tool_call_parser']},{c['reasoning_parser']},"
                        f"{c['default_thinking_mode']}" for c in cases if c["parser_version"] == version})
        for start in range(0, len(specs), MODELS_PER_FRONTEND):
            models = specs[start:start + MODELS_PER_FRONTEND]
            names = {m.partition("=")[0] for m in models}
            group = [c for c in cases if c["parser_version"] == version and model_name(c) in names]
            with tempfile.TemporaryDirectory(prefix="dynamo-replay-") as tmp:
                frontend = DynamoFrontend(pathlib.Path(tmp), models, version, model_dir)
                try:
                    frontend.wait_ready()
                    results += [_replay_one(frontend, tokenizer, case) for case in group]
                finally:
                    frontend.close()
    order = {c["id"]: i for i, c in enumerate(cases)}
    return sorted(results, key=lambda r: order[r["id"]])


def _replay_one(frontend: DynamoFrontend, tokenizer: Tokenizer, case: dict[str, Any]) -> dict[str, Any]:
    ids = tokenizer.encode(case["text"], add_special_tokens=False).ids
    groups, texts = text_chunks(tokenizer, ids, case["chunk"])
    body: dict[str, Any] = {"model": model_name(case), "messages": [{"role": "user", "content": "replay"}],
                            "max_tokens": len(ids) + 16, **case["request"]}
    if case["tools"]:
        body.setdefault("tools", case["tools"])
    streamed, whole, prompt = frontend.ask(body, groups)
    prompt_tail = tokenizer.decode(prompt[-16:], skip_special_tokens=False)
    return {**{k: case[k] for k in ("id", *CASE_KEYS, "request", "text")}, "chunks": texts,
            "prompt_tail": prompt_tail, "streamed": streamed, "whole": whole}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/dynamo_replay.py", description=__doc__.splitlines()[0])
    p.add_argument("case_files", nargs="*", type=pathlib.Path, help="YAML case files; each writes its golden")
    p.add_argument("--text", help="one model output to replay ad hoc (printed, not written)")
    p.add_argument("--tool-call-parser", default="")
    p.add_argument("--reasoning-parser", default="")
    p.add_argument("--default-thinking-mode", default="")
    p.add_argument("--parser-version", type=int, default=0, help="DYN_PARSER_VERSION (default: Dynamo's)")
    p.add_argument("--request", default="{}", help="JSON merged into the chat request")
    p.add_argument("--chunk", type=int, default=1, help="tokens per streamed message")
    args = p.parse_args(argv)
    if args.text is None and not args.case_files:
        p.error("give case files or --text")
    if args.text is not None:
        case = {"id": "adhoc", "text": args.text, "tool_call_parser": args.tool_call_parser,
                "reasoning_parser": args.reasoning_parser, "default_thinking_mode": args.default_thinking_mode,
                "parser_version": args.parser_version, "request": json.loads(args.request), "chunk": args.chunk,
                "tools": DEFAULT_TOOLS if args.tool_call_parser else [], "meshfront": {}}
        print(json.dumps(replay([case])[0], indent=1, ensure_ascii=False))
        return 0
    per_file = {path: load_case_file(path) for path in args.case_files}
    results = replay([c for cases in per_file.values() for c in cases])
    by_id = {r["id"]: r for r in results}
    for path, cases in per_file.items():
        out = GOLDEN_DIR / f"{path.stem}.json"
        doc = {"generated_by": "tools/dynamo_replay.py", "dynamo": DYNAMO_VERSION,
               "source": str(path.resolve().relative_to(ROOT)), "cases": [by_id[c["id"]] for c in cases]}
        out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {out.relative_to(ROOT)} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
