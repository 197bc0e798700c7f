"""Models named by Hugging Face id, resolved through huggingface_hub against a hub-compatible file server on a
loopback port (tests/hf_server.py): the download, revisions, the cache and offline mode, and what a worker and
`meshfront run` make of the flags."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from services.common.hub import ModelNotResolved, resolve_model
from services.launcher import run as launcher
from services.workers.config import ConfigError
from services.workers.mocker.config import parse_config
from tests.hf_server import HubServer

pytestmark = pytest.mark.service

REPO = "acme/tiny-qwen"
MAIN, V1 = "1" * 40, "2" * 40


@pytest.fixture
def hub(demo_model_dir, tmp_path, monkeypatch):
    with HubServer(REPO, demo_model_dir, {"main": MAIN, "v1": V1}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)  # read when a model is resolved (services/common/hub.py)
        yield server


def test_an_id_downloads_its_files_once_into_the_cache(hub, demo_model_dir, tmp_path):
    cache = str(tmp_path / "hf")
    path = resolve_model(REPO, "v1", cache_dir=cache)
    assert path.endswith(f"snapshots/{V1}") and path.startswith(cache)
    assert (pathlib.Path(path) / "tokenizer.json").read_bytes() == (demo_model_dir / "tokenizer.json").read_bytes()
    assert f"GET /api/models/{REPO}/revision/v1" in hub.requests
    downloads = [r for r in hub.requests if r.startswith("GET /" + REPO)]
    assert resolve_model(REPO, "v1", cache_dir=cache) == path
    assert [r for r in hub.requests if r.startswith("GET /" + REPO)] == downloads  # the cache answered
    assert resolve_model(REPO, cache_dir=cache).endswith(f"snapshots/{MAIN}")  # default branch


def test_offline_mode_reads_the_cache_and_asks_nothing(hub, tmp_path):
    home = tmp_path / "hf-home"
    env = {**os.environ, "HF_HOME": str(home)}
    code = f"from services.common.hub import resolve_model; print(resolve_model({REPO!r}, 'v1'))"
    online = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert online.returncode == 0, online.stderr
    asked = len(hub.requests)
    offline = subprocess.run([sys.executable, "-c", code], env={**env, "HF_HUB_OFFLINE": "1"},
                             capture_output=True, text=True, timeout=120)
    assert offline.returncode == 0 and offline.stdout == online.stdout, offline.stderr
    assert len(hub.requests) == asked
    missing = subprocess.run([sys.executable, "-c", code.replace("'v1'", "'main'")],
                             env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "HF_HUB_OFFLINE is set and it is not in the cache" in missing.stderr


def test_unknown_models_and_revisions_say_so(hub, tmp_path):
    with pytest.raises(ModelNotResolved, match="is not on the hub or needs a token"):
        resolve_model("acme/nothing", cache_dir=str(tmp_path))
    with pytest.raises(ModelNotResolved, match="has no revision 'v9'"):
        resolve_model(REPO, "v9", cache_dir=str(tmp_path))
    with pytest.raises(ModelNotResolved, match="not a Hugging Face id"):
        resolve_model("../etc", cache_dir=str(tmp_path))


def test_a_worker_serves_an_id_under_that_name(hub, tmp_path, monkeypatch, demo_model_dir):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    cfg = parse_config(["--model", REPO, "--revision", "v1", "--no-register"])
    assert cfg.worker.model_name == REPO and cfg.worker.model_dir.endswith(f"snapshots/{V1}")
    assert cfg.worker.context_length > 0  # read from the downloaded config.json
    with pytest.raises(ConfigError, match="give one"):
        parse_config(["--model", REPO, "--model-dir", str(demo_model_dir)])
    with pytest.raises(ConfigError, match="--revision needs --model"):
        parse_config(["--model-dir", str(demo_model_dir), "--revision", "v1"])


def test_meshfront_run_resolves_once_and_names_the_model(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    args = launcher.parse_args(["--model", REPO, "--revision", "v1"])
    assert launcher._model_dir(args).endswith(f"snapshots/{V1}")
    assert launcher.main(["--model", REPO, "--model-dir", "/x"]) == 1
