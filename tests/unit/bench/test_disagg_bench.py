"""``python -m bench disagg`` (bench/disagg.py): the mixed load and what each shape would start."""

from __future__ import annotations

import json
import pathlib

import pytest

from bench import cli, disagg, dynamo_peer
from bench.loadgen import LoadResult, LoadSpec, RequestResult

pytestmark = pytest.mark.unit


def test_the_mix_is_long_prompts_among_short_chats_the_same_for_every_shape():
    cfg = disagg.DisaggBenchConfig(long_share=0.25)
    prompts = disagg.MixedPrompts(cfg, 7)
    lengths = [len(prompts.next_prompt().split()) for _ in range(400)]
    long = [n for n in lengths if n >= cfg.long_min]
    assert all(cfg.long_min <= n <= cfg.long_max for n in long)
    assert all(cfg.short_min <= n <= cfg.short_max for n in lengths if n < cfg.long_min)
    assert 0.15 < len(long) / len(lengths) < 0.35
    again = disagg.MixedPrompts(cfg, 7)
    assert [len(again.next_prompt().split()) for _ in range(400)] == lengths  # one seed, one load


def test_the_same_worker_count_aggregated_and_disaggregated():
    assert disagg.disaggregation_modes(4, False) == ["agg"] * 4
    assert disagg.disaggregation_modes(4, True) == ["prefill", "decode", "decode", "decode"]
    with pytest.raises(ValueError, match="at least 2"):
        disagg.disaggregation_modes(1, True)


def test_the_overlap_shape_is_the_disaggregated_one_with_the_pipelined_transfer():
    cfg = disagg.DisaggBenchConfig(workers=3)
    seq, overlap = disagg.worker_specs(cfg, "disagg", "/m"), disagg.worker_specs(cfg, "disagg-overlap", "/m")
    assert [s.extra[s.extra.index("--disaggregation-mode") + 1] for s in overlap] == ["prefill", "decode", "decode"]
    assert all("--kv-transfer-overlap" in s.extra for s in overlap)
    assert [(*s.extra, "--kv-transfer-overlap") for s in seq] == [s.extra for s in overlap]


def test_dynamos_mockers_run_in_its_disaggregation_mode(tmp_path):
    procs = dict(dynamo_peer.commands(pathlib.Path("/venv/bin/python"), "/m", "org/demo", 3, 1.0, "kv", 4000, 4222,
                                      tmp_path, ["prefill", "decode", "decode"]))
    modes = [argv[argv.index("--disaggregation-mode") + 1] for name, argv in procs.items() if name.startswith("mocker")]
    assert modes == ["prefill", "decode", "decode"]
    plain = dict(dynamo_peer.commands(pathlib.Path("/p"), "/m", "org/demo", 2, 1.0, "kv", 4000, 4222, tmp_path))
    assert not any("--disaggregation-mode" in argv for argv in plain.values())


def test_the_long_context_copy_keeps_the_tokenizer_and_widens_the_window(tmp_path, monkeypatch, demo_model_dir):
    monkeypatch.setattr(disagg, "ROOT", tmp_path)
    out = disagg.long_context_model(pathlib.Path(demo_model_dir))
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == disagg.CONTEXT
    assert (out / "tokenizer.json").is_file()


def test_the_cli_takes_the_shapes_and_the_mix():
    args = cli.parse_args(["disagg", "--shape", "agg,disagg", "--long-words", "4000,6000", "--workers", "4"])
    assert (args.shape, args.long_words, args.workers) == ("agg,disagg", (4000, 6000), 4)


def test_the_cached_share_comes_from_the_workers_own_counters():
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    registry = CollectorRegistry()
    Counter("meshfront_worker_prompt_tokens", "", registry=registry).inc(1000)
    Counter("meshfront_worker_cached_prompt_tokens", "", registry=registry).inc(990)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        port = server.server_address[1]
        assert disagg.cache_counters([port, port]) == (2000.0, 1980.0)
    finally:
        server.shutdown()
        thread.join(5)


