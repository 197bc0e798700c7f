"""Mocker configuration: the shared worker flags plus the simulated engine's knobs.

Every flag has a ``MESHFRONT_MOCKER_*`` env twin. Defaults follow Dynamo's mocker (16384 blocks,
256 sequences, 8192 batched tokens, chunked prefill on, speed-up 1.0) except the block size,
which is 16 here as in Dynamo's router.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from services.common.flags import FlagParser
from services.workers.config import ConfigError, WorkerConfig, add_worker_flags, worker_config_from_args
from services.workers.lora import LoraSettings, parse_lora_modules
from services.workers.media.config import DEFAULT_JOBS, JobLimits, add_job_flags, job_limits_from_args
from services.workers.mocker.media_config import MediaSimConfig, add_media_flags, media_config_from_args
from services.workers.mocker.timing import TimingModel
from services.workers.mocker.transfer import DEFAULT_BANDWIDTH_GBS, DEFAULT_BLOCK_BYTES, DEFAULT_HOLD_TIMEOUT_S

MODALITIES = ("image", "video", "audio")
_TIMING = TimingModel()  # the step-time polynomial's defaults (timing.py)
# (flag, field, help) of each coefficient of the step-time polynomials, in ms (timing.py); the bench gives
# Dynamo 1.6.1's prefill ones to run both mockers at one engine speed (bench/disagg.py).
TIMING_FLAGS = (
    ("--prefill-ms-const", "prefill_ms_const", "a prefill step's fixed cost"),
    ("--prefill-ms-per-token", "prefill_ms_per_token", "a prefill step's cost per uncached token"),
    ("--prefill-ms-per-token-sq", "prefill_ms_per_token_sq", "a prefill step's cost per uncached token squared"),
    ("--decode-ms-const", "decode_ms_const", "a decode step's cost with an empty KV cache"),
    ("--decode-ms-lin", "decode_ms_lin", "a decode step's cost per unit of KV cache in use (0..1)"),
    ("--decode-ms-sq", "decode_ms_sq", "a decode step's cost per unit of KV cache in use, squared"),
)


@dataclasses.dataclass(frozen=True)
class MockerEngineConfig:
    """Everything the simulated engine needs (no transport concerns)."""

    block_size: int = 16
    num_gpu_blocks: int = 16384
    max_num_seqs: int = 256
    # Most sequences waiting for a slot before new ones are refused (0 = unbounded).
    max_waiting: int = 1024
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    # Divides every simulated duration; 0 disables delays altogether.
    speedup_ratio: float = 1.0
    context_length: int = 4096
    script: str = ""
    output_text: str | None = None
    # Media the simulated engine takes, and the prompt tokens each item stands for (a vision
    # encoder's placeholder tokens), so media show in usage and in the KV cache.
    input_modalities: tuple[str, ...] = ()
    image_tokens: int = 64
    audio_tokens: int = 32
    # Disaggregation (transfer.py): bytes of one KV block and the link's GB/s give a transfer's time; a
    # prefill's held blocks nobody pulls are freed after kv_hold_timeout_s (0: never).
    kv_block_bytes: int = DEFAULT_BLOCK_BYTES
    kv_transfer_bandwidth_gbs: float = DEFAULT_BANDWIDTH_GBS
    kv_hold_timeout_s: float = DEFAULT_HOLD_TIMEOUT_S
    # The transfer overlaps the prefill (the paired order, layer-wise streaming, as SGLang and Mooncake move KV;
    # transfer.py), or starts after it (as vLLM's NIXL connector pulls it; the default).
    kv_transfer_overlap: bool = False
    # The step-time polynomials' coefficients in ms (timing.py; --prefill-ms-* and --decode-ms-*).
    prefill_ms_const: float = _TIMING.prefill_ms_const
    prefill_ms_per_token: float = _TIMING.prefill_ms_per_token
    prefill_ms_per_token_sq: float = _TIMING.prefill_ms_per_token_sq
    decode_ms_const: float = _TIMING.decode_ms_const
    decode_ms_lin: float = _TIMING.decode_ms_lin
    decode_ms_sq: float = _TIMING.decode_ms_sq

    def timing(self) -> TimingModel:
        return TimingModel(speedup_ratio=self.speedup_ratio, total_blocks=self.num_gpu_blocks,
                           **{field: getattr(self, field) for _, field, _ in TIMING_FLAGS})

    def _timing_errors(self) -> list[str]:
        errors = []
        if min(self.prefill_ms_const, self.prefill_ms_per_token, self.prefill_ms_per_token_sq) < 0:
            errors.append("--prefill-ms-const, --prefill-ms-per-token and --prefill-ms-per-token-sq must be >= 0")
        timing = self.timing()
        if min(timing.decode_ms(0), timing.decode_ms(self.num_gpu_blocks)) <= 0:
            errors.append("--decode-ms-*: a decode step must take > 0 ms with the KV cache empty and full")
        return errors

    def validate(self) -> list[str]:
        errors = []
        # block_size and context_length are checked with the shared worker flags.
        for name in ("num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                errors.append(f"--{name.replace('_', '-')} must be positive")
        if self.max_waiting < 0:
            errors.append("--max-waiting must be >= 0 (0 = unbounded)")
        if self.speedup_ratio < 0:
            errors.append("--speedup-ratio must be >= 0 (0 = no delays)")
        for m in self.input_modalities:
            if m not in MODALITIES:
                errors.append(f"--input-modalities: {m!r} is not one of {', '.join(MODALITIES)}")
        if self.image_tokens <= 0 or self.audio_tokens <= 0:
            errors.append("--image-tokens and --audio-tokens must be positive")
        if self.kv_block_bytes <= 0 or self.kv_transfer_bandwidth_gbs <= 0:
            errors.append("--kv-block-bytes and --kv-transfer-bandwidth-gbs must be positive")
        if self.kv_hold_timeout_s < 0:
            errors.append("--kv-hold-timeout-s must be >= 0 (0 = held until pulled or released)")
        errors += self._timing_errors()
        if self.script and not Path(self.script).is_file():
            errors.append(f"--script {self.script!r} is not a file")
        return errors


@dataclasses.dataclass(frozen=True)
class MockerConfig:
    worker: WorkerConfig
    engine: MockerEngineConfig
    # ``--media image|video``: the media simulator instead of the text engine (media_config.py).
    media: MediaSimConfig | None = None
    jobs: JobLimits = DEFAULT_JOBS
    lora: LoraSettings = LoraSettings()
    # --dp-size: data-parallel ranks, one simulated engine each (own KV cache, scheduler and KV events) in this
    # process, registered as ranks 0..dp_size-1 (services/workers/dp_engines.py).
    dp_size: int = 1


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> MockerConfig:
    """Parses and validates; raises ConfigError listing every problem."""
    p = FlagParser("mocker", "A simulated inference engine behind the worker API.", env)
    add_worker_flags(p, disaggregation=True, guided_tools=True, kv_cache=True)
    p.add("--num-gpu-blocks", default=16384, type=int, help="KV cache size in blocks")
    p.add("--max-num-seqs", default=256, type=int, help="most sequences running at once")
    p.add("--max-waiting", default=1024, type=int,
          help="sequences allowed to wait for a slot; beyond that requests fail fast with 503 (0 = unbounded)")
    p.add("--max-num-batched-tokens", default=8192, type=int, help="token budget of one engine step")
    p.add("--enable-chunked-prefill", default=True, type=bool, help="split long prompts over several steps")
    p.add("--speedup-ratio", default=1.0, type=float, help="divides simulated time; 0 = no delays")
    p.add("--script", default="", help="JSON file of {match, text} rules and a {default} answer")
    p.add("--output-text", default=None, help="answer every prompt with this text (one default rule)")
    p.add("--input-modalities", default="",
          help="media chat messages may carry for this worker, comma-separated: image, video, audio (declared on "
               "its card; default: text only)")
    p.add("--image-tokens", default=64, type=int,
          help="prompt tokens one image or video stands for when the preprocessor did not place it (a model "
               "without an image placeholder token); placed ones take their size-derived count")
    p.add("--audio-tokens", default=32, type=int, help="prompt tokens one audio clip stands for")
    p.add("--kv-block-bytes", default=DEFAULT_BLOCK_BYTES, type=int,
          help="bytes of one KV block, for the time a disaggregated transfer takes (default: an 8B model's)")
    p.add("--kv-transfer-bandwidth-gbs", default=DEFAULT_BANDWIDTH_GBS, type=float,
          help="GB/s between a prefill and a decode worker (a transfer takes blocks x block bytes / this)")
    p.add("--kv-hold-timeout-s", default=DEFAULT_HOLD_TIMEOUT_S, type=float,
          help="a prefill worker frees blocks held for a decode worker that has not pulled them by then (0: never)")
    p.add("--kv-transfer-overlap", default=False, type=bool,
          help="a prefill worker announces its hold before computing (the paired order), so that the decode "
               "worker's transfer streams each layer's KV as it is computed, as SGLang's and Mooncake's do; "
               "off: the transfer starts after the prefill, as vLLM's NIXL pull does")
    for flag, field, why in TIMING_FLAGS:
        p.add(flag, default=getattr(_TIMING, field), type=float, help=f"{why}, in ms before --speedup-ratio")
    p.add("--enable-lora", default=False, type=bool, help="serve LoRA adapters of the model (as vLLM's flag)")
    p.add("--lora-modules", default="",
          help="adapters loaded at start, comma-separated name=path (PEFT directories); needs --enable-lora")
    p.add("--max-loras", default=1, type=int, help="distinct adapters one engine step may run (vLLM's default 1)")
    p.add("--lora-runtime-loading", default=False, type=bool,
          help="load adapters at runtime: /v1/load_lora_adapter, and a request for one held elsewhere "
               "(vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
    p.add("--dp-size", default=1, type=int, aliases=("--data-parallel-size",),
          help="data-parallel attention ranks: one simulated engine each (its own KV cache, queue and KV events) "
               "behind this worker, registered and routed per rank (SGLang's --dp-size, vLLM's and Dynamo's mocker's "
               "--data-parallel-size)")
    add_media_flags(p)
    add_job_flags(p)
    args = p.parse(argv)
    modalities = tuple(dict.fromkeys(m.strip() for m in args.input_modalities.split(",") if m.strip()))
    worker = dataclasses.replace(worker_config_from_args(args, "mocker"), input_modalities=modalities)
    engine = MockerEngineConfig(
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_num_seqs=args.max_num_seqs,
        max_waiting=args.max_waiting,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_chunked_prefill=args.enable_chunked_prefill,
        speedup_ratio=args.speedup_ratio,
        context_length=worker.context_length,
        script=args.script,
        output_text=args.output_text,
        input_modalities=modalities,
        image_tokens=args.image_tokens,
        audio_tokens=args.audio_tokens,
        kv_block_bytes=args.kv_block_bytes,
        kv_transfer_bandwidth_gbs=args.kv_transfer_bandwidth_gbs,
        kv_hold_timeout_s=args.kv_hold_timeout_s,
        kv_transfer_overlap=args.kv_transfer_overlap,
        **{field: getattr(args, field) for _, field, _ in TIMING_FLAGS},
    )
    errors: list[str] = []
    modules, module_errors = parse_lora_modules([m for m in args.lora_modules.split(",") if m.strip()])
    errors += module_errors
    lora = LoraSettings(args.max_loras if args.enable_lora else 0, args.lora_runtime_loading, modules)
    if not args.enable_lora and (modules or args.lora_runtime_loading):
        errors.append("--lora-modules and --lora-runtime-loading need --enable-lora")
    if args.enable_lora and args.max_loras <= 0:
        errors.append("--max-loras must be positive")
    media = media_config_from_args(args, args.speedup_ratio, errors)
    jobs = job_limits_from_args(args)
    errors += worker.validate(text_model=media is None) + engine.validate() + jobs.validate()
    if args.dp_size < 1:
        errors.append("--dp-size must be positive")
    elif args.dp_size > 1 and (media is not None or worker.role == "prefill"):
        # A prefill leg's held blocks are served per worker (KvTransferService), not per rank.
        errors.append("--dp-size above 1 serves text models in --disaggregation-mode agg or decode only")
    if errors:
        raise ConfigError(errors)
    return MockerConfig(worker=worker, engine=engine, media=media, jobs=jobs, lora=lora, dp_size=args.dp_size)
