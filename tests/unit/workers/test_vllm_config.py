"""`meshfront vllm` flags: Meshfront's own, the rest passed to vLLM untouched (no vllm import here)."""

from __future__ import annotations

import sys

import pytest

from services.workers.config import ConfigError
from services.workers.vllm.config import parse_config

pytestmark = pytest.mark.unit


def test_engine_flags_pass_through_in_order_and_ours_are_taken(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--tensor-parallel-size", "2", "--port", "7",
                        "--max-model-len=2048", "--enable-prefix-caching", "--model-name", "m",
                        "--block-size", "32"], env={})
    assert cfg.engine_argv == ("--tensor-parallel-size", "2", "--max-model-len=2048", "--enable-prefix-caching",
                               "--block-size", "32")
    assert cfg.args.port == 7 and cfg.model_name == "m"
    worker = cfg.worker(context_length=2048, block_size=32)
    assert (worker.kind, worker.context_length, worker.block_size) == ("vllm", 2048, 32)
    assert "vllm" not in sys.modules  # parsing stays cheap; the engine is imported when it starts


def test_one_worker_id_names_the_card_and_the_event_endpoints(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir)], env={})
    worker_id = cfg.worker(context_length=1, block_size=1).worker_id
    assert worker_id.startswith("vllm-") and worker_id in cfg.kv_events_endpoint
    assert cfg.kv_events_endpoint.startswith("ipc://") and cfg.kv_replay_endpoint != cfg.kv_events_endpoint
    assert parse_config(["--model-dir", str(demo_model_dir), "--no-register"], env={}).kv_events_endpoint == ""


@pytest.mark.parametrize("flag", ["--served-model-name", "--kv-events-config"])
def test_flags_the_worker_owns_are_refused_with_the_replacement(demo_model_dir, flag):
    with pytest.raises(ConfigError, match=f"{flag} is set by the worker"):
        parse_config(["--model-dir", str(demo_model_dir), f"{flag}=x"], env={})


def test_every_problem_is_reported_together(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse_config(["--model-dir", str(tmp_path / "missing"), "--served-model-name", "x", "--port", "99999"], env={})
    assert len(err.value.errors) == 3, err.value.errors


def test_no_kv_events_keeps_the_worker_id_and_asks_the_engine_for_no_events(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--no-kv-events"], env={})
    worker = cfg.worker(context_length=1, block_size=1)
    assert worker.worker_id.startswith("vllm-") and not worker.kv_events and worker.register
    assert (cfg.kv_events_endpoint, cfg.kv_replay_endpoint) == ("", "")
    assert parse_config(["--model-dir", str(demo_model_dir)], env={}).worker(context_length=1, block_size=1).kv_events
