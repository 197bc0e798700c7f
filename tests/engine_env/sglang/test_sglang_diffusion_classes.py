"""The SGLang diffusion adapter (services/workers/sglang_diffusion) against sglang 0.5.23's own
``sglang.multimodal_gen`` classes, on a CPU (no model, no GPU): runs in .venv-sglang.

- every kwargs the mapping sends builds SGLang's ``SamplingParams`` (its own validation runs in
  ``__post_init__``), and merges over a model's defaults as ``from_user_sampling_params_args`` does: what the
  job sets wins, what it leaves out keeps the model's default (guidance, negative prompt);
- ``DiffGenerator.generate`` takes them as ``sampling_params_kwargs`` and answers ``GenerationResult``s whose
  ``frames`` SGLang fills from ``_sample_to_uint8_frames``; those frames become the job's PIL frames;
- SGLang's diffusion package has no abort (the engine's cancel granularity is one output): if a later
  SGLang adds one, this test says so.
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sglang.multimodal_gen.configs.sample.flux import FluxSamplingParams
from sglang.multimodal_gen.configs.sample.sampling_params import SamplingParams
from sglang.multimodal_gen.runtime.entrypoints.diffusion_generator import DiffGenerator
from sglang.multimodal_gen.runtime.entrypoints.utils import GenerationResult, _sample_to_uint8_frames

from services.workers.media.engine import MediaJob
from services.workers.sglang_diffusion.request import output_frames, sampling_kwargs

IMAGE = MediaJob(kind="image", prompt="a red fox", negative_prompt="", width=64, height=48, n=2, steps=4,
                 guidance_scale=None, seed=11, input_image=None, mask=None, num_frames=0, fps=0.0, partial_images=0)
VIDEO = MediaJob(kind="video", prompt="waves", negative_prompt="blur", width=64, height=48, n=1, steps=2,
                 guidance_scale=6.0, seed=2**40, input_image=Image.new("RGB", (64, 48)), mask=None, num_frames=9,
                 fps=16.0, partial_images=0)


def user_params(job: MediaJob, index: int, image_path: str | None = None) -> SamplingParams:
    """What from_user_sampling_params_args builds from the kwargs before merging: SGLang validates here."""
    return SamplingParams(**sampling_kwargs(job, index, image_path))


@pytest.mark.parametrize(("job", "path"), [(IMAGE, None), (VIDEO, "/tmp/input.png")])
def test_every_kwarg_is_a_sampling_params_field_and_passes_sglangs_validation(job, path):
    kwargs = sampling_kwargs(job, 1, path)
    assert set(kwargs) <= {f.name for f in dataclasses.fields(SamplingParams)}
    params = user_params(job, 1, path)
    for name, value in kwargs.items():
        assert getattr(params, name) == value, name


def test_the_fields_land_with_sglangs_types():
    params = user_params(VIDEO, 0, "/tmp/input.png")
    assert (params.width, params.height, params.num_inference_steps) == (64, 48, 2)
    assert (params.num_frames, params.fps, params.guidance_scale) == (9, 16, 6.0)
    assert type(params.fps) is int  # SGLang's fps field is an int
    assert (params.seed, params.num_outputs_per_prompt) == (2**40, 1)
    assert (params.negative_prompt, params.image_path, params.prompt) == ("blur", "/tmp/input.png", "waves")
    assert (params.save_output, params.return_frames, params.return_file_paths_only) == (False, True, False)


def test_merged_over_a_models_defaults_only_what_the_job_sets_wins():
    model = FluxSamplingParams()  # what SGLang resolves for a Flux model directory
    kwargs = sampling_kwargs(IMAGE, 0, None)
    model._merge_with_user_params(SamplingParams(**kwargs), explicit_fields=set(kwargs))
    assert model.guidance_scale == FluxSamplingParams.guidance_scale == 3.5  # unset: Flux's own
    assert model.negative_prompt is None  # unset: Flux's own (none), not SGLang's base-class Wan prompt
    assert (model.width, model.height, model.seed, model.num_inference_steps) == (64, 48, 11, 4)
    assert model.num_frames == 1  # an image (the data type comes from the model's pipeline config)


def test_sglangs_validation_still_rejects_what_it_would():
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(**{**sampling_kwargs(IMAGE, 0, None), "seed": -1})


def test_diff_generator_takes_the_kwargs_and_answers_generation_results_with_frames():
    signature = inspect.signature(DiffGenerator.generate)
    signature.bind(object(), sampling_params_kwargs=sampling_kwargs(IMAGE, 0, None))
    assert {f.name for f in dataclasses.fields(GenerationResult)} >= {"frames", "samples", "size"}
    assert callable(DiffGenerator.shutdown) and callable(DiffGenerator.from_pretrained)


def test_sglangs_own_frames_become_the_jobs_pil_frames():
    # A decoded video as SGLang's pipelines hand it over: (C, T, H, W) floats in [0, 1].
    sample = torch.linspace(0, 1, 3 * 12 * 48 * 64).reshape(3, 12, 48, 64)
    frames = _sample_to_uint8_frames(sample)  # 12 frames: SGLang rounded 9 up
    pil = output_frames(frames, VIDEO)
    assert len(pil) == 9 and all(f.size == (64, 48) and f.mode == "RGB" for f in pil)
    assert np.array_equal(np.asarray(pil[3]), frames[3])
    image = output_frames(_sample_to_uint8_frames(torch.rand(3, 48, 64)), IMAGE)
    assert [f.size for f in image] == [(64, 48)]


def test_sglangs_diffusion_package_has_no_abort_to_call():
    import sglang.multimodal_gen.runtime.entrypoints.control_requests as control

    names = {name.lower() for name in dir(control)} | {name.lower() for name in dir(DiffGenerator)}
    assert not any("abort" in name or "cancel" in name for name in names), sorted(names)


def test_the_worker_command_imports_sglangs_diffusion_here_and_stops_at_the_missing_gpu(tmp_path):
    # The one line a CPU machine with SGLang gets: the engine imported, no GPU (the CLI as `meshfront` runs it).
    runner = Path(__file__).with_name("with_torchvision_stub.py")
    proc = subprocess.run([sys.executable, str(runner), "meshfront", "sglang-diffusion", "--model-dir", str(tmp_path),
                           "--media", "image"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "sglang-diffusion: SGLang's diffusion serving runs on NVIDIA GPUs only and none is visible here; "
        "`meshfront diffusers` serves the same model directories on a CPU")


def test_without_the_diffusion_extras_imports_the_worker_says_what_is_missing(tmp_path):
    # No stand-in here: torchvision, which SGLang's diffusion entry point imports, is missing in this environment.
    proc = subprocess.run([sys.executable, "-c", "from services.cli import main; main()", "sglang-diffusion",
                           "--model-dir", str(tmp_path), "--media", "image"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "sglang-diffusion: SGLang's diffusion serving does not import in this environment: No module named "
        "'torchvision' (sglang==0.5.23 with its `diffusion` extra, on a GPU machine)")
