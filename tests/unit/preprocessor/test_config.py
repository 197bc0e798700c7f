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
