"""``meshfront vllm`` flags: Meshfront's worker flags, and every other flag passed to vLLM unchanged.

Meshfront's flags are the shared worker flags (``--model-dir``, ``--model-name``, ``--worker-id``,
``--host``, ``--port``, ``--nats-url``, ``--register``, ``--tool-call-parser``, ...; env twins
``MESHFRONT_VLLM_*``). Whatever argparse does not recognise among them is parsed by vLLM's own
``AsyncEngineArgs`` parser, so a vLLM user's flags (``--tensor-parallel-size``, ``--max-model-len``,
``--block-size``, ``--gpu-memory-utilization``, ``--quantization``, ``--enable-lora``, ...) mean what
they mean in ``vllm serve``, and a misspelt one fails there, naming it. Three are Meshfront's to
set: ``--model`` (it is ``--model-dir``), ``--served-model-name`` (``--model-name``) and
``--kv-events-config`` (the worker turns KV events on itself, on a private endpoint). The
context window and block size on the worker's card are the ones the engine ends up using.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.common.flags import FlagParser
from services.workers.config import ConfigError, WorkerConfig, add_worker_flags, worker_config_from_args
from services.workers.model_dir import read_model_info

OWNED_ENGINE_FLAGS = {"--model": "--model-dir", "--served-model-name": "--model-name",
                      "--kv-events-config": "nothing (Meshfront turns KV events on itself)"}
DESCRIPTION = ("vLLM's async engine behind the worker API. Flags not listed here are vLLM engine "
               "arguments, passed through unchanged (see `vllm serve --help`).")


@dataclasses.dataclass(frozen=True)
class VllmConfig:
    args: argparse.Namespace  # the shared worker flags
    engine_argv: tuple[str, ...]  # vLLM's, as given
    # ipc:// endpoints of vLLM's KV event publisher and its replay socket (empty: no events).
    kv_events_endpoint: str = ""
    kv_replay_endpoint: str = ""

    def worker(self, *, context_length: int, block_size: int) -> WorkerConfig:
        """The worker's config with the engine's real context window and block size."""
        return worker_config_from_args(self.args, "vllm", context_length=context_length, block_size=block_size)

    def engine_args(self) -> Any:
        """vLLM's ``AsyncEngineArgs`` (imports vllm, a few seconds)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        from services.workers.vllm.kv_events import events_config

        parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(prog="meshfront vllm (engine flags)"))
        ns = parser.parse_args(["--model", self.args.model_dir, "--served-model-name", self.model_name,
                                *self.engine_argv])
        engine_args = AsyncEngineArgs.from_cli_args(ns)
        if self.kv_events_endpoint:
            engine_args.kv_events_config = events_config(self.kv_events_endpoint, self.kv_replay_endpoint)
        return engine_args

    @property
    def model_name(self) -> str:
        return self.args.model_name or Path(self.args.model_dir).name


def _owned_flags(engine_argv: Sequence[str]) -> list[str]:
    errors = []
    for arg in engine_argv:
        flag = arg.split("=", 1)[0]
        if flag in OWNED_ENGINE_FLAGS:
            errors.append(f"{flag} is set by the worker: use {OWNED_ENGINE_FLAGS[flag]}")
    return errors


def _int_flag(argv: Sequence[str], flag: str) -> int | None:
    """An integer engine flag's value, for the provisional checks (vLLM's parser reports bad ones)."""
    for i, arg in enumerate(argv):
        raw = argv[i + 1] if arg == flag and i + 1 < len(argv) else \
            arg.split("=", 1)[1] if arg.startswith(flag + "=") else None
        if raw is not None:
            return int(raw) if raw.isdigit() else None
    return None


def parse_config(argv: Sequence[str], env: Mapping[str, str] | None = None) -> VllmConfig:
    """Splits and checks the flags without importing vllm; raises ConfigError listing every problem."""
    p = FlagParser("vllm", DESCRIPTION, env, allow_abbrev=False)
    add_worker_flags(p, engine_sized=True)
    args, engine_argv = p.parse_known(argv)
    # Provisional sizes for the checks below; the engine's own replace them once it has started.
    context = _int_flag(engine_argv, "--max-model-len") or (
        read_model_info(args.model_dir).context_length if args.model_dir and Path(args.model_dir).is_dir() else 1)
    block = _int_flag(engine_argv, "--block-size") or 16
    errors = worker_config_from_args(args, "vllm", context_length=context, block_size=block).validate()
    errors += _owned_flags(engine_argv)
    if errors:
        raise ConfigError(errors)
    endpoint = replay = ""
    if args.register:
        worker_id = worker_config_from_args(args, "vllm", context_length=context, block_size=block).worker_id
        args.worker_id = worker_id  # one id for the card, the events and the endpoints
        base = Path(tempfile.gettempdir()) / f"meshfront-{worker_id}"
        endpoint, replay = f"ipc://{base}-kv.ipc", f"ipc://{base}-kv-replay.ipc"
    return VllmConfig(args=args, engine_argv=tuple(engine_argv), kv_events_endpoint=endpoint,
                      kv_replay_endpoint=replay)
