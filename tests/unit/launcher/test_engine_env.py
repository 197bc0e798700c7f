"""The engine environments: pins shared with the mesh, a stamp that notices changed inputs."""

from __future__ import annotations

import pytest

from services.launcher import engine_env
from services.launcher.plan import WorkerSpec, ephemeral_plan, specs

pytestmark = pytest.mark.unit


def pins(path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.lower().replace("_", "-")] = version
    return out


def test_worker_dependencies_are_pinned_as_in_the_mesh_lock():
    worker = pins(engine_env.REQUIREMENTS / "engine-worker.txt")
    lock = pins(engine_env.REQUIREMENTS / "lock.txt")
    assert worker and {name: lock.get(name) for name in worker} == worker


def test_the_stamp_records_every_input(tmp_path, monkeypatch):
    env = engine_env.EngineEnv("x", tmp_path / "venv", (engine_env.Step("s", ("{pip}", "install", "a==1")),), "json")
    (tmp_path / "venv").mkdir()
    assert not env.is_ready()
    env.stamp.write_text(env.inputs_hash())
    assert env.is_ready()
    changed = engine_env.EngineEnv("x", env.venv, (engine_env.Step("s", ("{pip}", "install", "a==2")),), "json")
    assert not changed.is_ready()


def test_a_failed_step_names_itself_and_shows_its_output(tmp_path):
    env = engine_env.EngineEnv("x", tmp_path / "venv", (engine_env.Step("failing on purpose", (
        "{python}", "-c", "import sys; print('the reason'); sys.exit(3)")),), "json")
    lines = []
    with pytest.raises(engine_env.EngineEnvError, match=r"(?s)failing on purpose failed \(exit 3\).*the reason"):
        engine_env.ensure_env(env, say=lines.append)
    assert not env.is_ready() and any("creating the virtual environment" in line for line in lines)


def test_engine_workers_run_from_their_environment(demo_model_dir, tmp_path):
    plan = ephemeral_plan([WorkerSpec(str(demo_model_dir), "m", "vllm", ("--max-model-len", "64"))],
                          run_dir=tmp_path)
    worker = next(s for s in specs(plan) if s.name == "vllm-0")
    assert worker.argv[:3] == [str(engine_env.ENGINES["vllm"].python), "-m", "services.workers.vllm"]
    assert worker.argv[-4:-2] == ["--max-model-len", "64"] or "--max-model-len" in worker.argv
