"""What ``meshfront attach`` decides about a stock engine, without gRPC or NATS: its card, its load report, when it
is registered, and which addresses a DNS name now stands for.

A stock engine (vLLM ``--grpc``, SGLang ``--grpc-mode``, TensorRT-LLM ``--grpc``) serves SMG's engine proto itself;
the registrar only speaks for it in NATS, with the same card, TTL and heartbeat as Meshfront's own workers
(services/common/discovery.py), so that the routers and the gateway cannot tell the two apart except by the card's
``engine_protocol``, which tells the postprocessor which proto to call.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from pathlib import Path

from services.common.cards import ENGINE_PROTOCOLS, SGLANG_SCHEDULER, TRTLLM_SERVICE, VLLM_ENGINE, ModelCard, WorkerCard
from services.common.model_files import model_files_reference
from services.common.namespace import Namespace

__all__ = ["HEALTHY", "PROTOCOLS", "SGLANG_SCHEDULER", "SLOW", "TRTLLM_SERVICE", "UNHEALTHY", "VLLM_ENGINE",
           "AttachSettings", "CannotAttach", "EngineInfo", "EngineLoad", "Health", "card_for", "load_report",
           "target_changes", "worker_id"]
# SMG's engine services, as the card names them (services/common/cards.py, ``engine_protocol``).
PROTOCOLS = ENGINE_PROTOCOLS
# The card's ``kind`` for each: what metrics and logs name the worker by.
_KINDS = {VLLM_ENGINE: "vllm-grpc", SGLANG_SCHEDULER: "sglang-grpc", TRTLLM_SERVICE: "trtllm-grpc"}


@dataclasses.dataclass(frozen=True)
class AttachSettings:
    """What the operator says about every engine the registrar attaches (one model, one protocol)."""

    protocol: str
    namespace: str
    model_name: str = ""  # "" : the engine's served model name
    model_dir: str = ""  # "" : the engine's model path, when it is a directory here
    block_size: int = 0  # 0 : the engine's (vLLM's server info says it)
    tool_call_parser: str = ""
    reasoning_parser: str = ""


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What an engine's model and server info say, as the card needs it."""

    served_model_name: str
    model_path: str
    context_length: int
    block_size: int  # 0: the engine did not say
    is_generation: bool = True
    data_parallel_size: int = 1
    sampling_defaults: tuple[tuple[str, float], ...] = ()  # the model's generation-config knobs the engine says


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    """One GetLoads entry (or a KV event batch's load record) in the routers' terms."""

    running: int
    waiting: int
    token_usage: float  # KV cache use in [0, 1]
    total_tokens: int = 0  # the engine's KV capacity in tokens; 0: not said


# What one health check found (``Health.observe``).
HEALTHY, UNHEALTHY, SLOW = "healthy", "unhealthy", "slow"


class CannotAttach(ValueError):
    """The engine cannot be registered as it is (the message says why); the registrar logs it and retries."""


def worker_id(protocol: str, address: str) -> str:
    """A stable id per engine address: a registrar that restarts, or re-registers an engine whose health came
    back, keeps its id, so routers keep its cached blocks' history; two registrars for one address agree."""
    return f"{_KINDS[protocol]}-{hashlib.sha256(address.encode()).hexdigest()[:8]}"


def card_for(settings: AttachSettings, address: str, info: EngineInfo, *, total_kv_blocks: int = 0) -> WorkerCard:
    """The card a worker of Meshfront's own would register for this engine.

    Raises:
        CannotAttach: an embedding-only engine, no model directory, no block size, no context window."""
    if not info.is_generation:
        raise CannotAttach(f"the engine at {address} serves an embedding model; attach serves generating models")
    if info.data_parallel_size > 1:
        raise CannotAttach(f"the engine at {address} runs {info.data_parallel_size} data-parallel ranks; attach "
                           "registers engines without ranks")
    model_dir = settings.model_dir or info.model_path
    if not model_dir or not Path(model_dir).is_dir():
        raise CannotAttach(f"the engine at {address} serves {info.model_path!r}, not a directory here: give "
                           "--model-dir (its tokenizer and chat template, published to the mesh)")
    block_size = settings.block_size or info.block_size
    if block_size <= 0:
        raise CannotAttach(f"the engine at {address} does not say its KV block size: give --block-size")
    if info.context_length <= 0:
        raise CannotAttach(f"the engine at {address} does not say its context length")
    scope = Namespace.of(settings.namespace)
    model = ModelCard(name=settings.model_name or info.served_model_name or Path(model_dir).name,
                      model_dir=model_dir, context_length=info.context_length, block_size=block_size,
                      tool_call_parser=settings.tool_call_parser, reasoning_parser=settings.reasoning_parser,
                      model_files=model_files_reference(scope, model_dir))
    return WorkerCard(worker_id=worker_id(settings.protocol, address), address=address, model=model,
                      kind=_KINDS[settings.protocol], total_kv_blocks=total_kv_blocks, namespace=scope.name,
                      engine_protocol=settings.protocol, sampling_defaults=info.sampling_defaults)


def load_report(load: EngineLoad, block_size: int) -> dict[str, int]:
    """The routers' load fields (services/common/kv_events.py) from the engine's: blocks from tokens."""
    total = load.total_tokens // block_size if block_size > 0 else 0
    return {"active_blocks": min(total, round(load.token_usage * total)), "waiting": load.waiting,
            "running": load.running, "total_blocks": total}


class Health:
    """Registered while the engine answers healthy.

    An engine that says it is unhealthy, or cannot be reached, is dropped at the first check: a dead engine's
    streams migrate at once anyway (the postprocessor sees them break), and new requests must stop going to it
    before the card's TTL would. One that is only slow to answer (a deadline passed) is dropped after
    ``slow_to_drop`` such checks in a row: an engine process busy for a moment is not gone."""

    def __init__(self, slow_to_drop: int = 2):
        self.slow_to_drop = slow_to_drop
        self.registered = False
        self._slow = 0

    def observe(self, answer: str) -> str | None:
        """``"register"``, ``"deregister"`` or None (no change) after one check whose ``answer`` was ``HEALTHY``,
        ``UNHEALTHY`` or ``SLOW``."""
        if answer == HEALTHY:
            self._slow = 0
            if not self.registered:
                self.registered = True
                return "register"
            return None
        self._slow = self._slow + 1 if answer == SLOW else self.slow_to_drop
        if self.registered and self._slow >= self.slow_to_drop:
            self.registered = False
            return "deregister"
        return None


def target_changes(known: Iterable[str], resolved: Iterable[str]) -> tuple[list[str], list[str]]:
    """(added, removed) addresses, sorted: what a DNS name's new answer changes. An empty answer (a failed
    lookup is not one) removes every engine, as pods scaled to zero do."""
    before, after = set(known), set(resolved)
    return sorted(after - before), sorted(before - after)


def split_dns_target(value: str) -> tuple[str, int]:
    """``NAME:PORT`` of ``--engine-dns``.

    Raises:
        ValueError: not NAME:PORT with a port in 1..65535."""
    name, sep, port = value.rpartition(":")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not NAME:PORT")
    return name, int(port)


def address_of(host: str, port: int) -> str:
    """host:port, an IPv6 literal bracketed, as gRPC dials it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
