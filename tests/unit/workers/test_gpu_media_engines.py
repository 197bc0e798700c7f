"""The GPU media adapters' pure parts (services/workers/sglang_diffusion, vllm_omni) and their worker commands,
in the main environment (no SGLang, no vLLM-Omni, no GPU).

- the MediaJob -> request mapping, field by field, and the engines' outputs -> PIL frames;
- the engine loops against stand-ins of ``DiffGenerator`` and ``AsyncOmni`` that behave as their sources
  read (tests/engine_env check the names against the engines' real classes): one request per output with
  seed + i, progress after each output, a cancel honoured between outputs (SGLang) or within a poll
  (vLLM-Omni, through its abort);
- ``meshfront sglang-diffusion`` / ``meshfront vllm-omni`` end with one line and status 1 without the engine
  or a GPU, and refuse bad flags with status 2.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.workers.config import ConfigError
from services.workers.entry import Unavailable
from services.workers.gpu_media import parse_config, require
from services.workers.media.engine import MediaJob, Output, StepDone
from services.workers.sglang_diffusion import request as sglang_request
from services.workers.sglang_diffusion.engine import SglangDiffusionEngine
from services.workers.vllm_omni import request as omni_request
from services.workers.vllm_omni.engine import VllmOmniEngine

pytestmark = pytest.mark.unit

IMAGE = MediaJob(kind="image", prompt="a red fox", negative_prompt="", width=64, height=32, n=2, steps=3,
                 guidance_scale=None, seed=41, input_image=None, mask=None, num_frames=0, fps=0.0, partial_images=0)
VIDEO = MediaJob(kind="video", prompt="waves", negative_prompt="blur", width=48, height=32, n=1, steps=2,
                 guidance_scale=5.5, seed=7, input_image=Image.new("RGB", (48, 32), "blue"), mask=None,
                 num_frames=5, fps=12.5, partial_images=0)


# -- SGLang: request mapping ---------------------------------------------------------------------------------

def test_sglang_image_kwargs_name_only_what_the_job_sets():
    kwargs = sglang_request.sampling_kwargs(IMAGE, 1, None)
    assert kwargs == {"prompt": "a red fox", "width": 64, "height": 32, "num_inference_steps": 3, "seed": 42,
                      "num_outputs_per_prompt": 1, "save_output": False, "return_file_paths_only": False,
                      "return_frames": True, "num_frames": 1}  # no guidance, no negative prompt: the model's


def test_sglang_video_kwargs_carry_frames_fps_guidance_negative_prompt_and_the_image_path():
    kwargs = sglang_request.sampling_kwargs(VIDEO, 0, "/tmp/x.png")
    assert (kwargs["num_frames"], kwargs["fps"], kwargs["guidance_scale"]) == (5, 12, 5.5)
    assert (kwargs["negative_prompt"], kwargs["image_path"], kwargs["seed"]) == ("blur", "/tmp/x.png", 7)


def test_sglang_frames_become_pil_and_extra_frames_are_cut():
    frames = [np.full((32, 48, 3), i * 30, dtype=np.uint8) for i in range(8)]  # SGLang rounded 5 up to 8
    pil = sglang_request.output_frames(frames, VIDEO)
    assert [f.size for f in pil] == [(48, 32)] * 5
    assert [f.getpixel((0, 0)) for f in pil] == [(i * 30,) * 3 for i in range(5)]
    with pytest.raises(RuntimeError, match="made 4 frames where 5"):
        sglang_request.output_frames(frames[:4], VIDEO)
    with pytest.raises(RuntimeError, match="HWC uint8"):
        sglang_request.output_frames([np.zeros((32, 48, 3), dtype=np.float32)], IMAGE)


# -- SGLang: the engine loop ---------------------------------------------------------------------------------

class FakeDiffGenerator:
    """Answers as DiffGenerator.generate does for one prompt and one output: a result with ``frames``."""

    class Result:
        def __init__(self, frames):
            self.frames = frames

    def __init__(self, on_call=None):
        self.calls: list[dict] = []
        self.on_call = on_call
        self.shut = False

    def generate(self, sampling_params_kwargs=None):
        self.calls.append(dict(sampling_params_kwargs))
        if "image_path" in sampling_params_kwargs:
            self.calls[-1]["image_size"] = Image.open(sampling_params_kwargs["image_path"]).size
        if self.on_call:
            self.on_call(len(self.calls))
        n = sampling_params_kwargs["num_frames"]
        shade = sampling_params_kwargs["seed"] % 256
        frame = np.full((sampling_params_kwargs["height"], sampling_params_kwargs["width"], 3), shade, np.uint8)
        return self.Result([frame] * n)

    def shutdown(self):
        self.shut = True


def sglang_engine(generator) -> SglangDiffusionEngine:
    return SglangDiffusionEngine(generator, MediaLimits(), count=lambda prompt: len(prompt.split()))


def test_sglang_engine_makes_one_request_per_output_with_seed_plus_index():
    generator = FakeDiffGenerator()
    events = list(sglang_engine(generator).generate(IMAGE, threading.Event()))
    assert [c["seed"] for c in generator.calls] == [41, 42]
    assert [type(e) for e in events] == [StepDone, Output, StepDone, Output]
    assert [(e.step, e.total_steps) for e in events if isinstance(e, StepDone)] == [(3, 6), (6, 6)]
    outputs = [e for e in events if isinstance(e, Output)]
    assert [o.index for o in outputs] == [0, 1]
    assert [o.frames[0].getpixel((0, 0)) for o in outputs] == [(41,) * 3, (42,) * 3]


def test_sglang_engine_hands_the_input_image_over_as_a_file_and_removes_it():
    generator = FakeDiffGenerator()
    list(sglang_engine(generator).generate(VIDEO, threading.Event()))
    path = generator.calls[0]["image_path"]
    assert generator.calls[0]["image_size"] == (48, 32)
    assert not os.path.exists(path)


def test_sglang_engine_stops_between_outputs_once_cancelled():
    cancelled = threading.Event()
    generator = FakeDiffGenerator(on_call=lambda n: cancelled.set())  # the client leaves during output 0
    events = list(sglang_engine(generator).generate(IMAGE, cancelled))
    assert len(generator.calls) == 1 and events == []  # output 0 finished in SGLang, but nothing more


def test_sglang_engine_refuses_a_mask_it_cannot_use():
    job = MediaJob(**{**IMAGE.__dict__, "input_image": Image.new("RGB", (64, 32)), "mask": Image.new("L", (64, 32))})
    with pytest.raises(InvalidRequest, match="mask"):
        list(sglang_engine(FakeDiffGenerator()).generate(job, threading.Event()))


def test_sglang_engine_reports_a_failed_generation():
    class Failing(FakeDiffGenerator):
        def generate(self, sampling_params_kwargs=None):
            return None  # DiffGenerator logs the error and returns None

    with pytest.raises(RuntimeError, match="generated nothing"):
        list(sglang_engine(Failing()).generate(IMAGE, threading.Event()))


# -- vLLM-Omni: request mapping ------------------------------------------------------------------------------

def test_omni_prompt_and_params_follow_vllm_omnis_own_server():
    assert omni_request.omni_prompt(IMAGE) == {"prompt": "a red fox", "modalities": ["image"]}
    assert omni_request.sampling_kwargs(IMAGE, 1) == {"num_outputs_per_prompt": 1, "seed": 42, "width": 64,
                                                      "height": 32, "num_inference_steps": 3}
    edit = MediaJob(**{**IMAGE.__dict__, "input_image": Image.new("RGB", (8, 8)), "mask": Image.new("L", (8, 8)),
                       "negative_prompt": "fog"})
    prompt = omni_request.omni_prompt(edit)
    assert prompt["negative_prompt"] == "fog"
    assert set(prompt["multi_modal_data"]) == {"image", "mask_image"}
    video = omni_request.sampling_kwargs(VIDEO, 0)
    assert (video["num_frames"], video["fps"], video["frame_rate"], video["guidance_scale"]) == (5, 12.5, 12.5, 5.5)


@pytest.mark.parametrize("payload", [
    "fhwc_float01", "cfhw_signed", "fchw_uint8", "batched", "pil_list", "array_list",
])
def test_omni_video_payloads_become_the_clips_frames(payload):
    ramp = np.stack([np.full((32, 48, 3), i / 10, np.float32) for i in range(6)])  # (F, H, W, C) in [0, 1]
    shapes = {
        "fhwc_float01": [ramp],
        "cfhw_signed": [np.transpose(ramp * 2 - 1, (3, 0, 1, 2))],
        "fchw_uint8": [np.transpose((ramp * 255).round().astype(np.uint8), (0, 3, 1, 2))],
        "batched": [ramp[None]],
        "pil_list": [Image.fromarray((f * 255).round().astype(np.uint8)) for f in ramp],
        "array_list": list(ramp),
    }
    frames = omni_request.output_frames(shapes[payload], VIDEO)
    assert [f.size for f in frames] == [(48, 32)] * 5
    reds = [f.getpixel((0, 0))[0] for f in frames]
    assert all(abs(red - i / 10 * 255) <= 1 for i, red in enumerate(reds)), reds  # [-1, 1] rounds either way


def test_omni_outputs_of_the_wrong_count_are_errors():
    with pytest.raises(RuntimeError, match="2 images for one output"):
        omni_request.output_frames([Image.new("RGB", (4, 4))] * 2, IMAGE)
    with pytest.raises(RuntimeError, match="2 videos"):
        omni_request.output_frames([np.zeros((2, 5, 4, 4, 3), np.float32)], VIDEO)


# -- vLLM-Omni: the engine loop ------------------------------------------------------------------------------

class FakeAsyncOmni:
    """AsyncOmni's generate/abort as its source reads: an async generator of OmniRequestOutput-like outputs."""

    class Out:
        def __init__(self, images):
            self.images, self.error = images, None

    def __init__(self, step_s: float = 0.0, steps: int = 1):
        self.requests: list[tuple] = []
        self.aborted: list[str] = []
        self.step_s, self.steps = step_s, steps
        self.stopped_at: list[int] = []

    async def generate(self, prompt, request_id="", *, sampling_params_list=None):
        self.requests.append((prompt, request_id, sampling_params_list))
        for step in range(self.steps):
            if request_id in self.aborted:
                self.stopped_at.append(step)
                return
            await asyncio.sleep(self.step_s)
        seed = sampling_params_list["seed"]
        yield self.Out([Image.new("RGB", (64, 32), (seed % 256,) * 3)])

    async def abort(self, request_id):
        self.aborted.append(request_id)

    def shutdown(self):
        pass


