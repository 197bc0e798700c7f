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

``--disaggregation-mode prefill|decode`` (the card's role) needs vLLM's ``--kv-transfer-config``, whose
``kv_role`` produces (prefill) or consumes (decode) KV blocks: anything else is refused at start
(services/workers/vllm/transfer.py has the request side).

vLLM's ``--data-parallel-size N`` (``-dp``) runs N engine cores behind the worker, one per data-parallel rank:
the card declares the ranks this worker's client manages, each rank publishes its own KV events and load, and
a request runs on the rank the router chose (services/common/dp_ranks.py; docs/engines.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.discovery import LoraAdapter
from services.workers.config import ConfigError
from services.workers.engine_worker import EngineFlags, EngineFlagSpec, parse_engine_flags
from services.workers.vllm.lora import split_lora_modules

OWNED_ENGINE_FLAGS = {"--served-model-name": "--model-name",
                      "--kv-events-config": "nothing (Meshfront turns KV events on itself)"}
DESCRIPTION = ("vLLM's async engine behind the worker API. Flags not listed here are vLLM engine "
               "arguments, passed through unchanged (see `vllm serve --help`).")


@dataclasses.dataclass(frozen=True)
class VllmConfig(EngineFlags):
    # --lora-modules, a `vllm serve` flag rather than an engine argument (services/workers/vllm/lora.py).
    lora_modules: tuple[LoraAdapter, ...] = ()

    def engine_args(self) -> Any:
        """vLLM's ``AsyncEngineArgs`` (imports vllm, a few seconds); raises ConfigError for flags that parse but
        cannot work with this worker."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        from services.workers.vllm import thinking_budget
        from services.workers.vllm.kv_events import events_config, ranked_events_config
        from services.workers.vllm.transfer import role_errors

        parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(prog="meshfront vllm (engine flags)"))
        ns = parser.parse_args(["--model", self.args.model_dir, "--served-model-name", self.model_name,
                                *self.engine_argv])
        engine_args = AsyncEngineArgs.from_cli_args(ns)
        errors = role_errors(self.args.disaggregation_mode, engine_args.kv_transfer_config)
        if errors:
            raise ConfigError(errors)
        if self.kv_events_endpoint and engine_args.data_parallel_size > 1:
            engine_args.kv_events_config = ranked_events_config()  # one publisher per engine core (kv_events.py)
        elif self.kv_events_endpoint:
            engine_args.kv_events_config = events_config(self.kv_events_endpoint, self.kv_replay_endpoint)
        thinking_budget.configure(engine_args, self.args.reasoning_parser, self.args.model_dir)
        return engine_args


FLAGS = EngineFlagSpec(kind="vllm", description=DESCRIPTION, owned=OWNED_ENGINE_FLAGS,
                       context_flag="--max-model-len", block_flag="--block-size", default_block=16)


def parse_config(argv: Sequence[str], env: Mapping[str, str] | None = None) -> VllmConfig:
    """Splits and checks the flags without importing vllm; raises ConfigError listing every problem."""
    modules, argv = split_lora_modules(argv)
    flags = parse_engine_flags(FLAGS, argv, env)
    return VllmConfig(**vars(flags), lora_modules=modules)
