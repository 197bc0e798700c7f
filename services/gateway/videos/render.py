"""Video response bodies: OpenAI's job objects and list, and Dynamo's synchronous answer, piece by piece.

The synchronous answer is ``{id, object: "video", model, status, progress, created, data: [{output_format,
fps, url | b64_json}], inference_time_s}``. Its ``b64_json`` can be tens of MB, so it is never built
whole: ``SyncBody`` writes the JSON up to the opening quote of ``b64_json``, then ``Base64Stream``
(media/base64_stream.py) encodes the video chunk by chunk (the pieces join into one valid encoding),
then the tail with ``inference_time_s``, which the worker reports after its last chunk. Streamed
(``stream: true``), the same object is the last SSE event's data, after one ``in_progress`` event per
progress report, and ``data: [DONE]`` ends the stream.
"""

from __future__ import annotations

from typing import Any

import orjson

from services.gateway.videos.jobs import public


def job_body(record: dict[str, Any]) -> bytes:
    return orjson.dumps(public(record))


def list_body(records: list[dict[str, Any]], has_more: bool) -> bytes:
    data = [public(r) for r in records]
    return orjson.dumps({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": has_more})


def deleted_body(video_id: str) -> bytes:
    return orjson.dumps({"id": video_id, "object": "video.deleted", "deleted": True})



class SyncBody:
    """Dynamo's synchronous video object, written in pieces (head, the video's url or base64, tail)."""

    def __init__(self, video_id: str, model: str, created: int, output_format: str, fps: float):
        self.video_id = video_id
        self.model = model
        self.created = created
        self.output_format = output_format
        self.fps = fps

    def _base(self, status: str, progress: int) -> dict[str, Any]:
        return {"id": self.video_id, "object": "video", "model": self.model, "status": status,
                "progress": progress, "created": self.created}

    def head(self, field: str) -> bytes:
        """Everything before the video's ``url`` or ``b64_json`` value (its opening quote included for b64)."""
        start = orjson.dumps({**self._base("completed", 100), "data": []})[:-3]  # drop the closing `[]}`
        item = orjson.dumps({"output_format": self.output_format, "fps": self.fps})[:-1]
        return start + b"[" + item + b',"' + field.encode() + b'":' + (b'"' if field == "b64_json" else b"")

    def url_value(self, url: str) -> bytes:
        return orjson.dumps(url)

    def tail(self, inference_time_s: float, *, b64: bool) -> bytes:
        return (b'"' if b64 else b"") + b"}]," + orjson.dumps({"inference_time_s": round(inference_time_s, 3)})[1:]

    def progress_event(self, progress: int) -> bytes:
        return b"data: " + orjson.dumps(self._base("in_progress", progress)) + b"\n\n"
