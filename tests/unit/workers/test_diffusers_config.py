"""``meshfront diffusers`` flags: engine arguments passed through, card limits, and what is refused before
anything loads. No torch here: the pipelines are tested in tests/service/workers/test_diffusers_worker.py."""

from __future__ import annotations

import json

import pytest

from services.workers.config import ConfigError
from services.workers.diffusers.config import parse_config
from services.workers.diffusers.engine import preview_steps

pytestmark = pytest.mark.unit


@pytest.fixture
def model_dir(tmp_path):
    """What the config reads of a diffusers directory: its tokenizer's model_max_length."""
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 77}))
    return tmp_path


def parse(model_dir, *flags: str):
    return parse_config(["--model-dir", str(model_dir), "--no-register", *flags], env={})


def test_engine_arguments_pass_through_and_the_context_is_the_tokenizers(model_dir):
    cfg = parse(model_dir, "--task", "text-to-video", "--device", "cuda:1", "--dtype", "bfloat16",
                "--enable-model-cpu-offload", "--pipeline-kwargs", '{"strength": 0.6, "eta": 0.0}')
    assert (cfg.task, cfg.device, cfg.dtype, cfg.enable_model_cpu_offload) == ("text-to-video", "cuda:1",
                                                                               "bfloat16", True)
    assert cfg.pipeline_kwargs == {"strength": 0.6, "eta": 0.0}
    assert cfg.worker.kind == "diffusers" and cfg.worker.context_length == 77
    assert cfg.jobs.max_running == 1


def test_env_twins_set_the_engine_arguments(model_dir):
    cfg = parse_config(["--model-dir", str(model_dir)], env={"MESHFRONT_DIFFUSERS_DTYPE": "float16",
                                                             "MESHFRONT_DIFFUSERS_MAX_FRAMES": "24"})
    assert (cfg.dtype, cfg.max_frames) == ("float16", 24)


@pytest.mark.parametrize(("flags", "message"), [
    (("--pipeline-kwargs", "{strength: 1}"), "--pipeline-kwargs is not JSON"),
    (("--pipeline-kwargs", "[1]"), "--pipeline-kwargs must be a JSON object"),
    (("--pipeline-kwargs", '{"num_inference_steps": 4, "generator": 1}'),
     "--pipeline-kwargs may not set generator, num_inference_steps"),
    (("--max-running-jobs", "2"), "--max-running-jobs must be 1"),
    (("--default-steps", "50", "--max-steps", "40"), "--default-steps is above --max-steps"),
    (("--max-n", "0"), "--max-n must be at least 1"),
    (("--default-fps", "0"), "--default-fps must be positive"),
    (("--max-width", "-8"), "--max-width must be >= 0"),
    (("--device", "cpu", "--enable-model-cpu-offload"), "--enable-model-cpu-offload moves models"),
])
def test_bad_values_are_refused_before_anything_loads(model_dir, flags, message):
    with pytest.raises(ConfigError, match=message):
        parse(model_dir, *flags)


def test_a_directory_that_does_not_say_its_prompt_length_needs_context_length(tmp_path):
    with pytest.raises(ConfigError, match="give --context-length"):
        parse(tmp_path)
    assert parse(tmp_path, "--context-length", "256").worker.context_length == 256


@pytest.mark.parametrize(("total", "partials", "expected"), [
    (2, 0, {}),
    (2, 1, {0: 0}),
    (2, 3, {0: 0, 1: 1}),  # fewer steps than previews: one per step
    (30, 3, {7: 0, 14: 1, 22: 2}),
    (30, 1, {14: 0}),
])
def test_previews_are_spread_over_the_steps(total, partials, expected):
    assert preview_steps(total, partials) == expected