@pytest.fixture
def omni_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def omni_engine(omni, loop) -> VllmOmniEngine:
    return VllmOmniEngine(omni, loop, MediaLimits(), count=lambda p: 0,
                          params=lambda job, index: omni_request.sampling_kwargs(job, index))


def test_omni_engine_makes_one_request_per_output_with_seed_plus_index(omni_loop):
    omni = FakeAsyncOmni()
    events = list(omni_engine(omni, omni_loop).generate(IMAGE, threading.Event()))
    assert [r[2]["seed"] for r in omni.requests] == [41, 42]
    assert len({r[1] for r in omni.requests}) == 2  # a request id each
    outputs = [e for e in events if isinstance(e, Output)]
    assert [o.frames[0].getpixel((0, 0)) for o in outputs] == [(41,) * 3, (42,) * 3]
    assert [(e.step, e.total_steps) for e in events if isinstance(e, StepDone)] == [(3, 6), (6, 6)]


def test_omni_engine_aborts_the_running_request_within_a_poll_of_a_cancel(omni_loop):
    omni = FakeAsyncOmni(step_s=0.02, steps=500)  # 10 s if nothing stopped it
    cancelled = threading.Event()
    threading.Timer(0.2, cancelled.set).start()
    started = time.monotonic()
    events = list(omni_engine(omni, omni_loop).generate(IMAGE, cancelled))
    assert time.monotonic() - started < 1.0
    assert events == []
    assert omni.aborted == [omni.requests[0][1]] and len(omni.requests) == 1


