"""The engine environments: pins shared with the mesh, a cached base named by its inputs, a layer per checkout."""

from __future__ import annotations

import dataclasses
import subprocess

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


def test_the_base_is_named_by_every_input_and_not_by_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_env, "CACHE", tmp_path / "cache")
    step = engine_env.Step("s", ("{pip}", "install", "a==1"))
    env = engine_env.EngineEnv("x", tmp_path / "a" / "venv", (step,), "json")
    other_clone = dataclasses.replace(env, venv=tmp_path / "b" / "venv")
    assert env.base == other_clone.base and env.base.parent == tmp_path / "cache"
    changed = dataclasses.replace(env, steps=(engine_env.Step("s", ("{pip}", "install", "a==2")),))
    assert changed.base != env.base
    pins = tmp_path / "pins.txt"
    pins.write_text("a==1\n")
    pinned = dataclasses.replace(env, inputs=(pins,))
    before = pinned.base
    pins.write_text("a==2\n")
    assert pinned.base != before


def _marker_env(tmp_path, venv, log) -> engine_env.EngineEnv:
    """An environment whose one step writes a module and a console script into its base (as pip would) and
    counts its runs in ``log``."""
    write = ("import pathlib, sys; base = pathlib.Path(sys.argv[1]); "
             "(base / 'lib' / f'python{sys.version_info[0]}.{sys.version_info[1]}' / 'site-packages' / "
             "'marker_mod.py').write_text('X = 1'); "
             "script = base / 'bin' / 'where'; "
             "script.write_text(f'#!{base}/bin/python\\nimport sys, marker_mod; print(sys.executable)\\n'); "
             "script.chmod(0o755); "
             "open(sys.argv[2], 'a').write('built\\n')")
    return engine_env.EngineEnv("x", venv, (engine_env.Step("writing the marker", (
        "{python}", "-c", write, "{base}", str(log))),), "marker_mod", inputs=())


def test_a_base_is_built_once_and_every_checkout_layers_itself_on_it(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_env, "CACHE", tmp_path / "cache")
    log = tmp_path / "builds.log"
    first = _marker_env(tmp_path, tmp_path / "clone-a" / ".venv-x", log)
    second = dataclasses.replace(first, venv=tmp_path / "clone-b" / ".venv-x")
    (first.base / "lib").mkdir(parents=True)  # a build that died half-way (no stamp): built again, from scratch
    lines: list[str] = []
    python = engine_env.ensure_env(first, say=lines.append)
    assert first.is_ready() and not second.is_ready()
    assert engine_env.ensure_env(second, say=lines.append) == second.python
    assert log.read_text() == "built\n"  # the second checkout reused the base
    # The checkout's python sees the base's packages and this checkout, and installs nothing of its own.
    out = subprocess.run([str(python), "-c", "import marker_mod, services; print(marker_mod.X, services.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", str(engine_env.ROOT / "services" / "__init__.py")]
    assert not (first.venv / "bin" / "pip").exists()
    # The base's Python commands run on the layer's interpreter.
    where = subprocess.run([str(first.venv / "bin" / "where")], capture_output=True, text=True, check=True).stdout
    assert where.strip() == str(python)
    assert (first.venv / engine_env.BASE_LINK).resolve() == first.base


def test_a_failed_step_names_itself_and_shows_its_output(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_env, "CACHE", tmp_path / "cache")
    env = engine_env.EngineEnv("x", tmp_path / "venv", (engine_env.Step("failing on purpose", (
        "{python}", "-c", "import sys; print('the reason'); sys.exit(3)")),), "json", inputs=())
    lines: list[str] = []
    with pytest.raises(engine_env.EngineEnvError, match=r"(?s)failing on purpose failed \(exit 3\).*the reason"):
        engine_env.ensure_env(env, say=lines.append)
    assert not env.is_ready() and any("creating the virtual environment" in line for line in lines)


def test_engine_workers_run_from_their_environment(demo_model_dir, tmp_path):
    plan = ephemeral_plan([WorkerSpec(str(demo_model_dir), "m", "vllm", ("--max-model-len", "64"))],
                          run_dir=tmp_path)
    worker = next(s for s in specs(plan) if s.name == "vllm-0")
    assert worker.argv[:3] == [str(engine_env.ENGINES["vllm"].python), "-m", "services.workers.vllm"]
    assert worker.argv[-4:-2] == ["--max-model-len", "64"] or "--max-model-len" in worker.argv
