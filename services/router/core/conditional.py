"""Conditional disaggregation: whether a request that could be split runs aggregated on its decode worker.

Dynamo's flags and meanings (1.6.1, ``--router-conditional-disagg``, ``--router-conditional-disagg-config``,
``--enforce-disagg``); see docs/architecture.md, "Disaggregated prefill and decode". The effective input
length (``eff_isl``) is the prompt minus the decode worker's cached prefix: what that worker would have
to compute itself if the request stayed aggregated.

Policies (which conditions keep a request aggregated):

- ``isl_bounding``: ``eff_isl < eff_isl_threshold`` and ``eff_isl / prompt < eff_isl_ratio_threshold``
  (little to compute, and most of it cached: reason ``cached_prompt``);
- ``prefill_load``: the chosen prefill worker has more than ``prefill_busy_threshold`` x its
  ``max_num_batched_tokens`` waiting (reason ``prefill_busy``); unknown capacity counts as calm;
- ``isl_or_load``: either.

Meshfront adds ``max_local_prefill_length`` (Dynamo 0.x's name, 0 = off) to the ISL policies: an
``eff_isl`` of at most that many tokens stays aggregated whatever its ratio (reason ``short_prompt``).
Whatever keeps a request aggregated, ``decode_busy_threshold`` (unset = off) vetoes it when the decode
worker's projected active blocks exceed that fraction of its ``total_kv_blocks`` (unknown capacity
vetoes too): the request is split after all (reason ``decode_busy``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

POLICIES = ("isl_bounding", "prefill_load", "isl_or_load")
_ISL_POLICIES = ("isl_bounding", "isl_or_load")
_LOAD_POLICIES = ("prefill_load", "isl_or_load")

# The reasons a route gives (RouteResponse.disaggregation_reason, meshfront_router_disagg_decisions_total).
DISAGGREGATED = "disaggregated"
PINNED_PREFILL = "pinned_prefill"
DECODE_BUSY = "decode_busy"
NO_PREFILL_WORKERS = "no_prefill_workers"
SHORT_PROMPT = "short_prompt"
CACHED_PROMPT = "cached_prompt"
PREFILL_BUSY = "prefill_busy"
PINNED_WORKER = "pinned_worker"
PREFILL_UNAVAILABLE = "prefill_unavailable"
SPLIT_REASONS = (DISAGGREGATED, PINNED_PREFILL, DECODE_BUSY)
AGGREGATED_REASONS = (NO_PREFILL_WORKERS, SHORT_PROMPT, CACHED_PROMPT, PREFILL_BUSY, PINNED_WORKER,
                      PREFILL_UNAVAILABLE)
REASONS = SPLIT_REASONS + AGGREGATED_REASONS


@dataclasses.dataclass(frozen=True)
class DisaggSettings:
    """The router's disaggregation flags (services/router/config.py)."""

    conditional: bool = False  # --router-conditional-disagg
    policy: str = "isl_bounding"
    eff_isl_threshold: int = 2048
    eff_isl_ratio_threshold: float = 0.7
    prefill_busy_threshold: float | None = None
    decode_busy_threshold: float | None = None
    max_local_prefill_length: int = 0
    enforce: bool = False  # --enforce-disagg: never aggregated for want of a prefill worker

    def errors(self) -> list[str]:
        flag = "--router-conditional-disagg-config"
        errors = []
        if self.policy not in POLICIES:
            errors.append(f"{flag} policy {self.policy!r} must be one of {', '.join(POLICIES)}")
        if self.eff_isl_threshold < 0:
            errors.append(f"{flag} eff_isl_threshold must be >= 0")
        if not 0.0 <= self.eff_isl_ratio_threshold <= 1.0:
            errors.append(f"{flag} eff_isl_ratio_threshold must be in [0.0, 1.0]")
        if self.prefill_busy_threshold is not None and self.prefill_busy_threshold < 0:
            errors.append(f"{flag} prefill_busy_threshold must be >= 0")
        if self.decode_busy_threshold is not None and not 0.0 <= self.decode_busy_threshold <= 1.0:
            errors.append(f"{flag} decode_busy_threshold must be in [0.0, 1.0]")
        if self.max_local_prefill_length < 0:
            errors.append(f"{flag} max_local_prefill_length must be >= 0")
        if self.conditional and self.policy in _LOAD_POLICIES and self.prefill_busy_threshold is None:
            # Dynamo inherits --router-queue-threshold here; Meshfront has none, so the key is required.
            errors.append(f"{flag} policy {self.policy!r} needs prefill_busy_threshold")
        return errors


