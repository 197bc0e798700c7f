"""Fakes and fixtures for the worker core tests: a fake clock, a recording KV listener, the demo tokenizer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from services.common.kv_events import StoredBlock
from services.models import default_test_model_dir
from services.workers.model_dir import load_tokenizer


class FakeClock:
    """Simulated time: ``sleep`` lets ready tasks run, then advances ``now`` without waiting.

    Yielding first mirrors a real sleep, during which consumers woken by the previous step run
    and observe the time at which their tokens were delivered.
    """

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        for _ in range(3):
            await asyncio.sleep(0)
        self.t += max(0.0, seconds)


class RecordingListener:
    """Records KV events in order as ("stored", [hashes], parent) / ("removed", [hashes]) / ("cleared",)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def stored(self, blocks: Sequence[StoredBlock], parent_hash: int | None) -> None:
        self.events.append(("stored", [b.block_hash for b in blocks], parent_hash))

    def removed(self, block_hashes: Sequence[int]) -> None:
        self.events.append(("removed", list(block_hashes)))

    def cleared(self) -> None:
        self.events.append(("cleared",))

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


@pytest.fixture(scope="session")
def model_dir():
    return default_test_model_dir()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def listener() -> RecordingListener:
    return RecordingListener()
