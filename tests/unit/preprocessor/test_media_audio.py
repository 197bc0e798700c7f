"""input_audio: decoded once to 16 kHz mono, bounded in length, refused with a 400 naming input_audio.data when it
is not audio of its format, and placed as Qwen2-Audio's processor places it with its blocks salted (no sockets)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from meshfront.common.v1 import common_pb2

from services.common import audio_samples
from services.common.errors import InvalidRequest
from services.models.qwen_audio import AUDIO_TOKEN_IDS, default_audio_model_dir
from services.preprocessor.media.limits import MediaLimits
from services.preprocessor.media.resolve import MediaResolver, content_hash
from tests.media_samples import mp3, png, wav

pytestmark = pytest.mark.unit

AUDIO = AUDIO_TOKEN_IDS["<|AUDIO|>"]


def part(raw: bytes, fmt: str = "wav", index: int = 0) -> common_pb2.MediaItem:
    return common_pb2.MediaItem(modality="audio", data=base64.b64encode(raw).decode(), format=fmt, message_index=0,
                                part_index=index)


@pytest.mark.parametrize(("raw", "fmt", "samples"), [
    (wav(2.5), "wav", 40000),                     # 44.1 kHz stereo: mixed to mono and resampled
    (wav(1.0, rate=16000, channels=1), "wav", 16000),  # already what the model hears
    (wav(0.3, rate=8000), "wav", 4800),
])
def test_audio_is_decoded_to_16_khz_mono(raw, fmt, samples):
    out = audio_samples.decode(raw, fmt, 16000, 30.0)
    assert out.dtype == np.float32 and out.shape == (samples,) and 0 < float(np.abs(out).max()) <= 1.0
    assert np.array_equal(out, audio_samples.decode(raw, fmt, 16000, 30.0))  # the same bytes, the same samples


def test_mp3_decodes_to_about_its_length():
    out = audio_samples.decode(mp3(2.0), "mp3", 16000, 30.0)
    assert abs(len(out) - 32000) <= 16000 * 0.1  # the encoder's padding frames, no more


async def test_what_is_not_audio_of_its_format_is_a_400_naming_input_audio_data():
    resolver = MediaResolver(MediaLimits())
    cases = [(png(20, 20), "wav", "it is not wav audio this service can decode"),
             (mp3(0.5), "wav", "it is not wav audio this service can decode"),
             (b"RIFF....WAVEfmt ", "wav", "it is not wav audio"),
             (png(20, 20), "mp3", "it is not mp3 audio")]
    for raw, fmt, why in cases:
        with pytest.raises(InvalidRequest, match=r"'messages\[0\]\.content\[1\]\.input_audio\.data': " + why) as e:
            await resolver.resolve([part(raw, fmt, index=1)])
        assert e.value.param == "messages[0].content"
    await resolver.close()


async def test_a_clip_longer_than_the_duration_limit_is_a_400():
    resolver = MediaResolver(MediaLimits(max_audio_s=2.0))
    with pytest.raises(InvalidRequest, match=r"input_audio\.data': it is longer than the 2-second limit"):
        await resolver.resolve([part(wav(2.5))])
    [ok] = await resolver.resolve([part(wav(1.5))])
    assert ok.info.samples == 24000 and ok.info.duration_s == 1.5 and ok.info.mime_type == "audio/wav"
    await resolver.close()
    assert MediaLimits(max_audio_s=0).errors() == ["--media-max-audio-s must be positive"]


async def test_the_preprocessor_places_audio_and_salts_its_blocks():
    from meshfront.preprocessor.v1 import preprocessor_pb2

    from services.common.discovery import ModelCard
    from services.common.hashing import block_hashes
    from services.preprocessor.core.artifacts import ArtifactCache
    from services.preprocessor.service import Preprocessor

    model_dir = default_audio_model_dir()
    card = ModelCard(name="audio", model_dir=str(model_dir), input_modalities=("audio",))
    pre = Preprocessor({"audio": card}.get, ArtifactCache())

    async def run(raw: bytes | None):
        content: list[dict] = [{"type": "text", "text": "describe " * 20}]
        media = []
        if raw is not None:
            content.append({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}})
            media = [part(raw, index=1)]
        req = preprocessor_pb2.PreprocessRequest(
            request=common_pb2.PreprocessedRequest(request_id="r", model="audio", media=media),
            messages_json=json.dumps([{"role": "user", "content": content}]), return_formatted_prompt=True)
        return await pre.preprocess(req)

    text = await run(None)
    a, a_again, b = await run(wav(2.0, seed=1)), await run(wav(2.0, seed=1)), await run(wav(2.0, seed=2))
    assert "<|audio_bos|><|AUDIO|><|audio_eos|>" in a.formatted_prompt  # Qwen2-Audio's marker, where the part was
    # 2 s: 200 mel frames, halved twice: 50 tokens, in place of the one placeholder, between audio_bos and eos.
    assert list(a.request.token_ids).count(AUDIO) == 50 and len(a.request.token_ids) == len(b.request.token_ids)
    sent = a.request.media[0]
    assert sent.token_count == 50 and sent.content == wav(2.0, seed=1) and sent.data == ""
    assert sent.content_hash == content_hash(sent.content) and sent.mime_type == "audio/wav"
    run_ids = list(a.request.token_ids[sent.token_offset - 1:sent.token_offset + 51])
    assert run_ids == [AUDIO_TOKEN_IDS["<|audio_bos|>"], *[AUDIO] * 50, AUDIO_TOKEN_IDS["<|audio_eos|>"]]
    assert list(text.block_hashes) == block_hashes(list(text.request.token_ids), 16)
    assert list(a.block_hashes) == list(a_again.block_hashes)
    assert list(a.request.token_ids) == list(b.request.token_ids)  # the same placeholder ids...
    first_audio_block = sent.token_offset // 16
    assert a.block_hashes[:first_audio_block] == b.block_hashes[:first_audio_block]  # the text before: shared
    assert a.block_hashes[first_audio_block] != b.block_hashes[first_audio_block]  # ...told apart by the salt
    await pre.media.close()
