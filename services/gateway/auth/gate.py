"""The gate: which key a call presents, whether it may pass, and what it used.

One ``Gate`` per gateway process (``--auth``). It follows the keys bucket (store.py) into a dict, so a key
is looked up in memory; a limited key's request costs one compare-and-set on the quota bucket when it is
admitted (``admit``), one when its prompt is known, at most one a second while it streams, and one when it
ends (``Ticket``). Token charges and the release run as tasks of their own: a NATS hiccup never fails a
stream already answering, it only delays the count.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from services.common.errors import NotFound
from services.common.nats_store import StoreUnavailable
from services.gateway.auth import quota
from services.gateway.auth.errors import RateLimited, Unauthenticated
from services.gateway.auth.keys import ANONYMOUS, KeyRecord, hash_secret, presented_secret
from services.gateway.auth.quota import Refusal, Snapshot
from services.gateway.auth.store import AuthStore
from services.gateway.auth.usage import Usage

log = logging.getLogger(__name__)

# A streamed request's tokens are charged to its key at most this often (and once more when it ends).
CHARGE_EVERY_S = 1.0


@dataclasses.dataclass(frozen=True)
class Api:
    """How a front end's callers present keys and read their limits: ``x_api_key`` (Anthropic's header, besides
    Bearer) and ``rate_headers`` (the response headers a limited key's responses carry)."""

    name: str
    x_api_key: bool = False
    rate_headers: Callable[[Snapshot, float], tuple[tuple[str, str], ...]] = lambda s, now: ()


OPENAI_API = Api("openai", rate_headers=lambda s, now: quota.openai_headers(s))
ANTHROPIC_API = Api("anthropic", x_api_key=True, rate_headers=quota.anthropic_headers)
GRPC_API = Api("grpc")


class Gate:
    def __init__(self, store: AuthStore, usage: Usage, *, wait_s: float = 5.0):
        self.store = store
        self.usage = usage
        self.replica = usage.replica
        self.synced = asyncio.Event()
        self._wait_s = wait_s
        self._keys: dict[str, KeyRecord] = {}  # hash of the secret -> its record
        self._tasks: set[asyncio.Task[Any]] = set()

    def apply(self, digest: str, value: bytes | None) -> None:
        """One change of the keys bucket (store.follow_keys)."""
        if value is None:
            self._keys.pop(digest, None)
            return
        try:
            self._keys[digest] = KeyRecord.from_json(value)
        except (ValueError, TypeError, KeyError) as e:
            log.error("bad key record under %s...: %s", digest[:12], e)

    async def run(self) -> None:
        await self.store.follow_keys(self.apply, self.synced)

    def by_key_id(self, key_id: str) -> KeyRecord | None:
        return next((r for r in self._keys.values() if r.key_id == key_id), None)

    async def lookup(self, call_headers: Mapping[str, str], api: Api) -> KeyRecord:
        """The record of the key the call presents; ``Unauthenticated`` for none or an unknown one."""
        if not self.synced.is_set():  # the first view of the keys: a gateway that just started waits for it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait_s):
                    await self.synced.wait()
            if not self.synced.is_set():
                # Where NATS is stays in the log: a client's error names no internal address.
                log.warning("the key store (NATS at %s) is not reachable", self.store.nats_url)
                raise StoreUnavailable("The API keys cannot be checked right now; try again.")
        secret = presented_secret(dict(call_headers), anthropic=api.x_api_key)
        record = self._keys.get(hash_secret(secret)) if secret else None
        if record is None:
            self.usage.rejected(ANONYMOUS, "invalid_api_key")
            raise Unauthenticated(presented=bool(secret))
        return record

    async def admit(self, call_headers: Mapping[str, str], api: Api, *, metered: bool) -> Ticket:
        """Checks the call's key and, for a ``metered`` request (one that generates), its quotas; the ticket
        follows the request to its end. Raises ``Unauthenticated`` or ``RateLimited``."""
        record = await self.lookup(call_headers, api)
        if not metered:
            return Ticket(self, record, api, None, metered=False)
        left: Snapshot | None = None
        if record.limited:
            out = await self.store.change_quota(
                record.key_id, lambda state, now: quota.admit(state, record, self.replica, now))
            if isinstance(out, Refusal):
                self.usage.rejected(record.tenant, out.reason)
                raise RateLimited(out.message, limit=out.reason, retry_after_s=out.retry_after_s, quota=out.quota)
            left = quota.snapshot(out, record, time.time())
        self.usage.admitted(record.tenant)
        return Ticket(self, record, api, left, metered=True)

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Lets the charges and releases under way finish (briefly), then stops."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)


class Ticket:
    """One admitted request: its key, the headers its response carries, and its token charges."""

    def __init__(self, gate: Gate, record: KeyRecord, api: Api, left: Snapshot | None, *, metered: bool):
        self.record = record
        self._gate = gate
        self._api = api
        self._left = left
        self._metered = metered
        self._charged = 0
        self._last_charge = 0.0
        self._closed = False

    def check_model(self, model: str) -> None:
        """The 404 of a model that does not exist, for one outside the key's ``--models``. "" passes: a call that
        names no model (a stored file's download, an extension route) has none to check."""
        if model and not self.record.allows(model):
            self._gate.usage.rejected(self.record.tenant, "model")
            raise NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")

    def headers(self) -> tuple[tuple[str, str], ...]:
        """The rate-limit headers of a limited key's response (none for a key without limits)."""
        return () if self._left is None else self._api.rate_headers(self._left, time.time())

    def _charge(self, tokens: int, *, release: bool) -> None:
        record, replica = self.record, self._gate.replica

        async def write() -> None:
            try:
                await self._gate.store.change_quota(
                    record.key_id, lambda state, now: quota.charged(state, tokens, replica, now, release=release))
            except Exception as e:  # noqa: BLE001 - the answer went out; the count is what is late
                log.warning("could not charge %d tokens to %s: %s", tokens, record.key_id, e)
        self._gate.spawn(write())

    def progress(self, prompt_tokens: int, completion_tokens: int) -> None:
        """A streamed request's tokens so far (called per batch: one clock read unless a charge is due)."""
        if self._left is None or not self.record.tpm:
            return
        used = prompt_tokens + completion_tokens
        now = time.monotonic()
        # The prompt at once (it is what the next admission must see), then at most once per CHARGE_EVERY_S.
        if used > self._charged and (not self._charged or now - self._last_charge >= CHARGE_EVERY_S):
            self._charge(used - self._charged, release=False)
            self._charged, self._last_charge = used, now

    def close(self, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """The request ended (however it did): the rest of its tokens charged, its concurrency slot freed."""
        if self._closed:
            return
        self._closed = True
        if self._metered:
            self._gate.usage.used(self.record.tenant, prompt_tokens, completion_tokens)
        if self._left is not None:
            self._charge(max(prompt_tokens + completion_tokens - self._charged, 0), release=True)
