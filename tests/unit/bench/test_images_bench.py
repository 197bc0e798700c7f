"""``python -m bench images``: the legs take turns in rounds, each over the same images, and the table's
overhead is against the in-process leg."""

from __future__ import annotations

import pytest

from bench.cli import parse_args
from bench.images import ImageBenchConfig, ImageRow, markdown_table, measure

pytestmark = pytest.mark.unit


async def test_the_legs_alternate_in_rounds_over_the_same_images():
    calls: list[tuple[str, int]] = []

    def leg(name: str):
        async def one(i: int) -> None:
            calls.append((name, i))
        return one

    cfg = ImageBenchConfig(legs=("direct", "worker"), images=4, warmup=1, rounds=2)
    rows = await measure(cfg, {"direct": leg("direct"), "worker": leg("worker")})
    assert calls == [("direct", 0), ("worker", 0),  # warm-up
                     ("direct", 0), ("direct", 1), ("worker", 0), ("worker", 1),  # round 1
                     ("worker", 2), ("worker", 3), ("direct", 2), ("direct", 3)]  # round 2: the other leg first
    assert [(r.leg, r.images) for r in rows] == [("direct", 4), ("worker", 4)]


def test_the_table_gives_each_legs_overhead_over_direct():
    table = markdown_table([ImageRow("direct", 10, 1.0, 0.1, 0.1), ImageRow("worker", 10, 1.05, 0.1, 0.2)])
    assert "| worker | 10 | 9.52 | 105.0 | 100.0 | 200.0 | +5.0 ms (5.0 %) |" in table


def test_the_images_scenario_parses():
    args = parse_args(["images", "--legs", "direct,mesh", "--images", "8", "--rounds", "4"])
    assert (args.scenario, args.legs, args.images, args.rounds) == ("images", "direct,mesh", 8, 4)
