"""SMG 1.13 (the Shepherd Model Gateway, a Rust router in a Python process) as a peer of ``python -m bench engine``.

Issue 38 item 5 and issue 40 item 4 put Meshfront over a stock engine's gRPC next to SMG routing the very same
``vllm serve --grpc`` engine in gRPC mode (SMG renders, tokenizes and detokenizes; the engine's servicer turns
its token-in Generate calls into vLLM requests). SMG comes from PyPI into its own environment, built on first use
and kept (``~/.cache/meshfront/smg-<version>``, outside the tree: nothing of it is committed) until its pins
change, as bench/dynamo_peer.py does for Dynamo.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

SMG = "smg==1.13.0"
VENV = pathlib.Path.home() / ".cache" / "meshfront" / "smg-1.13.0"
STAMP = ".meshfront-smg"


def python() -> pathlib.Path:
    return VENV / "bin" / "python"


def ensure_venv() -> pathlib.Path:
    """Creates the environment unless its stamp says it holds ``SMG``; returns its python."""
    stamp = VENV / STAMP
    if stamp.is_file() and stamp.read_text() == SMG:
        return python()
    print(f"building {VENV} ({SMG}; about a minute)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python()), "-m", "pip", "install", "-q", SMG], check=True)
    subprocess.run([str(python()), "-c", "import smg.launch_router"], check=True)
    stamp.write_text(SMG)
    return python()


def router_argv(smg_python: pathlib.Path, engines: list[str], model_dir: str, port: int,
                prometheus_port: int) -> list[str]:
    """``smg launch`` in gRPC mode over ``engines`` (``host:port``), round-robin as the meshes route in the bench,
    loopback only, logs at warn. ``model_dir`` is where SMG loads the tokenizer and chat template from. The
    passthrough reasoning parser, because SMG picks Qwen's by the model's name otherwise and streams every token as
    ``reasoning_content`` (no TTFT for the load generator, and parsing work the other shapes do not do)."""
    return [str(smg_python), "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *(f"grpc://{e}" for e in engines), "--model-path", model_dir,
            "--policy", "round_robin", "--reasoning-parser", "passthrough", "--log-level", "warn",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]
