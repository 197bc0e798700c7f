"""The SGLang adapter against SGLang's own classes; runs in .venv-sglang only, on a CPU:

    .venv-sglang/bin/python -m pytest tests/engine_env/sglang -p no:cacheprovider -o addopts="--import-mode=importlib"

(`python -m services.launcher.engine_env sglang` creates .venv-sglang). Excluded from the main run
by pyproject's addopts (--ignore=tests/engine_env): the main environment has no sglang.

SGLang's model-config registry imports torchvision at import time (image preprocessing of
vision models). PyPI's torchvision is built against the CUDA torch and does not load against the
CPU torch of this environment, so where torchvision is not installed it is replaced by SGLang's
own stand-in module (``sglang._platform_stubs._MockModule``, what SGLang stubs missing GPU
libraries with on macOS), after Qwen2-VL's processor modules are loaded as their PIL versions (the image
and video processors' tests need them; see below). With a real torchvision (an engine image) nothing is
replaced.
"""

from __future__ import annotations

import importlib.util
import sys

TORCHVISION_MODULES = ("torchvision", "torchvision.io", "torchvision.transforms", "torchvision.transforms.functional",
                       "torchvision.transforms.v2")

if importlib.util.find_spec("torchvision") is None:
    # Qwen2-VL's processors without torchvision, for the tests that run SGLang's multimodal processor on the
    # demo vision model: the vLLM worker's PIL shim (services/workers/vllm/without_torchvision), loaded
    # before the stand-in below is in place (the shim answers only while torchvision cannot be found).
    from services.workers.vllm.media import enable_pil_processors

    enable_pil_processors({})  # this process only: no child process here loads a processor
    importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    importlib.import_module("transformers.models.qwen2_vl.processing_qwen2_vl")

    from sglang._platform_stubs import _MockModule

    for _name in TORCHVISION_MODULES:
        sys.modules[_name] = _MockModule(_name)