_KEYS: dict[str, tuple[type, ...]] = {
    "policy": (str,), "eff_isl_threshold": (int,), "eff_isl_ratio_threshold": (int, float),
    "prefill_busy_threshold": (int, float), "decode_busy_threshold": (int, float),
    "max_local_prefill_length": (int,),
}


def parse_settings(conditional: bool, config_json: str, enforce: bool) -> DisaggSettings:
    """The settings from the flags; raises ValueError naming every bad key or value."""
    raw: Any = {}
    if config_json.strip():
        try:
            raw = orjson.loads(config_json)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"--router-conditional-disagg-config is not JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError("--router-conditional-disagg-config must be a JSON object")
    errors = [f"--router-conditional-disagg-config has no key {k!r} (keys: {', '.join(_KEYS)})"
              for k in raw if k not in _KEYS]
    errors += [f"--router-conditional-disagg-config {k} must be a {' or '.join(t.__name__ for t in _KEYS[k])}"
               for k, v in raw.items() if k in _KEYS and (isinstance(v, bool) or not isinstance(v, _KEYS[k]))]
    if errors:
        raise ValueError("; ".join(errors))
    settings = DisaggSettings(conditional=conditional, enforce=enforce, **raw)
    errors = settings.errors()
    if errors:
        raise ValueError("; ".join(errors))
    return settings


@dataclasses.dataclass(frozen=True)
class SplitInput:
    """What the conditional decision looks at, for one request and its chosen pair."""

    prompt_tokens: int
    decode_cached_tokens: int  # the decode worker's cached prefix of the prompt, in tokens
    prefill_waiting_tokens: int  # prefill tokens already waiting on the chosen prefill worker
    prefill_batch_tokens: int  # its max_num_batched_tokens (0: unknown)
    decode_active_blocks: int  # the decode worker's active blocks with this request's added
    decode_total_blocks: int  # its total_kv_blocks (0: unknown)


def decide(settings: DisaggSettings, x: SplitInput) -> str:
    """The reason for this request's shape: one of ``SPLIT_REASONS`` or the conditional bypasses."""
    if not settings.conditional:
        return DISAGGREGATED
    bypass = _bypass(settings, x)
    if bypass is None:
        return DISAGGREGATED
    veto = settings.decode_busy_threshold
    if veto is not None and (x.decode_total_blocks <= 0 or x.decode_active_blocks > veto * x.decode_total_blocks):
        return DECODE_BUSY
    return bypass


def _bypass(s: DisaggSettings, x: SplitInput) -> str | None:
    eff_isl = max(0, x.prompt_tokens - x.decode_cached_tokens)
    if s.policy in _ISL_POLICIES:
        if eff_isl < s.eff_isl_threshold and eff_isl / max(x.prompt_tokens, 1) < s.eff_isl_ratio_threshold:
            return CACHED_PROMPT  # Dynamo's rule first: a mostly cached prompt is that, however short
        if s.max_local_prefill_length and eff_isl <= s.max_local_prefill_length:
            return SHORT_PROMPT
    if s.policy in _LOAD_POLICIES and s.prefill_busy_threshold is not None and x.prefill_batch_tokens > 0 \
            and x.prefill_waiting_tokens > s.prefill_busy_threshold * x.prefill_batch_tokens:
        return PREFILL_BUSY
    return None
