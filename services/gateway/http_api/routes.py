"""Every HTTP route of the API, with its request and response schemas: the one list to extend.

Adding an endpoint is one entry here (plus its RPC with an http annotation, which is what Envoy
serves). tests/unit/gateway/test_openapi.py reads the routes Envoy's transcoder serves from
deploy/envoy/gateway.pb and fails for a served route without an entry, so /openapi.json cannot fall
behind the API. ``method`` and ``path`` use OpenAPI's template form (``{model_id}``, no ``=**``).
"""

from __future__ import annotations

import dataclasses

from services.gateway.http_api.schema import Schema, ref, string

JSON = "application/json"
SSE = "text/event-stream"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
HTML = "text/html; charset=utf-8"
PLAIN = "text/plain; charset=utf-8"
# What a media URL serves (the worker's encodings).
MULTIPART = "multipart/form-data"
MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "video/mp4", "video/x-motion-jpeg")


@dataclasses.dataclass(frozen=True)
class Body:
    """One response body: its content type and schema."""

    schema: Schema
    content_type: str = JSON


@dataclasses.dataclass(frozen=True)
class Endpoint:
    method: str  # get | post | delete
    path: str
    operation_id: str
    summary: str
    tag: str
    ok: tuple[Body, ...]  # 200 bodies: JSON, and the event stream where the route streams
    request: Schema | None = None  # the request body
    request_type: str = JSON  # its content type
    errors: tuple[int, ...] = ()  # statuses that answer with ``error_schema``
    error_schema: str = "Error"
    path_params: tuple[tuple[str, str], ...] = ()  # (name, description)
    query_params: tuple[tuple[str, str], ...] = ()  # (name, description); all optional strings
    description: str = ""


_GENERATION_ERRORS = (400, 404, 413, 499, 500, 501, 503)

