"""``python -m bench media-transfer``: the b64_json value is decoded as the body comes, in any split; the
memory rows are the idle median against the peak; the tables say what they measured."""

from __future__ import annotations

import base64
import os

import orjson
import pytest

from bench.cli import parse_args
from bench.media_transfer import B64Extractor, MemoryRow, TransferRow, memory_rows, memory_table, transfer_table

pytestmark = pytest.mark.unit


def _body(video: bytes) -> bytes:
    return orjson.dumps({"id": "video_1", "object": "video", "status": "completed",
                         "data": [{"output_format": "mp4", "fps": 8.0, "b64_json": base64.b64encode(video).decode()}],
                         "inference_time_s": 1.5})


@pytest.mark.parametrize("piece", [1, 3, 7, 64, 1 << 20])
def test_the_b64_value_is_decoded_whatever_the_split(piece):
    video = os.urandom(10_001)  # not a multiple of 3: the value ends in padding
    body = _body(video)
    extractor = B64Extractor()
    out = b"".join(extractor.feed(body[i:i + piece]) for i in range(0, len(body), piece))
    assert out == video and extractor.done
    assert extractor.head.startswith(b'{"id":"video_1"')


def test_a_body_without_the_value_is_not_done():
    extractor = B64Extractor()
    assert extractor.feed(b'{"error": {"message": "no"}}') == b"" and not extractor.done


def test_bad_base64_is_an_error():
    with pytest.raises(ValueError, match="bad base64"):
        B64Extractor().feed(b'{"b64_json":"ab!d"}')


def test_memory_rows_take_the_idle_median_and_the_peak():
    idle = [{"gateway-0": 100, "nats": 10}, {"gateway-0": 300, "nats": 10}, {"gateway-0": 200, "nats": 10}]
    during = [{"gateway-0": 250, "nats": 12}, {"gateway-0": 200 + 3 * (1 << 20)}]
    rows = memory_rows("url-download", idle, during)
    assert rows == [MemoryRow("url-download", "gateway-0", 200, 200 + 3 * (1 << 20)),
                    MemoryRow("url-download", "nats", 10, 12)]
    assert rows[0].chunks == 3.0
    assert MemoryRow("b64_json", "envoy", 500, 400).delta == 0  # freed below the baseline: nothing held


def test_the_tables_give_mb_per_s_of_the_body_and_memory_in_chunks():
    rows = [TransferRow("url-download", (50_000_000, 50_000_000, 50_000_000), (0.5, 1.0, 0.25), (0.6, 1.1, 0.3))]
    assert "| url-download | 3 | 50.0 | 100.0 (50.0-200.0) | 0.50 | 0.60 |" in transfer_table(rows)
    table = memory_table([MemoryRow("b64_json", "gateway-0", 64 << 20, (64 << 20) + (3 << 19))],
                         {"gateway-0": 80 << 20})
    assert "| gateway-0 | b64_json | 64.0 | 65.5 | 1.5 | 1.5 | 80.0 |" in table


def test_the_media_transfer_scenario_parses():
    args = parse_args(["media-transfer", "--legs", "url-store,url-download", "--frames", "12", "--downloads", "2"])
    assert (args.scenario, args.legs, args.frames, args.downloads) == ("media-transfer", "url-store,url-download",
                                                                       12, 2)
