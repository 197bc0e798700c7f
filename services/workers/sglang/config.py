"""``meshfront sglang`` flags: Meshfront's worker flags, and every other flag passed to SGLang unchanged.

Meshfront's flags are the shared worker flags (``--model-dir``, ``--model-name``, ``--worker-id``,
``--host``, ``--port``, ``--nats-url``, ``--register``, ``--tool-call-parser``, ``--log-level``, ...;
env twins ``MESHFRONT_SGLANG_*``). Whatever argparse does not recognise among them is parsed by
SGLang's own ``sglang serve`` parser (``prepare_server_args``: ``ServerArgs.add_cli_args`` and
``from_cli_args``, plus its ``--config`` YAML), so an SGLang user's flags (``--tp-size``,
``--context-length``, ``--page-size``, ``--mem-fraction-static``, ``--quantization``,
``--enable-deterministic-inference``, ...) mean what they mean in ``sglang serve``, and a misspelt
one fails there, naming it.

Some SGLang flags are Meshfront's to set and refused here: ``--model-path``/``--model`` (it is
``--model-dir``), ``--served-model-name`` (``--model-name``), ``--kv-events-config`` (the worker
turns KV events on itself, on a private endpoint) and ``--incremental-streaming-output`` (the
engine adapter reads SGLang's default cumulative stream). SGLang's ``--host``, ``--port``,
``--log-level``, ``--tool-call-parser`` and ``--reasoning-parser`` are shadowed by the worker's
flags of the same name: ours serve gRPC and go on the worker card; SGLang's HTTP server is never
started, and our ``--log-level`` is passed on as SGLang's. The context window and page size on
the worker's card are the ones the engine ends up using.
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

OWNED_ENGINE_FLAGS = {
    "--model-path": "--model-dir",
    "--model": "--model-dir",  # SGLang's alias of --model-path
    "--served-model-name": "--model-name",
    "--kv-events-config": "nothing (Meshfront turns KV events on itself)",
    "--incremental-streaming-output": "nothing (the worker turns SGLang's stream into deltas itself)",
}
DESCRIPTION = ("SGLang's engine behind the worker API. Flags not listed here are SGLang server "
               "arguments, passed through unchanged (see `python -m sglang.launch_server --help`).")


@dataclasses.dataclass(frozen=True)
class SglangConfig:
    args: argparse.Namespace  # the shared worker flags
    engine_argv: tuple[str, ...]  # SGLang's, as given
    # ipc:// endpoints of SGLang's KV event publisher and its replay socket (empty: no events).
    kv_events_endpoint: str = ""
    kv_replay_endpoint: str = ""

    def worker(self, *, context_length: int, block_size: int) -> WorkerConfig:
        """The worker's config with the engine's real context window and page size."""
        return worker_config_from_args(self.args, "sglang", context_length=context_length, block_size=block_size)

    def server_args(self) -> Any:
        """SGLang's ``ServerArgs`` (imports sglang's config modules, a few seconds).

        Our flags go last so that they win over a ``--config`` YAML or an abbreviation of an
        owned flag. Raises ConfigError for what parses but cannot work with this worker.
        """
        from sglang.srt.server_args import prepare_server_args

        from services.workers.sglang.kv_events import events_config

        ours = ["--model-path", self.args.model_dir, "--served-model-name", self.model_name,
                "--log-level", self.args.log_level.lower()]
        if self.kv_events_endpoint:
            ours += ["--kv-events-config", events_config(self.kv_events_endpoint, self.kv_replay_endpoint)]
        server_args = prepare_server_args([*self.engine_argv, *ours])
        if server_args.incremental_streaming_output:  # set by a --config file
            raise ConfigError(["incremental_streaming_output is set by the worker: leave it off"])
        if self.kv_events_endpoint and (server_args.dp_size > 1 or server_args.attn_dp_size > 1):
            # One publisher per DP rank, and SGLang offsets only tcp:// endpoints per rank.
            raise ConfigError([("--dp-size/--attn-dp-size above 1 needs --no-register: the worker subscribes "
                                "to one KV event publisher")])
        return server_args

    @property
    def model_name(self) -> str:
        return self.args.model_name or Path(self.args.model_dir).name


def owned_flags(argv: Sequence[str]) -> list[str]:
    """An error for each flag of ``argv`` that the worker sets itself."""
    errors = []
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in OWNED_ENGINE_FLAGS:
            errors.append(f"{flag} is set by the worker: use {OWNED_ENGINE_FLAGS[flag]}")
    return errors


def _int_flag(argv: Sequence[str], flag: str) -> int | None:
    """An integer engine flag's value, for the provisional checks (SGLang's parser reports bad ones)."""
    for i, arg in enumerate(argv):
        raw = argv[i + 1] if arg == flag and i + 1 < len(argv) else \
            arg.split("=", 1)[1] if arg.startswith(flag + "=") else None
        if raw is not None:
            return int(raw) if raw.isdigit() else None
    return None


def parse_config(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SglangConfig:
    """Splits and checks the flags without importing sglang; raises ConfigError listing every problem."""
    # Before parsing: argparse would take SGLang's --model for an ambiguous abbreviation of
    # --model-dir/--model-name and exit with a message that names neither.
    owned = owned_flags(argv)
    if owned:
        raise ConfigError(owned)
    p = FlagParser("sglang", DESCRIPTION, env)
    add_worker_flags(p, engine_sized=True)
    args, engine_argv = p.parse_known(argv)
    # Provisional sizes for the checks below; the engine's own replace them once it has started.
    context = _int_flag(engine_argv, "--context-length") or (
        read_model_info(args.model_dir).context_length if args.model_dir and Path(args.model_dir).is_dir() else 1)
    block = _int_flag(engine_argv, "--page-size") or 1
    provisional = worker_config_from_args(args, "sglang", context_length=context, block_size=block)
    errors = provisional.validate()
    if errors:
        raise ConfigError(errors)
    endpoint = replay = ""
    if args.register:
        args.worker_id = provisional.worker_id  # one id for the card, the events and the endpoints
        base = Path(tempfile.gettempdir()) / f"meshfront-{provisional.worker_id}"
        endpoint, replay = f"ipc://{base}-kv.ipc", f"ipc://{base}-kv-replay.ipc"
    return SglangConfig(args=args, engine_argv=tuple(engine_argv), kv_events_endpoint=endpoint,
                        kv_replay_endpoint=replay)
