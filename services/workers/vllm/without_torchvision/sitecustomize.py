"""Qwen2-VL's image and video processing in vLLM's CPU build, which has no torchvision (imported by every process).

The engine environment cannot hold torchvision: PyPI's wheels are built against CUDA torch and fail to
load next to the CPU one (services/launcher/engine_env.py removes them). transformers 5 still ships
Qwen2-VL's PIL image processor (``Qwen2VLImageProcessorPil``), but two imports stand in the way of
vLLM serving a Qwen2-VL model without torchvision:

- vLLM's model module imports ``smart_resize`` from ``image_processing_qwen2_vl``, the torchvision
  processor's module, which imports torchvision at its top; and
- ``Qwen2VLProcessor`` loads a video processor, and every one needs torchvision.

When torchvision is missing, this module answers those two imports: ``image_processing_qwen2_vl`` is
the PIL module's contents (its ``Qwen2VLImageProcessor`` is the PIL class, which computes the same
pixels and grid), and ``processing_qwen2_vl.Qwen2VLProcessor`` is the real class with
``PilQwen2VLVideoProcessor`` as its video processor: each frame goes through the PIL image processor and
consecutive frames are joined into temporal patches as transformers' video processor joins them (the
same grid; the pixels differ from torchvision's resize only by PIL's resampling), configured as
transformers configures it (``video_preprocessor_config.json``, else ``preprocessor_config.json``). It
takes the frames it is given and samples none (the Meshfront worker sends the sampled frames). With
torchvision installed it does nothing.

It must run in each of vLLM's processes (its model-registry probe and engine core are fresh
interpreters), so it is a ``sitecustomize`` module: the vLLM worker puts this directory on
PYTHONPATH (``services.workers.vllm.vision.enable_pil_processors``) before importing vLLM, and the
processes it starts inherit it. It imports nothing of Meshfront's: those processes may not have it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys

_PACKAGE = "transformers.models.qwen2_vl"
_IMAGE = f"{_PACKAGE}.image_processing_qwen2_vl"
_PROCESSOR = f"{_PACKAGE}.processing_qwen2_vl"
VIDEO_PRECONFIG = "video_preprocessor_config.json"


class PilQwen2VLVideoProcessor:
    """Qwen2-VL's video processing on the PIL image processor, for a caller that has sampled the frames.

    transformers' ``Qwen2VLVideoProcessor`` resizes with torchvision; this one runs each frame through
    ``Qwen2VLImageProcessorPil`` with a temporal patch of 1 (the same resize, rescale and normalisation as
    an image) and then joins ``temporal_patch_size`` consecutive frames into each patch, in the layout
    transformers' ``patchify`` gives: rows (t, h/merge, w/merge, merge, merge), columns (channel, t, 14,
    14). A clip whose frame count is not a multiple of the temporal patch repeats its last frame, as
    transformers does. It does not sample frames (``do_sample_frames``): vLLM is given the frames to use.
    """

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, **config):
        pil = importlib.import_module(f"{_PACKAGE}.image_processing_pil_qwen2_vl")
        self._frames = pil.Qwen2VLImageProcessorPil(**config)
        self.size = self._frames.size
        self.patch_size = self._frames.patch_size
        self.merge_size = self._frames.merge_size
        self.temporal_patch_size = self._frames.temporal_patch_size

    @property
    def valid_kwargs(self):
        from transformers.processing_utils import VideosKwargs

        return VideosKwargs

    def __call__(self, videos=None, return_tensors=None, do_sample_frames=None, video_metadata=None,
                 return_metadata=False, **kwargs):
        import numpy as np
        from transformers.feature_extraction_utils import BatchFeature
        from transformers.video_utils import make_batched_videos

        if do_sample_frames:
            raise ValueError("this video processor does not sample frames: pass the frames to use")
        if videos is None:
            raise ValueError("no videos to process")
        for sampling in ("fps", "num_frames"):  # they only mean something when sampling
            kwargs.pop(sampling, None)
        tps = self.temporal_patch_size
        channels = 3
        patches, grids = [], []
        for video in make_batched_videos(videos):
            frames = list(np.asarray(video))
            frames += frames[-1:] * (-len(frames) % tps)
            out = self._frames(images=frames, temporal_patch_size=1, return_tensors="np", **kwargs)
            _, grid_h, grid_w = (int(v) for v in out["image_grid_thw"][0])
            per_frame = out["pixel_values"].reshape(len(frames) // tps, tps, grid_h * grid_w, channels,
                                                     self.patch_size, self.patch_size)
            joined = per_frame.transpose(0, 2, 3, 1, 4, 5)  # (t, rows, channel, tps, 14, 14)
            patches.append(joined.reshape(-1, channels * tps * self.patch_size * self.patch_size))
            grids.append([len(frames) // tps, grid_h, grid_w])
        data = {"pixel_values_videos": np.concatenate(patches), "video_grid_thw": np.array(grids, dtype=np.int64)}
        return BatchFeature(data=data, tensor_type=return_tensors)


class PilQwen2VLFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the two torchvision-bound Qwen2-VL modules while torchvision is not importable."""

    def find_spec(self, name, path, target=None):
        if name not in (_IMAGE, _PROCESSOR) or importlib.util.find_spec("torchvision") is not None:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        if module.__name__ == _IMAGE:
            pil = importlib.import_module(f"{_PACKAGE}.image_processing_pil_qwen2_vl")
            module.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
            module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
        else:
            real = _load_real_processor_module()
            module.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
            module.Qwen2VLProcessor = _without_video(real.Qwen2VLProcessor)


