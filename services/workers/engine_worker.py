"""What the real-engine workers (vllm, sglang) share: the flag split, the start-failure message, and
serving with the engine's KV events translated onto NATS. Engine-neutral: no engine import here.

- ``parse_engine_flags``: Meshfront's worker flags (abbreviations off, so an engine flag is never
  taken for an abbreviation of ours), the rest kept for the engine's own parser; the flags the
  worker owns are refused by name; one worker id names the card and the private ipc:// endpoints
  of the engine's KV event publisher.
- ``engine_kv_events``: the engine's events -> ``BlockHashTranslator`` -> the worker's KV event
  listener (services/workers/entry.py publishes them, with the engine's ``read_load``).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from services.common.flags import FlagParser
from services.common.kv_events import KvEventListener
from services.workers.config import ConfigError, WorkerConfig, add_worker_flags, worker_config_from_args
from services.workers.engine_kv import BlockHashTranslator
from services.workers.engine_kv_zmq import Decoder, ZmqKvSubscriber
from services.workers.model_dir import read_model_info
from services.workers.server import EngineStartFailed

__all__ = ["EngineFlagSpec", "EngineFlags", "EngineStartFailed", "descendants", "engine_kv_events",
           "parse_engine_flags", "root_message"]

# The engine's innermost error message is capped: some list every supported architecture, and the
# full traceback is in the log just above.
MAX_MESSAGE_CHARS = 600


@dataclasses.dataclass(frozen=True)
class EngineFlags:
    kind: str
    args: argparse.Namespace  # the shared worker flags
    engine_argv: tuple[str, ...]  # the engine's, as given
    # ipc:// endpoints of the engine's KV event publisher and its replay socket (empty: no events).
    kv_events_endpoint: str = ""
    kv_replay_endpoint: str = ""

    @property
    def model_name(self) -> str:
        return self.args.model_name or Path(self.args.model_dir).name

    def worker(self, *, context_length: int, block_size: int) -> WorkerConfig:
        """The worker's config with the engine's real context window and block (page) size."""
        return worker_config_from_args(self.args, self.kind, context_length=context_length, block_size=block_size)


@dataclasses.dataclass(frozen=True)
class EngineFlagSpec:
    """How one engine names the flags the worker reads or owns."""

    kind: str
    description: str
    owned: Mapping[str, str]  # engine flag -> what to use instead
    context_flag: str  # the engine's context-window flag (for the provisional checks)
    block_flag: str  # the engine's KV block (page) size flag
    default_block: int


def parse_engine_flags(spec: EngineFlagSpec, argv: Sequence[str], env: Mapping[str, str] | None) -> EngineFlags:
    """Splits and checks the flags without importing the engine; raises ConfigError listing every problem."""
    p = FlagParser(spec.kind, spec.description, env, allow_abbrev=False)
    add_worker_flags(p, engine_sized=True, disaggregation=True, guided_tools=True, kv_cache=True)
    args, engine_argv = p.parse_known(argv)
    # Provisional sizes for the checks; the engine's own replace them once it has started.
    context = _int_flag(engine_argv, spec.context_flag) or (
        read_model_info(args.model_dir).context_length if args.model_dir and Path(args.model_dir).is_dir() else 1)
    block = _int_flag(engine_argv, spec.block_flag) or spec.default_block
    provisional = worker_config_from_args(args, spec.kind, context_length=context, block_size=block)
    errors = provisional.validate() + _owned_flags(engine_argv, spec.owned)
    if errors:
        raise ConfigError(errors)
    endpoint = replay = ""
    if args.register:
        args.worker_id = provisional.worker_id  # one id for the card, the events and the endpoints
    if args.register and args.kv_events:  # --no-kv-events: the engine is not asked to publish any
        base = Path(tempfile.gettempdir()) / f"meshfront-{provisional.worker_id}"
        endpoint, replay = f"ipc://{base}-kv.ipc", f"ipc://{base}-kv-replay.ipc"
    return EngineFlags(kind=spec.kind, args=args, engine_argv=tuple(engine_argv), kv_events_endpoint=endpoint,
                       kv_replay_endpoint=replay)


def _owned_flags(argv: Sequence[str], owned: Mapping[str, str]) -> list[str]:
    return [f"{flag} is set by the worker: use {owned[flag]}"
            for flag in (arg.split("=", 1)[0] for arg in argv) if flag in owned]


def _int_flag(argv: Sequence[str], flag: str) -> int | None:
    """An integer engine flag's value, for the provisional checks (the engine's parser reports bad ones)."""
    for i, arg in enumerate(argv):
        raw = argv[i + 1] if arg == flag and i + 1 < len(argv) else \
            arg.split("=", 1)[1] if arg.startswith(flag + "=") else None
        if raw is not None:
            return int(raw) if raw.isdigit() else None
    return None


def root_message(error: BaseException) -> str:
    """The deepest cause's message on one line: engines wrap their core's error in 'initialization failed'."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = " ".join(str(error).split())
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + " ..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, whichever thread started it (engines start their core from one)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile
        for child in map(int, children):
            out += [child, *descendants(child)]
    return out


def engine_kv_events(flags: EngineFlags, block_size: int, decode: Decoder,
                     listener: KvEventListener | None) -> list[Callable[[], Awaitable[None]]]:
    """Connects a started engine's KV events (its ZMQ publisher) to ``listener``; returns the closers.

    No listener (a worker that does not register, or runs with --no-kv-events): the engine publishes nothing, and
    nothing listens.
    """
    if listener is None or not flags.kv_events_endpoint:
        return []
    translator = BlockHashTranslator(listener, block_size)
    subscriber = ZmqKvSubscriber(flags.kv_events_endpoint, flags.kv_replay_endpoint, decode, translator.apply)
    subscriber.start()
    return [subscriber.close]
