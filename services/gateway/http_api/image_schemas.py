"""OpenAPI schemas of the Images API (services/gateway/images/)."""

from __future__ import annotations

from services.gateway.http_api.schema import array, boolean, integer, number, obj, string

_COMMON = {
    "model": string(),
    "prompt": string(maxLength=32000),
    "n": integer("Images to make; at most the model's limit", minimum=1, maximum=10),
    "size": string("'WIDTHxHEIGHT' within the model's limits (multiples of its size step), or 'auto'"),
    "response_format": string("b64_json (the default) or url: GET /v1/media/{media_id} until it expires",
                              enum=("b64_json", "url")),
    "output_format": string(enum=("png", "jpeg", "webp")),
    "output_compression": integer("jpeg and webp only", minimum=0, maximum=100),
    "quality": string(enum=("auto", "low", "medium", "high", "standard", "hd")),
    "background": string("transparent needs png or webp", enum=("auto", "transparent", "opaque")),
    "stream": boolean("Server-sent events: partial images, then one completed event per image"),
    "partial_images": integer("Previews per image while it is made (stream only)", minimum=0, maximum=3),
    "user": string("Bookkeeping; does not change the result"),
    "safety_identifier": string("Bookkeeping; does not change the result"),
    "moderation": string("Accepted; the mesh runs no moderation", enum=("auto", "low")),
}
IMAGE_NVEXT = obj({
    "negative_prompt": string(), "num_inference_steps": integer(minimum=1),
    "guidance_scale": number(minimum=0), "seed": integer("Image i is made from seed + i", minimum=0),
}, "Dynamo's extensions")
IMAGE_REQUEST = obj({
    **_COMMON, "nvext": IMAGE_NVEXT,
    "input_reference": string("Image-to-image: a PNG, JPEG or WebP image as base64 or a data: URL"),
}, "POST /v1/images/generations", required=("model", "prompt"))
IMAGE_EDIT_REQUEST = obj({
    **_COMMON,
    "image": string("The PNG, JPEG or WebP image to edit (also sent as image[])", format="binary"),
    "mask": string("A PNG the size of image: transparent where to paint", format="binary"),
    "nvext": string("Dynamo's extensions: the nested fields nvext[seed], nvext[num_inference_steps], ... (as the "
                     "openai SDK sends extra_body), or one JSON object as text"),
}, "POST /v1/images/edits (multipart/form-data)", required=("model", "prompt", "image"))
_USAGE = obj({
    "input_tokens": integer(), "output_tokens": integer(), "total_tokens": integer(),
    "input_tokens_details": obj({"text_tokens": integer(), "image_tokens": integer()}),
    "output_tokens_details": obj({"text_tokens": integer(), "image_tokens": integer()}),
})
_SETTINGS = {"size": string(), "output_format": string(), "quality": string(), "background": string()}
IMAGES_RESPONSE = obj({
    "created": integer(),
    "data": array(obj({"b64_json": string(), "url": string(), "revised_prompt": string()})),
    **_SETTINGS, "usage": _USAGE,
}, required=("created", "data"))
IMAGE_STREAM_EVENT = obj({
    "type": string(enum=("image_generation.partial_image", "image_generation.completed", "image_edit.partial_image",
                         "image_edit.completed")),
    "b64_json": string(), "created_at": integer(), "partial_image_index": integer(), **_SETTINGS, "usage": _USAGE,
}, "One event of a streamed answer (event: <type>)", required=("type", "b64_json"))

SCHEMAS = {"ImageRequest": IMAGE_REQUEST, "ImageEditRequest": IMAGE_EDIT_REQUEST, "ImagesResponse": IMAGES_RESPONSE,
           "ImageStreamEvent": IMAGE_STREAM_EVENT}