def _load_real_processor_module():
    """transformers' own processing_qwen2_vl, loaded under another name (ours answers the real one)."""
    package = sys.modules[_PACKAGE]
    name = f"{_PROCESSOR}_with_video"
    spec = importlib.util.spec_from_file_location(name, f"{package.__path__[0]}/processing_qwen2_vl.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot find {_PROCESSOR}'s source")
    real = importlib.util.module_from_spec(spec)
    real.__package__ = _PACKAGE
    sys.modules[name] = real  # inspect.getsource (vLLM's registry) looks classes up by module
    spec.loader.exec_module(real)
    return real


def _without_video(processor_cls: type) -> type:
    class Qwen2VLProcessor(processor_cls):
        @classmethod
        def get_attributes(cls):
            return [a for a in super().get_attributes() if a != "video_processor"]

        # An explicit signature: transformers reads __init__'s argument names to route the saved config.
        def __init__(self, image_processor=None, tokenizer=None, video_processor=None, chat_template=None,
                     **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
            self._video_config: dict | None = None

        @classmethod
        def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
            processor = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
            processor._video_config = _video_config(pretrained_model_name_or_path, kwargs)
            return processor

        # A property, not an attribute: the processor's to_dict serialises its attributes.
        @property
        def video_processor(self):
            cached = self.__dict__.get("_pil_video_processor")
            if cached is None:
                config = self.__dict__.get("_video_config") or _config_of(self.image_processor)
                cached = self.__dict__["_pil_video_processor"] = PilQwen2VLVideoProcessor(**config)
            return cached

    Qwen2VLProcessor.__module__ = _PROCESSOR
    Qwen2VLProcessor.__qualname__ = "Qwen2VLProcessor"
    return Qwen2VLProcessor


_IMAGE_CONFIG_KEYS = ("size", "patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std",
                      "do_resize", "do_rescale", "rescale_factor", "do_normalize", "do_convert_rgb", "resample")


def _config_of(image_processor) -> dict:
    """Without a video_preprocessor_config.json, transformers configures the video processor from
    preprocessor_config.json, as it does the image processor: the image processor's settings."""
    return {k: getattr(image_processor, k) for k in _IMAGE_CONFIG_KEYS if hasattr(image_processor, k)}


def _video_config(model, kwargs) -> dict | None:
    """The model's video_preprocessor_config.json (None without one), as transformers would read it."""
    import json

    from transformers.utils.hub import cached_file

    path = cached_file(model, VIDEO_PRECONFIG, revision=kwargs.get("revision"),
                       _raise_exceptions_for_missing_entries=False)
    if path is None:
        return None
    with open(path) as f:
        config = json.load(f)
    for key in ("video_processor_type", "processor_class", "do_sample_frames", "fps", "num_frames", "min_frames",
                "max_frames"):
        config.pop(key, None)
    return config


def install() -> None:
    """Puts the finder first on sys.meta_path, once per process."""
    if not any(type(f).__name__ == PilQwen2VLFinder.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, PilQwen2VLFinder())


install()
