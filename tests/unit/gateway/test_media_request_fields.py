"""The fields the Images and Videos APIs share are read one way: the same input gets the same 400 from both."""

from __future__ import annotations

import base64

import orjson
import pytest

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.gateway.images import request as images
from services.gateway.media import video_spec
from services.gateway.videos import request as videos

pytestmark = pytest.mark.unit

LIMITS = MediaLimits(max_width=512, max_height=512, size_multiple=16, default_width=256, default_height=256,
                     max_n=1, default_steps=4, max_steps=20, output_formats=("png", "mp4"), default_fps=8.0,
                     max_frames=48, default_frames=16, takes_image=False)
GIF = "data:image/gif;base64," + base64.b64encode(b"GIF89a\x01\x00\x01\x00").decode()


def both(**body) -> list[InvalidRequest]:
    """The 400 each front end gives ``body`` (parsed, then checked against LIMITS)."""
    out = []
    for parse, resolve in ((images.parse_generation, lambda r: images.resolve(r, LIMITS, "r")),
                           (videos.parse_sync, lambda r: video_spec.resolve(r, LIMITS))):
        with pytest.raises(InvalidRequest) as e:
            resolve(parse(orjson.dumps({"model": "m", "prompt": "a cat", **body})))
        out.append(e.value)
    return out


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"prompt": "x" * 32_001}, "prompt", "'prompt' may hold at most 32000 characters"),
    ({"input_reference": "https://example.com/cat.png"}, "input_reference", "the gateway does not fetch URLs"),
    ({"input_reference": GIF}, "input_reference", "must be a PNG, JPEG or WebP image; got image/gif"),
    ({"input_reference": "not base64!"}, "input_reference", "is not valid base64"),
    ({"size": "1024x1024"}, "size", "'size' 1024x1024 is not one this model makes: width 16-512"),
    ({"size": "100x96"}, "size", "each a multiple of 16"),
    ({"size": "big"}, "size", "'size' must be WIDTHxHEIGHT"),
    ({"nvext": {"num_inference_steps": 21}}, "nvext.num_inference_steps", "must be at most 20 for this model"),
])
def test_shared_fields_are_refused_alike(body, param, says):
    errors = both(**body)
    assert [e.param for e in errors] == [param, param]
    assert errors[0].message == errors[1].message and says in errors[0].message, [e.message for e in errors]
