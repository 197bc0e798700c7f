"""Qwen2-VL's image processing in vLLM's CPU build, which has no torchvision (imported by every process).

The engine environment cannot hold torchvision: PyPI's wheels are built against CUDA torch and fail to
load next to the CPU one (services/launcher/engine_env.py removes them). transformers 5 still ships
Qwen2-VL's PIL image processor (``Qwen2VLImageProcessorPil``), but two imports stand in the way of
vLLM serving a Qwen2-VL model without torchvision:

- vLLM's model module imports ``smart_resize`` from ``image_processing_qwen2_vl``, the torchvision
  processor's module, which imports torchvision at its top; and
- ``Qwen2VLProcessor`` loads a video processor, and every one needs torchvision.

When torchvision is missing, this module answers those two imports: ``image_processing_qwen2_vl`` is
the PIL module's contents (its ``Qwen2VLImageProcessor`` is the PIL class, which computes the same
pixels and grid), and ``processing_qwen2_vl.Qwen2VLProcessor`` is the real class less its video
processor; a video refuses with a message that says why. With torchvision installed it does nothing.

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
NO_VIDEO = ("video input needs torchvision, which this vLLM environment cannot hold (its wheels need CUDA "
            "torch): serve this model with --limit-mm-per-prompt '{\"video\": 0}'")


class _NoVideoProcessor:
    """Stands in for the video processor: vLLM reads its kwargs at start; processing a video refuses."""

    merge_size = 2

    @property
    def valid_kwargs(self):
        from transformers.processing_utils import VideosKwargs

        return VideosKwargs

    def __call__(self, *args, **kwargs):
        raise ValueError(NO_VIDEO)


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

        # A property, not an attribute: the processor's to_dict serialises its attributes.
        video_processor = property(lambda self: _NoVideoProcessor())

    Qwen2VLProcessor.__module__ = _PROCESSOR
    Qwen2VLProcessor.__qualname__ = "Qwen2VLProcessor"
    return Qwen2VLProcessor


def install() -> None:
    """Puts the finder first on sys.meta_path, once per process."""
    if not any(type(f).__name__ == PilQwen2VLFinder.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, PilQwen2VLFinder())


install()
