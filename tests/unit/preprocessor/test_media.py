"""Media decoding, Qwen2-VL token counts, placeholder expansion and uuid reuse (no sockets)."""

from __future__ import annotations

import base64

import pytest
from meshfront.common.v1 import common_pb2

from services.common.errors import InvalidRequest
from services.preprocessor.media import decode, placement
from services.preprocessor.media.limits import MediaLimits
from services.preprocessor.media.resolve import MediaResolver, content_hash
from tests.media_samples import data_url, mp4, png, wav

pytestmark = pytest.mark.unit

SPEC = placement.VisionSpec(placeholder_ids={"image": 151655, "video": 151656})


@pytest.mark.parametrize(("w", "h", "tokens"), [
    (56, 56, 4), (224, 224, 64), (28, 28, 4),  # 28 x 28 is below min_pixels (3136): scaled up to 56 x 56
    (640, 480, 23 * 17), (3000, 10, None),
])
def test_qwen2_vl_image_token_counts(w, h, tokens):
    if tokens is None:
        with pytest.raises(ValueError, match="aspect ratio"):
            placement.image_tokens(w, h, SPEC)
    else:
        assert placement.image_tokens(w, h, SPEC) == tokens


def test_max_pixels_bounds_a_large_image():
    spec = placement.VisionSpec(max_pixels=1280 * 28 * 28)
    assert placement.image_tokens(4000, 3000, spec) <= 1280
    h, w = placement.smart_resize(3000, 4000, 28, spec.min_pixels, spec.max_pixels)
    assert h % 28 == 0 and w % 28 == 0 and abs(w / h - 4 / 3) < 0.05


def test_spec_reads_preprocessor_config(tmp_path, artifacts):
    (tmp_path / "preprocessor_config.json").write_text('{"min_pixels": 100, "max_pixels": 200000, "patch_size": 16}')
    spec = placement.load_spec(str(tmp_path), artifacts.tokenizer)
    assert (spec.min_pixels, spec.max_pixels, spec.factor) == (100, 200000, 32)
    assert spec.placeholder_ids == {"image": 151655, "video": 151656}
    assert placement.load_spec(str(tmp_path / "none"), artifacts.tokenizer).max_pixels == 12845056


def test_expand_places_each_item_at_its_placeholder():
    ids = [1, 151655, 2, 151656, 3, 151655]
    out, placed = placement.expand(ids, [("image", 3), ("audio", 0), ("video", 2), ("image", 1)],
                                   placement.VisionSpec(placeholder_ids={"image": 151655, "video": 151656}))
    assert out == [1, 151655, 151655, 151655, 2, 151656, 151656, 3, 151655]
    assert placed == [placement.Placed(1, 3), placement.Placed(0, 0), placement.Placed(5, 2), placement.Placed(8, 1)]


def test_expand_refuses_placeholders_that_do_not_match_the_parts():
    with pytest.raises(InvalidRequest, match="fewer image placeholders"):
        placement.expand([1, 2], [("image", 3)], SPEC)
    with pytest.raises(InvalidRequest, match="more media placeholders"):
        placement.expand([151655, 151655], [("image", 3)], SPEC)
    with pytest.raises(InvalidRequest, match="do not match"):
        placement.expand([151656, 151655], [("image", 3)], SPEC)


def test_decode_proves_an_image():
    info = decode.decode_image(png(30, 20))
    assert (info.mime_type, info.width, info.height) == ("image/png", 30, 20)
    for bad in (b"\x89PNG\r\n\x1a\n" + bytes(32), b"hello", png(30, 20)[:-40]):
        with pytest.raises(decode.DecodeRefused):
            decode.decode_image(bad)


def test_decode_proves_a_video():
    info = decode.decode_video(mp4(64, 48, frames=4, fps=2))
    assert (info.mime_type, info.width, info.height, info.frames) == ("video/mp4", 64, 48, 4)
    assert placement.video_tokens(info.width, info.height, info.frames, info.duration_s, SPEC) > 0
    with pytest.raises(decode.DecodeRefused, match="still image, not a video"):
        decode.decode_video(png())
    with pytest.raises(decode.DecodeRefused, match="not a video"):
        decode.decode_video(b"plain text")


def test_data_url_size_is_checked_before_decoding():
    raw = png()
    assert decode.data_url_payload(data_url(raw), len(raw)) == raw
    with pytest.raises(decode.DecodeRefused, match="larger than the 100-byte limit"):
        decode.data_url_payload(data_url(raw), 100)


def item(**kw) -> common_pb2.MediaItem:
    return common_pb2.MediaItem(modality=kw.pop("modality", "image"), message_index=0, part_index=kw.pop("part", 0),
                                **kw)