def test_omni_engine_reports_a_request_error(omni_loop):
    class Failing(FakeAsyncOmni):
        async def generate(self, prompt, request_id="", *, sampling_params_list=None):
            out = self.Out([])
            out.error = "CUDA out of memory"
            yield out

    with pytest.raises(RuntimeError, match="vLLM-Omni: CUDA out of memory"):
        list(omni_engine(Failing(), omni_loop).generate(IMAGE, threading.Event()))


# -- flags and the commands ----------------------------------------------------------------------------------

def test_flags_build_the_cards_limits(tmp_path):
    cfg = parse_config("vllm-omni", "", ["--model-dir", str(tmp_path), "--media", "video", "--max-size", "1280x720",
                                         "--default-size", "640x368", "--default-frames", "33", "--takes-image",
                                         "--engine-args", '{"vae_use_slicing": true}'], env={}, owned={})
    limits = cfg.limits
    assert (limits.max_width, limits.max_height, limits.default_width, limits.default_height) == (1280, 720, 640, 368)
    assert (limits.default_frames, limits.max_frames, limits.default_fps, limits.takes_image) == (33, 129, 16.0, True)
    assert limits.output_formats == ("mp4", "mjpeg")
    assert cfg.engine_args == {"vae_use_slicing": True}
    assert cfg.worker.kind == "vllm-omni"


def test_bad_flags_are_listed_together(tmp_path):
    with pytest.raises(ConfigError) as raised:
        parse_config("sglang-diffusion", "", ["--model-dir", str(tmp_path / "none"), "--engine-args",
                                              '{"model_path": "x"}', "--default-size", "100x100"],
                     env={}, owned={"model_path": "--model-dir"})
    assert raised.value.errors == ["--media is required: image or video",
                                   f"--model-dir {str(tmp_path / 'none')!r} is not a directory",
                                   "--engine-args: 'model_path' is set by the worker; use --model-dir"]


@pytest.mark.parametrize(("command", "engine"), [("sglang-diffusion", "SGLang's diffusion serving"),
                                                 ("vllm-omni", "vLLM-Omni")])
def test_the_commands_end_with_one_line_without_their_engine(command, engine, tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from services.cli import main; main()", command,
                           "--model-dir", str(tmp_path), "--media", "image"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"{command}: {engine} is not installed in this environment (")


def test_an_installed_engine_without_a_gpu_is_unavailable():
    assert not torch.cuda.is_available()  # this machine and CI: CPU only
    with pytest.raises(Unavailable, match="runs on NVIDIA GPUs only and none is visible here"):
        require("json", "An engine", "")  # a package that is there


def test_an_engine_whose_entry_point_does_not_import_names_the_missing_module():
    with pytest.raises(Unavailable, match=r"An engine does not import in this environment: No module named "
                                          r"'json.no_such_part' \(its extra\)"):
        require("json", "An engine", "its extra", entry_module="json.no_such_part")
