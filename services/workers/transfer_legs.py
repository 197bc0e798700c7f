"""Which leg of a disaggregated request an engine is given, from ``EngineRequest.kv_transfer_params`` (shaped like
vLLM's ``kv_transfer_params``: services/workers/convert.py fills ``{"do_remote_decode": true}`` into a prefill leg
that brought nothing). Engine-neutral: the vLLM and SGLang adapters map each leg onto their engine's transfer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

DO_REMOTE_DECODE = "do_remote_decode"
DO_REMOTE_PREFILL = "do_remote_prefill"


class Leg(enum.Enum):
    WHOLE = "whole"  # an ordinary request (or a decode leg whose blocks the engine finds by content)
    PREFILL = "prefill"
    DECODE = "decode"


def leg(params: Mapping[str, Any] | None) -> Leg:
    """Which leg ``params`` make of a request."""
    if not params:
        return Leg.WHOLE
    if params.get(DO_REMOTE_DECODE) is True:
        return Leg.PREFILL
    return Leg.DECODE
