"""What a worker registers about itself: its ``WorkerCard`` (and the ``ModelCard`` in it), as JSON in the worker
bucket (services/common/discovery.py keeps the bucket; this module is the cards alone, no NATS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import orjson

from services.common.dp_ranks import ranks_of
from services.common.namespace import DEFAULT as DEFAULT_NAMESPACE

# The OpenAI endpoints a model card may list. A generating model serves the first two; an embedding
# model (services/workers/embed) only the third; a media model (the mocker's media kind, `meshfront
# diffusers`) IMAGES or VIDEOS. That is how the gateway tells the kinds apart.
CHAT, COMPLETIONS, EMBEDDINGS = "chat", "completions", "embeddings"
IMAGES, VIDEOS = "images", "videos"


@dataclasses.dataclass(frozen=True)
class MediaLimits:
    """What a media model accepts, so that the gateway refuses the rest with a 400 before routing."""

    max_width: int = 2048
    max_height: int = 2048
    # Sizes are multiples of this (a latent's downsampling factor: 8 for a VAE).
    size_multiple: int = 8
    default_width: int = 1024
    default_height: int = 1024
    max_n: int = 10
    default_steps: int = 30
    max_steps: int = 100
    output_formats: tuple[str, ...] = ("png", "jpeg", "webp")
    # Videos only (0 for an image model).
    default_fps: float = 0.0
    max_frames: int = 0
    default_frames: int = 0
    # Whether the model takes an input image (image-to-image, edits, a video's first frame).
    takes_image: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MediaLimits:
        return cls(**{**d, "output_formats": tuple(d.get("output_formats", ("png", "jpeg", "webp")))})


@dataclasses.dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter a worker holds: requests name it as their ``model`` (docs/lora.md)."""

    name: str
    # Its PEFT directory, as the worker loaded it; a worker that loads adapters at runtime loads a
    # request's adapter from here when it does not hold it yet.
    path: str


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """What a worker serves and what the mesh needs to serve it."""

    name: str
    model_dir: str
    context_length: int = 0
    block_size: int = 16
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    # CHAT and/or COMPLETIONS for a generating model; (EMBEDDINGS,) for an embedding model. Cards
    # written before embeddings existed lack the field and read as a generating model.
    endpoints: tuple[str, ...] = (CHAT, COMPLETIONS)
    # Media the worker's engine takes in chat messages besides text: "image", "audio".
    input_modalities: tuple[str, ...] = ()
    # A media model's limits (endpoints IMAGES or VIDEOS); None for every other kind.
    media: MediaLimits | None = None
    # The digest of the model's tokenizer/template/config files in the NATS Object Store
    # (services/common/model_files.py), so that no stage but the worker needs model_dir; empty: none published.
    model_files: str = ""
    # LoRA adapters of this base model the worker holds now (cards change as adapters load and unload).
    lora_adapters: tuple[LoraAdapter, ...] = ()
    # Tool-call structural tags (the worker's --dyn-structural-tag; docs/parsers.md, "Structural tags"): "on" or
    # "off", Dynamo's scope ("auto" | "always") and schema mode ("auto" | "strict"). Older cards read as off.
    structural_tag_mode: str = "off"
    structural_tag_scope: str = "always"
    structural_tag_schema: str = "auto"
    # The deployment's default thinking mode for chat templates (the worker's --dyn-default-thinking-mode):
    # "enabled", "disabled", or "" for none; a request's own thinking settings win (preprocessor core/thinking.py).
    default_thinking_mode: str = ""

    def serves(self, endpoint: str) -> bool:
        return endpoint in self.endpoints

    @property
    def is_embedding(self) -> bool:
        return EMBEDDINGS in self.endpoints

    @property
    def is_media(self) -> bool:
        """An image or video model: no tokenizer, no chat template, no KV cache to route by."""
        return IMAGES in self.endpoints or VIDEOS in self.endpoints


# A worker's part in disaggregated serving (docs/architecture.md, "Disaggregated prefill and decode"):
# PREFILL workers run only prefill legs (one output token, the blocks held for a transfer); DECODE
# workers run decode legs and the requests the router keeps aggregated; BOTH (every worker before
# roles existed) runs whole requests, and may be given a decode leg.
PREFILL, DECODE, BOTH = "prefill", "decode", "both"
ROLES = (PREFILL, DECODE, BOTH)
# Who serves KvTransferService.ReleaseKv for a prefill worker's held blocks (the postprocessor sends it the prefill
# leg's kv_transfer_params): the prefill worker itself (the mocker's holds), or the decode worker of the pair
# (vLLM 0.32 frees a prefill's held blocks only through the decode side's notify_kv_transfer_request_rejected:
# docs/engines.md, "Disaggregation").
KV_RELEASE_BY_PREFILL, KV_RELEASE_BY_DECODE = "prefill", "decode"
KV_RELEASE_BY = (KV_RELEASE_BY_PREFILL, KV_RELEASE_BY_DECODE)
# The services of SMG's engine proto a card's address may serve (WorkerCard.engine_protocol), named as the
# proto packages name them: vLLM's --grpc, SGLang's --grpc-mode, TensorRT-LLM's --grpc.
VLLM_ENGINE, SGLANG_SCHEDULER, TRTLLM_SERVICE = "vllm_engine", "sglang_scheduler", "trtllm_service"
ENGINE_PROTOCOLS = (VLLM_ENGINE, SGLANG_SCHEDULER, TRTLLM_SERVICE)


