"""Per-tenant usage: this replica's running totals, its /metrics families, and their copy in NATS.

Totals are per tenant (so the series are bounded by the number of keys, plus ``_anonymous`` for calls
refused before a key was known): requests admitted, prompt and completion tokens, and rejections by reason
(``invalid_api_key``, ``model``, ``requests``, ``tokens``, ``concurrency``). /metrics shows them as
``meshfront_tenant_*_total`` counters. Each replica also keeps them in the usage bucket under
``<tenant>.<replica>`` (store.py), written at most once per ``FLUSH_S`` and only after a change (an idle
gateway writes nothing); ``meshfront keys usage`` sums every replica's, dead ones included, so a total never
goes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Iterator

import orjson
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

FLUSH_S = 1.0
REASONS = ("invalid_api_key", "model", "requests", "tokens", "concurrency")


@dataclasses.dataclass
class Totals:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> Totals:
        raw = orjson.loads(data)
        return cls(int(raw["requests"]), int(raw["prompt_tokens"]), int(raw["completion_tokens"]),
                   {str(k): int(v) for k, v in raw["rejected"].items()})

    def add(self, other: Totals) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        for reason, n in other.rejected.items():
            self.rejected[reason] = self.rejected.get(reason, 0) + n


def summed(entries: Iterable[tuple[str, bytes]]) -> dict[str, Totals]:
    """Per-tenant totals of usage records (``<tenant>.<replica>`` -> JSON), summed over replicas."""
    out: dict[str, Totals] = {}
    for key, value in entries:
        tenant = key.partition(".")[0]
        out.setdefault(tenant, Totals()).add(Totals.from_json(value))
    return out


def replica_id(name: str) -> str:
    """A key token for this process: its replica's name (host:port) made KV-safe, and a random suffix, so that a
    restarted replica starts a record of its own instead of overwriting (and so losing) its last life's."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] + "-" + secrets.token_hex(4)


class Usage(Collector):
    """This process's totals; ``put(key, json)`` stores one tenant's record in NATS (``run`` calls it)."""

    def __init__(self, replica: str, put: Callable[[str, bytes], Awaitable[None]]):
        self.replica = replica_id(replica)
        self._put = put
        self.totals: dict[str, Totals] = {}
        self._dirty: set[str] = set()
        self._changed = asyncio.Event()

    def _of(self, tenant: str) -> Totals:
        self._dirty.add(tenant)
        self._changed.set()
        found = self.totals.get(tenant)
        if found is None:
            found = self.totals[tenant] = Totals()
        return found

    def admitted(self, tenant: str) -> None:
        self._of(tenant).requests += 1

    def used(self, tenant: str, prompt_tokens: int, completion_tokens: int) -> None:
        if prompt_tokens or completion_tokens:
            totals = self._of(tenant)
            totals.prompt_tokens += prompt_tokens
            totals.completion_tokens += completion_tokens

    def rejected(self, tenant: str, reason: str) -> None:
        totals = self._of(tenant)
        totals.rejected[reason] = totals.rejected.get(reason, 0) + 1

    async def run(self) -> None:
        """Writes changed tenants' records, at most once per ``FLUSH_S``; sleeps on an event while idle."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            dirty, self._dirty = self._dirty, set()
            try:
                for tenant in sorted(dirty):
                    await self._put(f"{tenant}.{self.replica}", self.totals[tenant].to_json())
            except Exception as e:  # noqa: BLE001 - NATS away: keep the totals, write them with the next change
                log.warning("could not store usage (%s); retrying", e)
                self._dirty |= dirty
                self._changed.set()
            await asyncio.sleep(FLUSH_S)

    def collect(self) -> Iterator[CounterMetricFamily]:
        requests = CounterMetricFamily("meshfront_tenant_requests", "Requests admitted, by tenant", labels=["tenant"])
        prompt = CounterMetricFamily("meshfront_tenant_prompt_tokens", "Prompt tokens charged, by tenant",
                                     labels=["tenant"])
        completion = CounterMetricFamily("meshfront_tenant_completion_tokens", "Completion tokens charged, by tenant",
                                         labels=["tenant"])
        rejections = CounterMetricFamily("meshfront_tenant_rejections",
                                         "Requests refused by the key check or a quota, by tenant and reason",
                                         labels=["tenant", "reason"])
        for tenant, t in sorted(self.totals.items()):
            requests.add_metric([tenant], t.requests)
            prompt.add_metric([tenant], t.prompt_tokens)
            completion.add_metric([tenant], t.completion_tokens)
            for reason, n in sorted(t.rejected.items()):
                rejections.add_metric([tenant, reason], n)
        yield from (requests, prompt, completion, rejections)
