"""The bench's two floors (bench/edge_floor.py, bench/split_floor.py), started as the bench starts them:
every stream they serve through Envoy reads, to the load generator, as a whole chat completion of the
length asked for, so the CPU per request they are measured with counts what a real request costs."""

from __future__ import annotations

import asyncio

import pytest

from bench.edge_floor import EdgeFloorMesh
from bench.loadgen import LoadSpec, run_load
from bench.prompts import PromptFactory
from bench.split_floor import SplitFloorMesh

pytestmark = pytest.mark.mesh


@pytest.mark.parametrize("floor", [EdgeFloorMesh, SplitFloorMesh], ids=["edge", "edge-split"])
def test_a_floor_serves_whole_streams_of_the_length_asked_through_envoy(floor, tmp_path):
    mesh = floor(tmp_path / "logs", speedup=10.0).start()
    try:
        spec = LoadSpec(url=mesh.url, model="meshfront/demo-qwen", concurrency=4, requests=12, max_tokens=24,
                        duration_s=30.0)
        load = asyncio.run(run_load(spec, PromptFactory(200, seed=7)))
    finally:
        problems = mesh.stop()
    assert not load.timed_out and len(load.results) == 12
    for result in load.results:
        assert result.done and not result.error, result.error
        assert result.content_events == 24 and result.completion_tokens == 24
        # The ticker (1 ms a step at speed-up 10) paces the tokens: they came in more than one arrival.
        assert len(result.arrivals) > 1
    assert not problems, problems
