"""The bounds on what one request's media may cost the mesh (flags --media-*; services/preprocessor/config.py)."""

from __future__ import annotations

import dataclasses

DEFAULT_MAX_BYTES = 20 * 1024 * 1024  # OpenAI's per-image limit
DEFAULT_MAX_ITEMS = 16
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_REDIRECTS = 3
DEFAULT_UUID_CACHE_BYTES = 256 * 1024 * 1024
DEFAULT_UUID_STORE_BYTES = 1024 * 1024 * 1024
DEFAULT_UUID_TTL_S = 3600.0
DEFAULT_MAX_AUDIO_S = 30.0  # Qwen2-Audio's window (Whisper's): what such a model hears of one clip
# Every item's bytes travel in the one request message a worker receives, whose gRPC limit is 64 MiB
# (services/common/grpc_server.py MAX_MESSAGE_BYTES): half of it for media leaves the prompt its room.
MAX_REQUEST_MEDIA_BYTES = 32 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class MediaLimits:
    # Most bytes of one item, fetched or inline (a data URL's or input_audio's decoded payload).
    max_bytes: int = DEFAULT_MAX_BYTES
    # Most media parts in one request (uuid references count).
    max_items: int = DEFAULT_MAX_ITEMS
    # Wall-clock bound on fetching one URL, its redirects included.
    timeout_s: float = DEFAULT_TIMEOUT_S
    # Most redirects one fetch follows.
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    # Fetch from private, loopback, link-local and other non-global addresses (off: refused with a 400).
    allow_private: bool = False
    # Bytes of media kept for parts that name only a uuid (least recently used dropped first; 0: none kept).
    uuid_cache_bytes: int = DEFAULT_UUID_CACHE_BYTES
    # Bytes of media by uuid in the NATS stream every preprocessor replica shares (uuid_store.py; oldest dropped
    # first; 0: not shared, each replica knows only the uuids it saw), and how long an item stays there.
    uuid_store_bytes: int = DEFAULT_UUID_STORE_BYTES
    uuid_ttl_s: float = DEFAULT_UUID_TTL_S
    # Longest input_audio clip decoded, in seconds (longer: 400, found while decoding).
    max_audio_s: float = DEFAULT_MAX_AUDIO_S
    # Most bytes of all of one request's media together (not a flag: bounded by the gRPC message size).
    max_total_bytes: int = MAX_REQUEST_MEDIA_BYTES

    def errors(self) -> list[str]:
        out = []
        if self.max_bytes <= 0 or self.max_items <= 0:
            out.append("--media-max-bytes and --media-max-items must be positive")
        if self.timeout_s <= 0:
            out.append("--media-fetch-timeout-s must be positive")
        if self.max_redirects < 0 or self.uuid_cache_bytes < 0 or self.uuid_store_bytes < 0:
            out.append("--media-max-redirects, --media-uuid-cache-bytes and --media-uuid-store-bytes must be >= 0")
        if self.uuid_ttl_s <= 0:
            out.append("--media-uuid-ttl-s must be positive")
        if self.max_audio_s <= 0:
            out.append("--media-max-audio-s must be positive")
        return out