def test_our_mockers_run_at_dynamos_engine_speed(demo_model_dir):
    """Both sides on one timing model: our mockers get Dynamo 1.6.1's prefill polynomial (its decode one is ours),
    so a 6k-token prompt prefills in ~123 ms on both, not ~516 ms on ours; the output says so."""
    from services.workers.mocker.config import parse_config

    args = disagg.mocker_args(disagg.DisaggBenchConfig(speedup=1.0), "decode")
    engine = parse_config(["--model-dir", str(demo_model_dir), *args], env={}).engine
    assert engine.timing().prefill_ms(6000) == pytest.approx(16.50142 + 1.518344e-2 * 6000 + 4.209989e-7 * 6000**2)
    assert engine.timing().decode_ms(0) == pytest.approx(5.74) and engine.speedup_ratio == 1.0
    assert "Dynamo 1.6.1's mocker timing" in disagg.TIMING_MODEL


def test_the_handover_gap_is_reported_apart_from_the_later_itl():
    """A stream whose first token came at once and whose second waited out the handover (pull, transfer, the decode
    worker's next step): the first gap is reported on its own, and the ITL after it excludes it."""
    from bench.loadgen import LoadResult, LoadSpec, RequestResult

    def stream(handover_s: float) -> RequestResult:
        arrivals = [(0.0, 1), (handover_s, 1), *((handover_s + 0.01 * k, 1) for k in range(1, 5))]
        return RequestResult(start=0.0, end=1.0, first_token=0.0, arrivals=arrivals, content_events=6,
                             completion_tokens=6, done=True)

    spec = LoadSpec(url="http://x", model="m", concurrency=1, requests=3)
    load = LoadResult(spec, 0.0, 1.0, [stream(0.02), stream(0.04), stream(0.06)])
    handover, later = disagg.handover_split(load)
    assert handover == pytest.approx(40.0)
    assert later == pytest.approx(10.0)


def test_the_allinone_frontend_is_one_gateway_process_with_every_stage_in_it():
    args = cli.parse_args(["disagg", "--allinone", "--shape", "disagg"])
    assert args.allinone
    split = disagg.mesh_plan(disagg.DisaggBenchConfig(), "disagg", "/m")
    one = disagg.mesh_plan(disagg.DisaggBenchConfig(allinone=True), "disagg", "/m")
    assert not split.inproc and one.inproc
    assert {"preprocessor", "router", "postprocessor"} <= set(split.service_names())
    assert not {"preprocessor", "router", "postprocessor"} & set(one.service_names())


def _run(ttfts_ms: list[float], wall_s: float, cpu_ms: float) -> disagg.ShapeResult:
    spec = LoadSpec(url="http://x", model="m", concurrency=1, requests=len(ttfts_ms))
    results = [RequestResult(start=0.0, end=1.0, first_token=t / 1000, arrivals=[(t / 1000, 1), (t / 1000 + 0.01, 1)],
                             content_events=2, completion_tokens=2, done=True) for t in ttfts_ms]
    load = LoadResult(spec, 0.0, wall_s, results)
    return disagg.ShapeResult("disagg", len(results), len(results), wall_s, len(results) / wall_s, 0.0, {}, {},
                              cpu_ms, 1.0, 0.0, 0.0, 0.99, [], load)


def test_runs_of_several_seeds_pool_into_one_row_over_every_request():
    quiet = _run([100.0] * 99 + [150.0], wall_s=10.0, cpu_ms=40.0)
    slow = _run([200.0] * 50, wall_s=5.0, cpu_ms=10.0)
    row = disagg.pooled([quiet, slow])
    assert (row.ok, row.shape) == (150, "disagg, 2 seeds pooled")
    assert row.req_per_s == pytest.approx(150 / 15.0)
    assert row.ttft_ms[50] == pytest.approx(100.0) and row.ttft_ms[99] == pytest.approx(200.0)
    assert row.frontend_cpu_ms_per_req == pytest.approx((40.0 * 100 + 10.0 * 50) / 150)
    assert row.decode_cached_share == pytest.approx(0.99)


def test_the_cli_takes_several_seeds():
    assert cli.parse_args(["disagg", "--seeds", "7,19,3"]).seeds == (7, 19, 3)
