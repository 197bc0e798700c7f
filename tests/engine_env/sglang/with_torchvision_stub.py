"""Runs a program in .venv-sglang with SGLang's stand-in for torchvision (conftest.py explains it), in its
child processes as well: SGLang's diffusion runtime imports torchvision-dependent modules in its scheduler
processes too, which start with multiprocessing's spawn and re-import this module as their main, so the
stand-in is installed here at import.

    python with_torchvision_stub.py meshfront COMMAND [FLAGS]   # the CLI, as `meshfront` runs it
    python with_torchvision_stub.py SCRIPT [ARGS]               # SCRIPT's main(ARGS): tools/gpu_media_check.py

(The script is imported, not run as ``__main__``: this module must stay the main one that spawn re-imports.)
"""

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
    if sys.argv[1] == "meshfront":
        from services.cli import main

        main(sys.argv[2:])
    else:
        spec = importlib.util.spec_from_file_location(Path(sys.argv[1]).stem, sys.argv[1])
        assert spec is not None and spec.loader is not None, sys.argv[1]
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        sys.exit(script.main(sys.argv[2:]))
