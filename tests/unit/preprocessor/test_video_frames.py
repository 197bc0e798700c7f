"""Video frame sampling (services/common/video_frames.py) and the video token counts placement derives from it."""

from __future__ import annotations

import json

import pytest

from services.common import video_frames
from services.models import qwen_vl
from services.preprocessor.media import decode, placement
from tests.media_samples import mp4

pytestmark = pytest.mark.unit

PADS = {"image": 151655, "video": 151656}


@pytest.mark.parametrize(("frames", "duration_s", "sampled"), [
    (300, 10.0, 20),  # 2 a second
    (90, 3.0, 6),
    (30, 1.0, 4),  # at least 4 ...
    (3, 10.0, 2),  # ... but never more than the clip has, in whole temporal patches
    (1, 0.5, 2),  # one frame fills one temporal patch (repeated)
    (60_000, 2000.0, 768),  # at most 768
    (7, 0.0, 6),  # no duration: every frame, in whole patches
])
def test_sampled_count_follows_qwen_vl_utils(frames, duration_s, sampled):
    assert video_frames.sampled_count(frames, duration_s) == sampled


def test_sampled_indices_spread_from_first_to_last():
    assert video_frames.sampled_indices(10, 4) == [0, 3, 6, 9]
    assert video_frames.sampled_indices(1, 2) == [0, 0]
    assert video_frames.sampled_indices(300, 20)[-1] == 299


def test_decode_sampled_keeps_the_sampled_frames_in_order():
    clip = mp4(64, 48, frames=10, fps=2)  # 5 s: 10 frames sampled of 10
    frames = video_frames.decode_sampled(clip)
    assert frames.shape == (10, 48, 64, 3) and frames.dtype.name == "uint8"
    long_clip = mp4(32, 32, frames=40, fps=20)  # 2 s: 4 frames sampled, at 0, 13, 26 and 39
    sampled = video_frames.decode_sampled(long_clip)
    assert sampled.shape == (4, 32, 32, 3)
    # mp4() paints frame i with red i * 40 % 256: the kept frames are the sampled ones (within codec loss).
    reds = [int(f[..., 0].mean()) for f in sampled]
    assert all(abs(r - i * 40 % 256) < 12 for r, i in zip(reds, [0, 13, 26, 39], strict=True)), reds


def test_decode_video_counts_what_the_worker_samples_by():
    clip = mp4(64, 48, frames=10, fps=2)
    info = decode.decode_video(clip)
    assert (info.frames, info.duration_s) == (10, 5.0)
    assert len(video_frames.decode_sampled(clip)) == video_frames.sampled_count(info.frames, info.duration_s)


def test_a_video_too_large_to_hold_decoded_is_refused(monkeypatch):
    monkeypatch.setattr(decode, "MAX_SAMPLED_VIDEO_BYTES", 4 * 64 * 48 * 3 - 1)
    with pytest.raises(decode.DecodeRefused, match="4 sampled frames of 64x48 pixels come to more than"):
        decode.decode_video(mp4(64, 48, frames=4, fps=2))


def test_video_bounds_follow_transformers_config_fallback(tmp_path, artifacts):
    spec = placement.load_spec(str(tmp_path), artifacts.tokenizer)  # no configs: Qwen2VLVideoProcessor's defaults
    assert (spec.video_min_pixels, spec.video_max_pixels) == (128 * 28 * 28, 768 * 28 * 28)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(qwen_vl.preprocessor_config()))
    spec = placement.load_spec(str(tmp_path), artifacts.tokenizer)  # no video config: the image processor's
    assert (spec.video_min_pixels, spec.video_max_pixels) == (qwen_vl.MIN_PIXELS, qwen_vl.MAX_PIXELS)
    (tmp_path / "video_preprocessor_config.json").write_text('{"size": {"shortest_edge": 1000, "longest_edge": 9000}}')
    spec = placement.load_spec(str(tmp_path), artifacts.tokenizer)
    assert (spec.video_min_pixels, spec.video_max_pixels) == (1000, 9000)
    assert (spec.min_pixels, spec.max_pixels) == (qwen_vl.MIN_PIXELS, qwen_vl.MAX_PIXELS)


def test_demo_model_video_token_count_is_the_engines():
    # vLLM 0.32 with the demo model gives a 4-frame 56x56 clip 8 tokens (2 temporal patches of 2x2 merged tiles);
    # tests/engine_env/vllm/test_vllm_video.py checks the same against the running engine.
    spec = placement.VisionSpec(min_pixels=qwen_vl.MIN_PIXELS, max_pixels=qwen_vl.MAX_PIXELS,
                                video_min_pixels=qwen_vl.MIN_PIXELS, video_max_pixels=qwen_vl.MAX_PIXELS,
                                placeholder_ids=PADS)
    assert placement.video_tokens(56, 56, 4, 2.0, spec) == 8
    assert placement.video_tokens(640, 480, 300, 10.0, spec) == 10 * 6 * 9  # 20 frames; the 224x224 bound: 168x252
