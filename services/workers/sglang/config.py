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

With a ``--reasoning-parser`` whose thinking block has markers, the worker turns on SGLang's
``--enable-custom-logit-processor``: its thinking-budget processor enforces ``max_thinking_tokens``
(services/workers/sglang/thinking_budget.py), and, unless ``--disable-overlap-schedule`` is given, SGLang's
delayed sampling (``SGLANG_ENABLE_DELAY_SAMPLE``): without it the processor reads each request's output one
token behind and the budget ends a token late. Not with ``--enable-watermark``, which SGLang refuses
beside it: that worker refuses budgets.

SGLang's ``--dp-size N`` (or ``--attn-dp-size N``) runs N schedulers, one per data-parallel rank: the card
declares ranks 0..N-1, each rank's KV events (on a loopback tcp port run the worker picks) and load go out as its
own stream, and a request runs on the rank the router chose (``routed_dp_rank``).

``--disaggregation-mode`` is the worker's flag (the card's role) and is passed on as SGLang's own
(``agg`` is SGLang's ``null``); a prefill worker's ``--host`` is passed on too, since SGLang binds its
KV bootstrap server there (services/workers/sglang/transfer.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from services.common.parser_names import THINKING_BLOCKS
from services.workers.config import ConfigError
from services.workers.engine_worker import EngineFlags, EngineFlagSpec, parse_engine_flags

OWNED_ENGINE_FLAGS = {
    "--model-path": "--model-dir",
    "--served-model-name": "--model-name",
    "--kv-events-config": "nothing (Meshfront turns KV events on itself)",
    "--incremental-streaming-output": "nothing (the worker turns SGLang's stream into deltas itself)",
}
# SGLang's switch for sampling after the previous step's result is processed (sample_after_the_previous_step).
DELAY_SAMPLE_ENV = "SGLANG_ENABLE_DELAY_SAMPLE"
DESCRIPTION = ("SGLang's engine behind the worker API. Flags not listed here are SGLang server "
               "arguments, passed through unchanged (see `python -m sglang.launch_server --help`).")


class SglangConfig(EngineFlags):
    def server_args(self) -> Any:
        """SGLang's ``ServerArgs`` (imports sglang's config modules, a few seconds).

        Our flags go last so that they win over a ``--config`` YAML or an abbreviation of an
        owned flag. Raises ConfigError for what parses but cannot work with this worker.
        """
        from sglang.srt.server_args import prepare_server_args

        from services.workers.sglang.kv_events import events_config, ranked_events_config
        from services.workers.sglang.transfer import sglang_mode

        mode = sglang_mode(self.args.disaggregation_mode)
        ours = ["--model-path", self.args.model_dir, "--served-model-name", self.model_name,
                "--log-level", self.args.log_level.lower(), "--disaggregation-mode", mode]
        if mode == "prefill":
            ours += ["--host", self.args.host]
        if self.kv_events_endpoint:
            ours += ["--kv-events-config", events_config(self.kv_events_endpoint, self.kv_replay_endpoint)]
        server_args = prepare_server_args([*self.engine_argv, *ours])
        if server_args.incremental_streaming_output:  # set by a --config file
            raise ConfigError(["incremental_streaming_output is set by the worker: leave it off"])
        if self.kv_events_endpoint and dp_ranks(server_args) > 1:
            # One publisher per rank, on the configured endpoint plus the rank: a tcp port run (kv_events.py).
            # Set on the parsed record, as below: the schedulers read it at engine start.
            server_args.kv_events_config = ranked_events_config(dp_ranks(server_args))
        if self.args.reasoning_parser in THINKING_BLOCKS and not server_args.enable_watermark:
            # A thinking budget runs as SGLang's logit processor. SGLang keeps custom processors off because
            # its HTTP API would run a client's pickled code; that server never starts here, and only the
            # worker builds requests. Set on the parsed record (SGLang resolves it later, at engine start).
            server_args.enable_custom_logit_processor = True
            if not server_args.disable_overlap_schedule:
                sample_after_the_previous_step()
        return server_args


def dp_ranks(server_args: Any) -> int:
    """How many data-parallel ranks SGLang runs (its ``num_dp_ranks``: replicas times attention-DP groups, one
    of which is 1); each is a routing target of its own (services/common/dp_ranks.py)."""
    return server_args.dp_size * server_args.attn_dp_size


def sample_after_the_previous_step(environ: MutableMapping[str, str] | None = None) -> None:
    """Makes SGLang's overlap scheduler sample each step after it has recorded the previous step's token.

    By default (``SGLANG_ENABLE_DELAY_SAMPLE`` off, overlap on) SGLang samples a decode step while the previous
    step's token is still in flight: a custom logit processor then reads ``req.output_ids`` one token behind,
    and the thinking budget's processor forces the end marker one token late, and twice (the second time
    because it has not yet seen the first). With delayed sampling, SGLang's own switch (its TpModelWorker
    leaves the sampling to the scheduler, which runs it after processing the previous batch's result), the
    processor sees every token; the forward still overlaps. The scheduler processes read it at start: it is
    set in this process's environment, which they inherit. Raises ConfigError when it was turned off by hand.
    """
    env = os.environ if environ is None else environ
    value = env.get(DELAY_SAMPLE_ENV)
    if value is not None and value.strip().lower() in ("0", "false", "no", "n"):
        raise ConfigError([f"{DELAY_SAMPLE_ENV}={value} would end thinking budgets one token late under SGLang's "
                           "overlap scheduler: unset it, or pass --disable-overlap-schedule"])
    env[DELAY_SAMPLE_ENV] = "1"


FLAGS = EngineFlagSpec(kind="sglang", description=DESCRIPTION, owned=OWNED_ENGINE_FLAGS,
                       context_flag="--context-length", block_flag="--page-size", default_block=1)


def parse_config(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SglangConfig:
    """Splits and checks the flags without importing sglang; raises ConfigError listing every problem."""
    return SglangConfig(**vars(parse_engine_flags(FLAGS, argv, env)))
