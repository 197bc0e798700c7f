"""bench/token_path.py: the all-in-one token path it times is the product's, and it streams every token."""

from __future__ import annotations

import pytest

from bench.token_path import run

pytestmark = pytest.mark.unit


async def test_times_every_token_of_every_request_through_the_product_path(demo_model_dir):
    # run() raises when a request sent fewer frames than tokens: the chain it times really streamed them.
    figures = await run(str(demo_model_dir), requests=3, tokens=5, rounds=2)
    assert len(figures) == 2 and all(f > 0 for f in figures)