OPENAI = "OpenAI"
ANTHROPIC = "Anthropic"
SERVICE = "Service"

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("post", "/v1/chat/completions", "createChatCompletion", "Chat completion, streamed or not", OPENAI,
             ok=(Body(ref("ChatCompletion")), Body(ref("ChatCompletionChunk"), SSE)),
             request=ref("ChatCompletionRequest"), errors=_GENERATION_ERRORS,
             description="`stream: true` answers `text/event-stream`: `data: <ChatCompletionChunk>` frames and "
                         "`data: [DONE]`. A failure after the first frame is an in-band `data: {\"error\": ...}`."),
    Endpoint("post", "/v1/completions", "createCompletion", "Text completion, streamed or not", OPENAI,
             ok=(Body(ref("Completion")), Body(ref("Completion"), SSE)),
             request=ref("CompletionRequest"), errors=_GENERATION_ERRORS),
    Endpoint("post", "/v1/embeddings", "createEmbedding", "Embeddings of texts or token ids", OPENAI,
             ok=(Body(ref("EmbeddingList")),), request=ref("EmbeddingRequest"), errors=_GENERATION_ERRORS),
    Endpoint("post", "/v1/responses", "createResponse", "A response (OpenAI Responses API), streamed or not",
             OPENAI, ok=(Body(ref("Response")), Body(ref("Response"), SSE)), request=ref("ResponseRequest"),
             errors=_GENERATION_ERRORS,
             description="`stream: true` answers typed events (`event: response.output_text.delta` ...)."),
    Endpoint("get", "/v1/responses/{response_id}", "retrieveResponse", "A stored response", OPENAI,
             ok=(Body(ref("Response")),), errors=(404,), path_params=(("response_id", "resp_..."),)),
    Endpoint("delete", "/v1/responses/{response_id}", "deleteResponse", "Delete a stored response", OPENAI,
             ok=(Body(ref("ResponseDeleted")),), errors=(404,), path_params=(("response_id", "resp_..."),)),
    Endpoint("post", "/v1/images/generations", "createImage", "Images from a prompt (or an image: input_reference)",
             OPENAI, ok=(Body(ref("ImagesResponse")), Body(ref("ImageStreamEvent"), SSE)),
             request=ref("ImageRequest"), errors=_GENERATION_ERRORS,
             description="`stream: true` answers `event: image_generation.partial_image` and "
                         "`image_generation.completed` events. Limits (sizes, n, steps, formats) are the model's."),
    Endpoint("post", "/v1/images/edits", "createImageEdit", "Images from an uploaded image, a mask and a prompt",
             OPENAI, ok=(Body(ref("ImagesResponse")), Body(ref("ImageStreamEvent"), SSE)),
             request=ref("ImageEditRequest"), request_type=MULTIPART, errors=_GENERATION_ERRORS,
             description="Streamed events are `image_edit.partial_image` and `image_edit.completed`."),
    Endpoint("get", "/v1/media/{media_id}", "retrieveMedia", "A generated image or video behind its URL", OPENAI,
             ok=tuple(Body(string(format="binary"), t) for t in MEDIA_TYPES), errors=(404, 503),
             path_params=(("media_id", "The id in the URL an images or videos answer gave"),),
             description="The URL a `response_format: url` answer returns; any gateway replica serves it until "
                         "it expires (`--media-url-ttl-s`), then 404."),
    Endpoint("post", "/v1/messages", "createMessage", "A message (Anthropic Messages API), streamed or not",
             ANTHROPIC, ok=(Body(ref("AnthropicMessagesResponse")), Body(ref("AnthropicMessagesResponse"), SSE)),
             request=ref("AnthropicMessagesRequest"), errors=_GENERATION_ERRORS, error_schema="AnthropicError"),
    Endpoint("post", "/v1/messages/count_tokens", "countMessageTokens", "Prompt tokens of a Messages request",
             ANTHROPIC, ok=(Body(ref("AnthropicCountTokensResponse")),),
             request=ref("AnthropicCountTokensRequest"), errors=(400, 404, 503), error_schema="AnthropicError"),
    Endpoint("post", "/v1/videos", "createVideo", "A video job (OpenAI), or a video now (Dynamo's shape)", OPENAI,
             ok=(Body(ref("VideoJob")), Body(ref("VideoGeneration"), SSE)), request=ref("VideoCreateRequest"),
             errors=_GENERATION_ERRORS,
             description="multipart/form-data (as the openai SDK sends it) or JSON without `response_format`, "
                         "`output_format`, `nvext` and `stream`: an OpenAI job, answered at once; poll "
                         "GET /v1/videos/{video_id}. A JSON body naming any of those four: Dynamo's "
                         "NvCreateVideoRequest, answered when the video exists (as /v1/videos/generations)."),
    Endpoint("post", "/v1/videos/generations", "generateVideo", "A video now (Dynamo's NvCreateVideoRequest)",
             OPENAI, ok=(Body(ref("VideoGeneration")), Body(ref("VideoGeneration"), SSE)),
             request=ref("VideoCreateRequest"), errors=_GENERATION_ERRORS,
             description="`stream: true`: `data: {status: in_progress, progress}` events, then the answer as the "
                         "last `data:` event, then `data: [DONE]`."),
    Endpoint("get", "/v1/videos", "listVideos", "Video jobs, newest first", OPENAI, ok=(Body(ref("VideoList")),),
             errors=(400, 503), query_params=(("after", "The last id of the previous page"),
                                              ("limit", "1-100 (default 20)"), ("order", "asc | desc"))),
    Endpoint("get", "/v1/videos/{video_id}", "retrieveVideo", "A video job", OPENAI, ok=(Body(ref("VideoJob")),),
             errors=(404,), path_params=(("video_id", "video_..."),)),
    Endpoint("delete", "/v1/videos/{video_id}", "deleteVideo", "Delete a video job and its video", OPENAI,
             ok=(Body(ref("VideoDeleted")),), errors=(404,), path_params=(("video_id", "video_..."),)),
    Endpoint("get", "/v1/videos/{video_id}/content", "downloadVideoContent", "A completed job's video", OPENAI,
             ok=(Body(string(format="binary"), "video/mp4"), Body(string(format="binary"), "video/x-msvideo")),
             errors=(400, 404), path_params=(("video_id", "video_..."),),
             query_params=(("variant", "video (the only one served)"),)),
    Endpoint("post", "/v1/files", "createFile", "Upload a file (purpose batch: a batch's JSONL input)", OPENAI,
             ok=(Body(ref("File")),), request=ref("FileUpload"), request_type=MULTIPART, errors=(400, 401, 503)),
    Endpoint("get", "/v1/files", "listFiles", "The caller's files, newest first", OPENAI, ok=(Body(ref("FileList")),),
             errors=(400, 401, 503), query_params=(("after", "The last id of the previous page"),
                                                   ("limit", "1-10000 (default 10000)"), ("order", "asc | desc"),
                                                   ("purpose", "batch | batch_output"))),
    Endpoint("get", "/v1/files/{file_id}", "retrieveFile", "A file object", OPENAI, ok=(Body(ref("File")),),
             errors=(401, 404), path_params=(("file_id", "file-..."),)),
    Endpoint("delete", "/v1/files/{file_id}", "deleteFile", "Delete a file and its bytes", OPENAI,
             ok=(Body(ref("FileDeleted")),), errors=(401, 404), path_params=(("file_id", "file-..."),)),
    Endpoint("get", "/v1/files/{file_id}/content", "downloadFile", "A file's bytes (JSONL)", OPENAI,
             ok=(Body(string(format="binary"), "application/jsonl"),), errors=(401, 404),
             path_params=(("file_id", "file-..."),)),
    Endpoint("post", "/v1/batches", "createBatch", "Run a file of requests in the background", OPENAI,
             ok=(Body(ref("Batch")),), request=ref("BatchCreateRequest"), errors=(400, 401, 404, 503),
             description="Lines of /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/responses run at "
                         "the lowest priority; the output and error files hold one line per input line, keyed by "
                         "custom_id. A bad line fails alone (error file)."),
    Endpoint("get", "/v1/batches", "listBatches", "The caller's batches, newest first", OPENAI,
             ok=(Body(ref("BatchList")),), errors=(400, 401, 503),
             query_params=(("after", "The last id of the previous page"), ("limit", "1-100 (default 20)"))),
    Endpoint("get", "/v1/batches/{batch_id}", "retrieveBatch", "A batch and its request counts", OPENAI,
             ok=(Body(ref("Batch")),), errors=(401, 404), path_params=(("batch_id", "batch_..."),)),
    Endpoint("post", "/v1/batches/{batch_id}/cancel", "cancelBatch", "Cancel a batch (cancelling, then cancelled)",
             OPENAI, ok=(Body(ref("Batch")),), errors=(400, 401, 404), path_params=(("batch_id", "batch_..."),)),
    Endpoint("get", "/v1/models", "listModels", "Models with at least one live worker", OPENAI,
             ok=(Body(ref("ModelList")),)),
    Endpoint("get", "/v1/models/{model_id}", "retrieveModel", "One model", OPENAI, ok=(Body(ref("Model")),),
             errors=(404,), path_params=(("model_id", "The model id; may contain '/', escaped or not"),)),
    Endpoint("post", "/v1/load_lora_adapter", "loadLoraAdapter", "Load a LoRA adapter on every worker of its base "
             "model that loads adapters at runtime (vLLM's API)", OPENAI,
             ok=(Body(string("Success: LoRA adapter '...' added successfully."), PLAIN),),
             request=ref("LoadLoraAdapterRequest"), errors=(400, 404, 503), description="docs/lora.md"),
    Endpoint("post", "/v1/unload_lora_adapter", "unloadLoraAdapter", "Unload a LoRA adapter from every worker "
             "holding it (vLLM's API)", OPENAI,
             ok=(Body(string("Success: LoRA adapter '...' removed successfully."), PLAIN),),
             request=ref("UnloadLoraAdapterRequest"), errors=(400, 404, 503), description="docs/lora.md"),
    Endpoint("get", "/health", "health",
             "Ready: 200 when a model has a live worker and every stage is reachable, else 503", SERVICE,
             ok=(Body(ref("Health")),), errors=(503,), error_schema="Health"),
    Endpoint("get", "/live", "live", "Alive: 200 while the gateway serves, 503 once it drains", SERVICE,
             ok=(Body(ref("Live")),), errors=(503,), error_schema="Live"),
    Endpoint("get", "/metrics", "metrics", "Frontend request metrics of every gateway replica (Prometheus)",
             SERVICE, ok=(Body(string("Prometheus text exposition format 0.0.4"), PROMETHEUS),),
             description="docs/metrics.md lists the families; `--metrics-prefix dynamo_frontend` gives Dynamo's."),
    Endpoint("get", "/openapi.json", "openapi", "This document", SERVICE,
             ok=(Body({"type": "object", "description": "OpenAPI 3.0"}),)),
    Endpoint("get", "/docs", "docs", "Swagger UI over /openapi.json", SERVICE,
             ok=(Body(string("An HTML page"), HTML),)),
    Endpoint("get", "/docs/assets/{name}", "docsAsset", "Swagger UI's scripts, style sheets and icons", SERVICE,
             ok=(Body(string(format="binary"), "application/javascript"), Body(string(format="binary"), "text/css"),
                 Body(string(format="binary"), "image/png")),
             errors=(404,), path_params=(("name", "A file of the bundle, e.g. swagger-ui-bundle.js"),)),
)
