"""tools/gpu_media_check.py in .venv-sglang, on a CPU: SGLang's diffusion runtime loads torchvision-dependent
modules in its scheduler processes too, which start with multiprocessing's spawn and re-import this module
as their main: so the stand-in for torchvision (conftest.py explains it) is installed here, at import, for
them as well. Started by test_sglang_diffusion_cpu.py as ``python run_diffusion_check.py --engine ...``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TORCHVISION_MODULES = ("torchvision", "torchvision.io", "torchvision.transforms", "torchvision.transforms.functional",
                       "torchvision.transforms.v2")

if importlib.util.find_spec("torchvision") is None:
    from sglang._platform_stubs import _MockModule

    for _name in TORCHVISION_MODULES:
        sys.modules[_name] = _MockModule(_name)

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
    import gpu_media_check

    sys.exit(gpu_media_check.main())
