"""Disaggregated prefill and decode on SGLang: its bootstrap-based KV transfer as the legs' ``kv_transfer_params``
(pure: no sglang import, so it unit-tests anywhere; tests/engine_env/sglang checks the names against SGLang's).

SGLang moves a request's KV from a prefill server to a decode server (SGLang's ``--disaggregation-mode
prefill|decode``, ``--disaggregation-transfer-backend mooncake|nixl|...``). The two sides meet at the prefill
server's bootstrap server (``--disaggregation-bootstrap-port``, 8998, bound on SGLang's ``--host``): a request
names it with ``bootstrap_host``/``bootstrap_port`` and a ``bootstrap_room``, a 63-bit id both sides share
(``GenerateReqInput``'s own fields, which ``Engine.async_generate`` takes). The mapping:

- the worker's ``--disaggregation-mode`` is passed on as SGLang's (``agg`` is SGLang's ``null``), and a prefill
  worker's ``--host`` as SGLang's, so that its bootstrap server listens where decode workers can reach it;
- **prefill leg** (``{"do_remote_decode": true}``): the worker names its own bootstrap server (its advertised
  host, SGLang's bootstrap port) and draws a room, unless the caller already chose all three (a caller that
  sets up both ends); it announces them in an output of its own, before SGLang sees the request (no tokens,
  ``{"do_remote_prefill": true, "bootstrap_host", "bootstrap_port", "bootstrap_room"}``), submits with them,
  and its last output returns the same;
- **decode leg**: those three, checked, become the decode request's fields; parameters without them are
  ``KvTransferFailed``, so the caller prefills again.

SGLang's protocol is not vLLM's in one respect the caller must honour (docs/engines.md, "Disaggregation"): its
prefill server holds a request in its bootstrap queue until the decode server has connected for the same room,
and returns the first token only after the KV went over. SGLang's own router therefore sends both legs at
once; a caller that waited for the prefill leg's last output before starting the decode leg would wait until
SGLang's bootstrap timeout. The announcing output is what tells the postprocessor to open the decode leg at
once, on the prefill leg's prompt (SGLang's decode server expects the KV of that prompt, and its output starts
with the first token, which comes over with the KV): services/postprocessor/disagg_paired.py.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from typing import Any, TypeGuard

from services.common.discovery import DECODE, PREFILL
from services.workers.engine import KvTransferFailed
from services.workers.transfer_legs import DO_REMOTE_PREFILL, Leg, leg

__all__ = ["Bootstrap", "Leg", "bootstrap_for", "leg", "sglang_mode"]

HOST, PORT, ROOM = "bootstrap_host", "bootstrap_port", "bootstrap_room"
ROOM_BITS = 63  # SGLang's router draws rooms in [0, 2**63)


def sglang_mode(disaggregation_mode: str) -> str:
    """SGLang's ``--disaggregation-mode`` for the worker's (prefill, decode or agg)."""
    return disaggregation_mode if disaggregation_mode in (PREFILL, DECODE) else "null"


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """Where one request's prefill and decode servers meet."""

    host: str
    port: int
    room: int

    def request_kwargs(self) -> dict[str, Any]:
        """``Engine.async_generate`` keyword arguments (``GenerateReqInput`` fields)."""
        return {HOST: self.host, PORT: self.port, ROOM: self.room}

    def returned_params(self) -> dict[str, Any]:
        """What a prefill leg hands its decode leg."""
        return {DO_REMOTE_PREFILL: True, **self.request_kwargs()}

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> Bootstrap:
        """Raises ``KvTransferFailed`` naming the field that is missing or malformed."""
        host, port, room = params.get(HOST), params.get(PORT), params.get(ROOM)
        if not isinstance(host, str) or not host:
            raise KvTransferFailed(f"the transfer parameters lack SGLang's {HOST}")
        if not _is_int(port) or not 0 < port < 65536:
            raise KvTransferFailed(f"the transfer parameters lack a valid {PORT}")
        if not _is_int(room) or not 0 <= room < 2**ROOM_BITS:
            raise KvTransferFailed(f"the transfer parameters lack a valid {ROOM}")
        return cls(host, port, room)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def bootstrap_for(params: Mapping[str, Any] | None, *, own_host: str, own_port: int) -> Bootstrap | None:
    """The bootstrap of a request with these ``kv_transfer_params``: a prefill leg's names this worker's server
    (``own_host``/``own_port``) and a fresh room unless the caller chose all three; a decode leg's are the
    ones its prefill leg returned; an ordinary request has none."""
    this = leg(params)
    if this is Leg.WHOLE or params is None:
        return None
    if this is Leg.PREFILL:
        if all(key in params for key in (HOST, PORT, ROOM)):
            return Bootstrap.parse(params)
        return Bootstrap(own_host, own_port, secrets.randbits(ROOM_BITS))
    return Bootstrap.parse(params)
