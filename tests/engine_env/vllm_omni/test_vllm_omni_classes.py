"""The vLLM-Omni adapter (services/workers/vllm_omni) against vLLM-Omni 0.30.0's own classes and source, on a
CPU (no model, no GPU; see conftest.py for how its package is entered beside vLLM 0.32):

- the sampling kwargs build vLLM-Omni's ``OmniDiffusionSamplingParams`` (its ``__post_init__`` runs), field by
  field, and vLLM-Omni's own ``build_stage_sampling_params_list`` puts them on the diffusion stage;
- the prompt is an ``OmniTextPrompt`` (every key one it declares) with the ``multi_modal_data`` keys
  vLLM-Omni's own image server sends for edits and masks;
- ``OmniRequestOutput`` carries ``images`` and ``error``, what the engine reads;
- ``AsyncOmni.generate`` / ``abort`` / ``shutdown`` take what the engine passes (read from their source:
  ``AsyncOmni`` needs its engine, which needs vLLM 0.30).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from PIL import Image
from vllm_omni.entrypoints.openai.stage_params import build_stage_sampling_params_list
from vllm_omni.inputs.data import OmniDiffusionSamplingParams, OmniTextPrompt
from vllm_omni.outputs import OmniRequestOutput

from services.launcher.engine_env import VLLM_OMNI_SOURCE
from services.workers.media.engine import MediaJob
from services.workers.vllm_omni.request import omni_prompt, output_frames, sampling_kwargs

SOURCE = VLLM_OMNI_SOURCE / "vllm_omni"
IMAGE = MediaJob(kind="image", prompt="a red fox", negative_prompt="", width=64, height=48, n=2, steps=4,
                 guidance_scale=None, seed=11, input_image=None, mask=None, num_frames=0, fps=0.0, partial_images=0)
EDIT = dataclasses.replace(IMAGE, negative_prompt="fog", input_image=Image.new("RGB", (64, 48)),
                           mask=Image.new("RGBA", (64, 48)))
VIDEO = MediaJob(kind="video", prompt="waves", negative_prompt="blur", width=64, height=48, n=1, steps=2,
                 guidance_scale=6.0, seed=2**40, input_image=Image.new("RGB", (64, 48)), mask=None, num_frames=9,
                 fps=12.5, partial_images=0)


@pytest.mark.parametrize("job", [IMAGE, EDIT, VIDEO], ids=["image", "edit", "video"])
def test_the_kwargs_build_vllm_omnis_diffusion_sampling_params_field_by_field(job):
    kwargs = sampling_kwargs(job, 1)
    assert set(kwargs) <= {f.name for f in dataclasses.fields(OmniDiffusionSamplingParams)}
    params = OmniDiffusionSamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value, name
    assert params.seed == job.seed + 1 and params.batch_size == 1


def test_unset_knobs_stay_none_so_the_pipeline_picks_its_default():
    params = OmniDiffusionSamplingParams(**sampling_kwargs(IMAGE, 0))
    assert params.guidance_scale is None and params.guidance_scale_provided is False
    assert params.fps is None and params.num_frames == 1
    video = OmniDiffusionSamplingParams(**sampling_kwargs(VIDEO, 0))
    assert video.resolved_frame_rate == 12.5 and video.guidance_scale == 6.0


def test_vllm_omnis_stage_builder_puts_the_params_on_the_diffusion_stage():
    params = OmniDiffusionSamplingParams(**sampling_kwargs(VIDEO, 0))
    stages = build_stage_sampling_params_list([{"stage_type": "diffusion"}], [OmniDiffusionSamplingParams()],
                                              diffusion_params=params, replace_diffusion_params=True)
    assert len(stages) == 1 and stages[0] is not params  # a clone, as vLLM-Omni's server sends
    assert (stages[0].seed, stages[0].num_frames, stages[0].width) == (2**40, 9, 64)


@pytest.mark.parametrize("job", [IMAGE, EDIT, VIDEO], ids=["image", "edit", "video"])
def test_the_prompt_is_an_omni_text_prompt(job):
    prompt = omni_prompt(job)
    assert set(prompt) <= OmniTextPrompt.__required_keys__ | OmniTextPrompt.__optional_keys__
    assert OmniTextPrompt.__required_keys__ <= set(prompt)


def test_input_images_ride_under_the_keys_vllm_omnis_own_servers_use():
    api_server = (SOURCE / "entrypoints" / "openai" / "api_server.py").read_text()
    assert 'omni_prompt["multi_modal_data"]["image"] = pil_images' in api_server
    assert 'omni_prompt["multi_modal_data"]["mask_image"]' in api_server
    assert 'multi_modal_data["image"] = input_image' in (SOURCE / "entrypoints/openai/serving_video.py").read_text()
    assert set(omni_prompt(EDIT)["multi_modal_data"]) == {"image", "mask_image"}


def test_request_outputs_carry_what_the_engine_reads():
    fields = {f.name for f in dataclasses.fields(OmniRequestOutput)}
    assert {"images", "error"} <= fields
    out = OmniRequestOutput(request_id="r", images=[Image.new("RGB", (64, 48), (9, 9, 9))], final_output_type="image")
    assert out.error is None
    assert output_frames(list(out.images), IMAGE)[0].getpixel((0, 0)) == (9, 9, 9)


def _method(path: Path, cls: str, name: str) -> ast.AsyncFunctionDef | ast.FunctionDef:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} is not in {path}")


def _params(fn: ast.AsyncFunctionDef | ast.FunctionDef) -> set[str]:
    args = fn.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def test_async_omni_takes_what_the_engine_passes():
    async_omni = SOURCE / "entrypoints" / "async_omni.py"
    generate = _method(async_omni, "AsyncOmni", "generate")
    assert isinstance(generate, ast.AsyncFunctionDef)
    assert {"prompt", "request_id", "sampling_params_list"} <= _params(generate)
    abort = _method(async_omni, "AsyncOmni", "abort")
    assert isinstance(abort, ast.AsyncFunctionDef) and "request_id" in _params(abort)
    base = SOURCE / "entrypoints" / "omni_base.py"
    assert "model" in _params(_method(base, "OmniBase", "__init__"))
    _method(base, "OmniBase", "shutdown")
    source = base.read_text()
    assert "self.default_sampling_params_list =" in source
    assert "def stage_configs" in source or "self.stage_configs =" in source
    init = (SOURCE / "__init__.py").read_text()
    assert 'if name == "AsyncOmni":' in init  # `from vllm_omni import AsyncOmni`, as the worker imports it
