"""vLLM-Omni 0.30.0's own classes for the vLLM-Omni adapter's checks; runs in .venv-vllm, on a CPU:

    .venv-vllm/bin/python -m pytest tests/engine_env/vllm_omni -o addopts="--import-mode=importlib"

vLLM-Omni 0.30.0 cannot be installed with the vLLM 0.32 of .venv-vllm (it pins transformers < 5.15 and needs
vLLM 0.30; pip finds no resolution), and a separate vLLM 0.30 environment would add minutes and gigabytes to
every CI run for a worker that only runs on GPUs. So its wheel is unpacked beside .venv-vllm without
dependencies (services/launcher/engine_env.py, ``VLLM_OMNI_SOURCE``) and put on the path here only.

Its package ``__init__`` applies patches to vLLM 0.30's internals (``vllm_omni/patch.py``) and loads its
whole engine, which fails against 0.32 (``vllm.v1.outputs.RoutedExpertsLists`` is gone): the package is
entered without running it, so its request and output modules import on their own, against the vLLM here.
What cannot import that way (``AsyncOmni``: its engine) is checked from its source text.
"""

from __future__ import annotations

import sys
import types

from services.launcher.engine_env import VLLM_OMNI_SOURCE

PACKAGE = VLLM_OMNI_SOURCE / "vllm_omni"
if not PACKAGE.is_dir():
    raise RuntimeError(f"{PACKAGE} is missing: `python -m services.launcher.engine_env vllm` unpacks it")
sys.path.insert(0, str(VLLM_OMNI_SOURCE))
# vllm_omni.entrypoints.openai's __init__ loads its whole HTTP server (vLLM 0.30's chat utilities): entered
# the same way, so that its stage_params module, which the adapter uses, imports on its own.
for _name, _path in {"vllm_omni": PACKAGE, "vllm_omni.entrypoints.openai": PACKAGE / "entrypoints" / "openai"}.items():
    _package = types.ModuleType(_name)
    _package.__path__ = [str(_path)]
    sys.modules[_name] = _package