@dataclasses.dataclass(frozen=True)
class WorkerCard:
    """One worker instance as registered in the bucket."""

    worker_id: str
    address: str
    model: ModelCard
    kind: str = "mocker"
    total_kv_blocks: int = 0
    max_num_batched_tokens: int = 0
    max_num_seqs: int = 0  # sequences one engine runs at once (Dynamo's model_max_num_seqs); 0: not said
    # PREFILL, DECODE or BOTH; cards written before roles existed lack the field and read as BOTH.
    role: str = BOTH
    # Distinct LoRA adapters one engine step may run (vLLM's --max-loras); 0: LoRA is off on this worker.
    max_loras: int = 0
    # The worker loads an adapter it does not hold when a request or /v1/load_lora_adapter asks.
    lora_runtime_loading: bool = False
    # Which worker of a disaggregated pair frees the KV blocks this one holds as a prefill worker for a decode
    # leg that will not come (KV_RELEASE_BY_*): the engine's choice, fixed at registration.
    kv_release_by: str = KV_RELEASE_BY_PREFILL
    # The namespace it registered in (services/common/namespace.py): its KV events' and dumps' subjects.
    namespace: str = DEFAULT_NAMESPACE
    # Data-parallel attention ranks (services/common/dp_ranks.py), Dynamo's runtime-config names: one engine per
    # rank start..start+size-1 behind this address, each routed to, cached and loaded on its own. Size 1 from 0:
    # no ranks (cards written before ranks existed lack both and read so).
    data_parallel_start_rank: int = 0
    data_parallel_size: int = 1
    # Which protocol ``address`` serves: "" is Meshfront's own worker proto (meshfront.worker.v1); one of
    # ENGINE_PROTOCOLS is SMG's engine proto (PyPI smg-grpc-proto) with that service, a stock engine's own gRPC
    # attached by address (docs/engine-grpc.md). Cards written before it existed lack it and read as "".
    engine_protocol: str = ""
    # The sampling defaults an engine attached over its own proto advertises (its model's generation config:
    # GetModelInfo's default_sampling_params_json), as (knob, value) pairs: the mesh fills the knobs a request
    # leaves unset with them, as vLLM's own server and our workers do. Empty for our workers, whose engine applies
    # them itself.
    sampling_defaults: tuple[tuple[str, float], ...] = ()
    # Whether the worker publishes its KV events (a worker started with --no-kv-events, or a kind without a prefix
    # cache, does not): a kv router indexes nothing of such a worker and says so. Older cards read as publishing.
    kv_events: bool = True

    @property
    def dp_ranks(self) -> Sequence[int] | None:
        """Its ranks, or None for a worker without data-parallel ranks."""
        return ranks_of(self.data_parallel_start_rank, self.data_parallel_size)

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> WorkerCard:
        d = orjson.loads(raw)
        m = d.pop("model")
        m["endpoints"] = tuple(m.get("endpoints", (CHAT, COMPLETIONS)))
        m["input_modalities"] = tuple(m.get("input_modalities", ()))
        if m.get("media") is not None:
            m["media"] = MediaLimits.from_dict(m["media"])
        m["lora_adapters"] = tuple(LoraAdapter(**a) for a in m.get("lora_adapters", ()))
        if d.get("role", BOTH) not in ROLES:
            raise ValueError(f"unknown worker role {d['role']!r}")
        if d.get("kv_release_by", KV_RELEASE_BY_PREFILL) not in KV_RELEASE_BY:
            raise ValueError(f"unknown kv_release_by {d['kv_release_by']!r}")
        if d.get("engine_protocol", "") not in ("", *ENGINE_PROTOCOLS):
            raise ValueError(f"unknown engine_protocol {d['engine_protocol']!r}")
        if d.get("data_parallel_size", 1) < 1 or d.get("data_parallel_start_rank", 0) < 0:
            raise ValueError("data_parallel_size must be >= 1 and data_parallel_start_rank >= 0")
        d["sampling_defaults"] = tuple((str(k), float(v)) for k, v in d.get("sampling_defaults", ()))
        return cls(model=ModelCard(**m), **d)


def adapter_of(name: str, cards: Sequence[WorkerCard]) -> LoraAdapter | None:
    """The LoRA adapter named ``name`` on the first of ``cards`` (those serving ``name``); None when ``name``
    is their base model."""
    if not cards or cards[0].model.name == name:
        return None
    return next((a for a in cards[0].model.lora_adapters if a.name == name), None)
