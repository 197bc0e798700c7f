"""Preprocessor flags and their env twins."""

from __future__ import annotations

import pytest

from services.preprocessor.config import PreprocessorConfig, parse_config

pytestmark = pytest.mark.unit


def test_defaults():
    assert parse_config([], {}) == PreprocessorConfig()


def test_flags_win_over_env():
    env = {"MESHFRONT_PREPROCESSOR_PORT": "9300", "MESHFRONT_NATS_URL": "nats://n:4222",
           "MESHFRONT_PREPROCESSOR_OFFLOAD_THRESHOLD": "100"}
    cfg = parse_config(["--port", "9400"], env)
    assert (cfg.port, cfg.nats_url, cfg.offload_threshold) == (9400, "nats://n:4222", 100)


def test_invalid_values_fail_at_startup():
    with pytest.raises(ValueError, match="port"):
        parse_config(["--port", "70000"], {})


def test_media_flags_and_env_twins():
    from services.preprocessor.media.limits import MediaLimits

    assert parse_config([], {}).media == MediaLimits() and not MediaLimits().allow_private
    cfg = parse_config(["--media-max-bytes", "1000", "--media-max-items", "3", "--media-fetch-timeout-s", "2.5",
                        "--media-max-redirects", "0", "--media-uuid-cache-bytes", "0", "--media-uuid-ttl-s", "60",
                        "--media-max-audio-s", "12.5"],
                       {"MESHFRONT_PREPROCESSOR_MEDIA_ALLOW_PRIVATE_URLS": "true",
                        "MESHFRONT_PREPROCESSOR_MEDIA_UUID_STORE_BYTES": "4096"})
    assert cfg.media == MediaLimits(max_bytes=1000, max_items=3, timeout_s=2.5, max_redirects=0, allow_private=True,
                                    uuid_cache_bytes=0, uuid_store_bytes=4096, uuid_ttl_s=60.0, max_audio_s=12.5)
    for bad in (["--media-max-bytes", "0"], ["--media-fetch-timeout-s", "0"], ["--media-max-redirects", "-1"],
                ["--media-uuid-store-bytes", "-1"], ["--media-uuid-ttl-s", "0"], ["--media-max-audio-s", "0"]):
        with pytest.raises(ValueError, match="--media-"):
            parse_config(bad, {})