async def test_uuid_reuse_within_and_across_requests():
    resolver = MediaResolver(MediaLimits())
    cat = png(56, 56, seed=3)
    first = await resolver.resolve([item(url=data_url(cat), uuid="cat"), item(uuid="cat", part=1)])
    assert first[0].content == first[1].content == cat and first[0].content_hash == content_hash(cat)
    later = await resolver.resolve([item(uuid="cat")])  # another request
    assert later[0].content_hash == content_hash(cat)
    with pytest.raises(InvalidRequest, match=r"content\[0\].uuid': no image was sent with uuid 'dog'"):
        await resolver.resolve([item(uuid="dog")])
    with pytest.raises(InvalidRequest, match="names a image, not a video"):
        await resolver.resolve([item(uuid="cat", modality="video")])
    await resolver.close()


async def test_uuid_cache_is_bounded_in_bytes():
    a, b = png(56, 56, seed=4), png(56, 56, seed=5)
    resolver = MediaResolver(MediaLimits(uuid_cache_bytes=len(a) + len(b) - 1))
    await resolver.resolve([item(url=data_url(a), uuid="a")])
    await resolver.resolve([item(url=data_url(b), uuid="b")])  # evicts a
    assert (await resolver.resolve([item(uuid="b")]))[0].content == b
    with pytest.raises(InvalidRequest, match="uuid 'a'"):
        await resolver.resolve([item(uuid="a")])
    await resolver.close()


async def test_inline_limits_and_non_images_are_400s():
    resolver = MediaResolver(MediaLimits(max_bytes=2000, max_items=2))
    with pytest.raises(InvalidRequest, match="3 media parts; the limit is 2"):
        await resolver.resolve([item(uuid="x")] * 3)
    with pytest.raises(InvalidRequest, match=r"image_url.url': its data is larger than the 2000-byte limit"):
        await resolver.resolve([item(url=data_url(png(200, 200, seed=9)))])
    with pytest.raises(InvalidRequest, match=r"image_url.url': it is not an image"):
        await resolver.resolve([item(url=data_url(b"plain text, not pixels"))])
    small = png(20, 20, seed=1)
    together = MediaResolver(MediaLimits(max_total_bytes=len(small) * 2 - 1))
    with pytest.raises(InvalidRequest, match=f"more than {len(small) * 2 - 1} bytes together"):
        await together.resolve([item(url=data_url(small)), item(url=data_url(small) + "")])
    await together.close()
    clip = wav(0.1, rate=8000, channels=1)  # 1.6 kB: within the 2000-byte bound
    audio = await resolver.resolve([item(modality="audio", data=base64.b64encode(clip).decode(), format="wav")])
    assert audio[0].content == clip and audio[0].info.mime_type == "audio/wav" and audio[0].info.samples == 1600
    await resolver.close()


# --- the preprocessor end to end: placed tokens, salted hashes, what the worker receives ---

async def test_the_preprocessor_places_images_and_salts_their_blocks(demo_model_dir):
    import json

    from meshfront.preprocessor.v1 import preprocessor_pb2

    from services.common.discovery import ModelCard
    from services.common.hashing import block_hashes
    from services.preprocessor.core.artifacts import ArtifactCache
    from services.preprocessor.service import Preprocessor

    card = ModelCard(name="demo", model_dir=str(demo_model_dir), input_modalities=("image",))
    pre = Preprocessor({"demo": card}.get, ArtifactCache())

    async def run(raw: bytes | None):
        content = [{"type": "text", "text": "describe " * 20}]
        media = []
        if raw is not None:
            content.insert(0, {"type": "image_url", "image_url": {"url": data_url(raw)}})
            media = [item(url=data_url(raw))]
        req = preprocessor_pb2.PreprocessRequest(
            request=common_pb2.PreprocessedRequest(request_id="r", model="demo", media=media),
            messages_json=json.dumps([{"role": "user", "content": content}]))
        return await pre.preprocess(req)

    text = await run(None)
    a, a_again, b = await run(png(224, 224, seed=1)), await run(png(224, 224, seed=1)), await run(png(224, 224, 2))
    assert len(a.request.token_ids) == len(b.request.token_ids) == len(text.request.token_ids) + 64 + 3
    assert list(text.block_hashes) == block_hashes(list(text.request.token_ids), 16)  # text: unchanged
    assert list(a.block_hashes) == list(a_again.block_hashes)
    assert list(a.request.token_ids) == list(b.request.token_ids)  # the same placeholder ids...
    assert a.block_hashes[0] != b.block_hashes[0]  # ...told apart by the content hash salt
    sent = a.request.media[0]
    assert sent.content == png(224, 224, seed=1) and sent.mime_type == "image/png" and sent.url == ""
    assert sent.content_hash == content_hash(sent.content) and (sent.width, sent.height) == (224, 224)
    assert sent.token_count == 64 and set(a.request.token_ids[sent.token_offset:sent.token_offset + 64]) == {151655}
    await pre.media.close()
