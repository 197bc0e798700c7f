"""A frontend without the model directory: the worker's files reach the preprocessor and postprocessor through
NATS (services/common/model_files.py). The worker runs in a mount namespace of its own, its model directory on a
tmpfs that no other process sees, as a worker on another host or in another pod would."""

from __future__ import annotations

import os
import shlex
import shutil
import sys

import httpx
import pytest

from services.common.model_files import model_files_digest
from services.launcher.plan import ProcessSpec, free_port
from tests.conftest import IN_CI, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(240)]

ELSEWHERE = "test/elsewhere"


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    """Where the frontends fetch model files to (XDG_CACHE_HOME of every process of this mesh)."""
    root = tmp_path_factory.mktemp("xdg-cache")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root)
    yield root
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(scope="module")
def fmesh(tmp_path_factory, cache_root, demo_model_dir, envoy_bin, nats_bin):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        message = "a private mount namespace needs unshare(1) and root"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO)])
    yield m
    stop_cleanly(m)


def test_a_model_whose_directory_only_its_worker_sees(fmesh, cache_root, demo_model_dir, tmp_path):
    mount = tmp_path / "models"  # empty here; a tmpfs holding the model inside the worker's namespace
    mount.mkdir()
    model_dir = mount / "qwen"
    port = free_port()
    worker = [sys.executable, "-m", "services.workers.mocker", "--port", str(port), "--model-dir", str(model_dir),
              "--model-name", ELSEWHERE, "--nats-url", fmesh.plan.nats_url, "--speedup-ratio", "200"]
    script = (f"mount -t tmpfs tmpfs {shlex.quote(str(mount))} && cp -r {shlex.quote(str(demo_model_dir))} "
              f"{shlex.quote(str(model_dir))} && exec {shlex.join(worker)}")
    fmesh.start_process(ProcessSpec("mocker-elsewhere", ["unshare", "--mount", "--propagation", "private",
                                                         "sh", "-c", script], port))

    def served() -> bool:
        r = httpx.get(f"{fmesh.url}/v1/models", timeout=5)
        return r.status_code == 200 and ELSEWHERE in {m["id"] for m in r.json()["data"]}

    wait_until(served, 60, f"{ELSEWHERE} to be served")
    assert not (model_dir / "tokenizer.json").exists()  # out here the directory is not there
    r = httpx.post(f"{fmesh.url}/v1/chat/completions", timeout=30,
                   json={"model": ELSEWHERE, "messages": [{"role": "user", "content": "hello there"}],
                         "max_tokens": 8, "logprobs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] > 3 and body["choices"][0]["message"]["content"]
    # The preprocessor and the postprocessor each fetched the files once, whole, into their cache.
    digest = model_files_digest(demo_model_dir)
    fetched = cache_root / "meshfront" / "model-files" / digest
    assert (fetched / "tokenizer.json").read_bytes() == (demo_model_dir / "tokenizer.json").read_bytes()
    assert model_files_digest(fetched) == digest
