"""Schemas of the Files and Batch routes (services/gateway/batch/): OpenAI's file and batch objects.

The values the parsers accept come from the parsers themselves (endpoints, purposes, statuses), so this
document cannot drift from them.
"""

from __future__ import annotations

from services.gateway.batch.files import PURPOSES, UPLOAD_PURPOSES
from services.gateway.batch.lines import ENDPOINTS
from services.gateway.batch.state import ACTIVE, FINAL
from services.gateway.http_api.schema import Schema, array, boolean, integer, map_of, obj, string

FILE = obj({
    "id": string("file-..."), "object": string(enum=("file",)), "bytes": integer(minimum=0),
    "created_at": integer(), "expires_at": integer(nullable=True), "filename": string(),
    "purpose": string(enum=PURPOSES), "status": string(enum=("processed",)),
    "status_details": string(nullable=True),
}, "OpenAI's file object", required=("id", "object", "bytes", "created_at", "filename", "purpose", "status"))
FILE_UPLOAD = obj({"purpose": string(enum=UPLOAD_PURPOSES), "file": string("The JSONL file", format="binary")},
                  "multipart/form-data, as the openai SDK sends it", required=("purpose", "file"))
FILE_LIST = obj({"object": string(enum=("list",)), "data": array(FILE), "first_id": string(nullable=True),
                 "last_id": string(nullable=True), "has_more": boolean()}, required=("object", "data", "has_more"))
FILE_DELETED = obj({"id": string(), "object": string(enum=("file",)), "deleted": boolean()},
                   required=("id", "object", "deleted"))
_ERROR = obj({"code": string(), "message": string(), "param": string(nullable=True),
              "line": integer(nullable=True)})
BATCH_CREATE = obj({
    "input_file_id": string("A file uploaded with purpose batch: one JSON request per line"),
    "endpoint": string(enum=ENDPOINTS),
    "completion_window": string("24h (Meshfront also takes shorter windows: 30m, 90s)"),
    "metadata": map_of(string(), "Up to 16 pairs"),
    "output_expires_after": map_of({}, "Accepted; outputs are kept 30 days"),
}, "OpenAI's batch create", required=("input_file_id", "endpoint", "completion_window"))
_TIME = integer(nullable=True)
BATCH = obj({
    "id": string("batch_..."), "object": string(enum=("batch",)), "endpoint": string(enum=ENDPOINTS),
    "errors": obj({"object": string(enum=("list",)), "data": array(_ERROR)}, nullable=True),
    "input_file_id": string(), "completion_window": string(), "status": string(enum=ACTIVE + FINAL),
    "output_file_id": string(nullable=True), "error_file_id": string(nullable=True), "created_at": integer(),
    "in_progress_at": _TIME, "expires_at": _TIME, "finalizing_at": _TIME, "completed_at": _TIME,
    "failed_at": _TIME, "expired_at": _TIME, "cancelling_at": _TIME, "cancelled_at": _TIME,
    "request_counts": obj({"total": integer(), "completed": integer(), "failed": integer()}),
    "metadata": {**map_of(string(), "Up to 16 pairs, as created"), "nullable": True},
}, "OpenAI's batch object", required=("id", "object", "endpoint", "input_file_id", "completion_window", "status",
                                      "created_at", "request_counts"))
BATCH_LIST = obj({"object": string(enum=("list",)), "data": array(BATCH), "first_id": string(nullable=True),
                  "last_id": string(nullable=True), "has_more": boolean()}, required=("object", "data", "has_more"))

SCHEMAS: dict[str, Schema] = {
    "File": FILE, "FileUpload": FILE_UPLOAD, "FileList": FILE_LIST, "FileDeleted": FILE_DELETED,
    "BatchCreateRequest": BATCH_CREATE, "Batch": BATCH, "BatchList": BATCH_LIST,
}
