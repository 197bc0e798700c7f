"""The grpc and smg shapes of ``python -m bench engine``: their process accounting and the peer comparison."""

from __future__ import annotations

import math
from pathlib import Path

from bench import cpu
from bench.engine import EngineRecord, child_name, columns, engine_group
from bench.engine_grpc import peer_lines
from bench.smg_peer import router_argv
from bench.stats import LevelStats


def test_the_servicer_smg_and_the_registrar_are_frontend_and_the_servicers_children_engine():
    names = {"servicer": "servicer", "smg": "smg", "attach-0": "attach",
             child_name("servicer", "VLLM::EngineCore", 7): "engine"}
    assert {n: engine_group(n) for n in names} == names
    usage = cpu.CpuUsage({"smg": 40.0, "servicer": 60.0, child_name("servicer", "VLLM::EngineCore", 7): 900.0}, [])
    per = columns(usage.per_request(10, engine_group))
    assert per["frontend"] == per["fe-total"] == 10.0
    assert per["engine"] == 90.0


def _record(deployment: str, concurrency: int, fe_total: float) -> EngineRecord:
    nan = {q: math.nan for q in (50, 90, 99)}
    stats = LevelStats(concurrency, 10, 10, 0, 10.0, 1.0, 64.0, nan, nan, nan, 1.0, 208.0, 64.0, 0.0, [])
    return EngineRecord(deployment, stats, {"fe-total": fe_total}, {}, 0.0, 0.0, 0.0, 0.0)


def test_peer_lines_compare_each_meshfront_level_with_both_peers_at_its_concurrency():
    lines = peer_lines([_record("vllm", 8, 20.0), _record("smg", 8, 10.0), _record("grpc", 8, 15.0),
                        _record("inproc", 32, 5.0)])
    assert lines[0] == ("c=8 grpc: frontend total 15.00 CPU ms/req vs vLLM's api-server 20.00 (0.75x, MET); "
                        "SMG router + servicer 10.00 (1.50x, NOT MET)")
    assert lines[1] == "c=32 inproc: frontend total 5.00 CPU ms/req vs no peer"
    assert len(lines) == 2


def test_smg_routes_the_engines_in_grpc_mode_without_qwens_reasoning_parser():
    argv = router_argv(Path("/py"), ["127.0.0.1:5", "127.0.0.1:6"], "/models/m", 30000, 29000)
    urls = argv[argv.index("--worker-urls") + 1:argv.index("--model-path")]
    assert urls == ["grpc://127.0.0.1:5", "grpc://127.0.0.1:6"]
    assert argv[argv.index("--reasoning-parser") + 1] == "passthrough"
    assert argv[argv.index("--port") + 1] == "30000" and argv[argv.index("--host") + 1] == "127.0.0.1"
