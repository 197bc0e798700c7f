"""The response side of ``nvext``: annotation events, response ``nvext`` fields, the ignored-fields header.

Annotations go out as Dynamo sends them, an SSE event per name with its JSON value on a comment
line and no data, before the first chunk::

    event: request_id
    : "3f2a..."

Clients that ask for them read the raw stream (the ``openai`` SDK's ``with_streaming_response``):
an SSE event without data is not a chunk. A non-streamed body carries the same values under
``nvext``. ``extra_fields`` put ``worker_id`` on each choice's first chunk and ``worker_id``, ``timing`` and
``routing`` on its last (the body: once, at the top level; ``routing`` is a list when there are several choices).
"""

from __future__ import annotations

from typing import Any

import orjson

from services.gateway.core.nvext import NvExt
from services.gateway.core.trace import RequestTrace

IGNORED_FIELDS_HEADER = "x-meshfront-ignored-fields"


class ResponseExtensions:
    def __init__(self, nvext: NvExt, trace: RequestTrace, request_id: str):
        self.nvext = nvext
        self.trace = trace
        self.request_id = request_id

    def headers(self) -> tuple[tuple[str, str], ...]:
        """Response headers: the accepted fields this deployment ignores, when there are any."""
        if not self.nvext.ignored:
            return ()
        return ((IGNORED_FIELDS_HEADER, ", ".join(self.nvext.ignored)),)

    def _annotations(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for name in self.nvext.annotations:
            if name == "request_id":
                out.append((name, self.request_id))
            elif name == "formatted_prompt":
                out += [(name, p.formatted_prompt) for p in self.trace.prompts]
            elif name == "token_ids":
                out += [(name, p.token_ids) for p in self.trace.prompts]
        return out

    def annotation_events(self) -> bytes:
        return b"".join(b"event: " + name.encode() + b"\n: " + orjson.dumps(value) + b"\n\n"
                        for name, value in self._annotations())

    def _worker(self, index: int) -> dict[str, str]:
        worker = self.trace.workers.get(index, "")
        # Aggregated serving: one worker runs prefill and decode.
        return {"prefill_worker_id": self.trace.prefill_workers.get(index, worker), "decode_worker_id": worker}

    def chunk_nvext(self, index: int, first: bool, final: bool) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if "worker_id" in self.nvext.extra_fields and (first or final):
            out["worker_id"] = self._worker(index)
        if "timing" in self.nvext.extra_fields and final:
            out["timing"] = self.trace.timing()
        if final and index in self.trace.routing:
            out["routing"] = self.trace.routing[index].as_dict()
        return out or None

    def body_nvext(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if "worker_id" in self.nvext.extra_fields:
            out["worker_id"] = self._worker(0)
        if "timing" in self.nvext.extra_fields:
            out["timing"] = self.trace.timing()
        if self.trace.routing:
            records = [self.trace.routing[i].as_dict() for i in sorted(self.trace.routing)]
            out["routing"] = records[0] if len(records) == 1 else records
        values: dict[str, list[Any]] = {}
        for name, value in self._annotations():
            values.setdefault(name, []).append(value)
        for name, vs in values.items():
            # One value per prompt; a completions batch gets the list of them.
            out[name] = vs[0] if len(vs) == 1 else vs
        return out or None
