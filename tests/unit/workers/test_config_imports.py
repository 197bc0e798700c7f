"""A worker that never names a Hugging Face model does not pay for importing huggingface_hub."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_the_worker_config_does_not_import_huggingface_hub():
    code = ("import sys, services.workers.config, services.common.hub; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'huggingface_hub'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
