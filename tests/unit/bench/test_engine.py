"""The engine scenario's pure parts: the process tree reader, process grouping and the goal verdict."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys

import orjson
import pytest

from bench import cpu
from bench.engine import EngineRecord, child_name, columns, engine_group, goal_lines, goal_verdict
from bench.loadgen import chat_body
from bench.stats import LevelStats

pytestmark = pytest.mark.unit


def test_descendants_walks_the_whole_tree_parents_first():
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20, 14: 12}
    assert cpu.descendants(10, parents) == [11, 13, 12, 14]
    assert cpu.descendants(20, parents) == [21]
    assert cpu.descendants(14, parents) == []
    assert cpu.descendants(99, parents) == []


def test_descendants_survives_a_cycle():
    assert cpu.descendants(1, {2: 1, 3: 2, 1: 3}) == [2, 3]


def test_descendants_of_a_live_process_finds_its_child():
    # The child says it runs before its pid is printed: Popen returns once the exec has closed the child's
    # close-on-exec pipe, before the kernel has set the new command line and name, so a label read then was
    # the parent's name ("python") about a third of the time on a busy machine.
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; print(flush=True); time.sleep(30)'], "
            "stdout=subprocess.PIPE); c.stdout.readline(); "
            "print(c.pid, flush=True); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child = int(parent.stdout.readline())
    try:
        assert cpu.descendants(parent.pid) == [child]
        assert cpu.parent_table()[child] == parent.pid
        assert cpu.process_label(child) == "python -c"
        assert os.getpid() not in cpu.descendants(parent.pid)
    finally:
        os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()
        parent.stdout.close()


@pytest.mark.parametrize(("argv", "comm", "label"), [
    (["VLLM::EngineCore"], "VLLM::EngineCor", "VLLM::EngineCore"),
    (["VLLM::Worker_PP0 extra"], "VLLM::Worker", "VLLM::Worker_PP0"),
    (["/r/.venv-vllm/bin/python", "-m", "services.workers.vllm", "--port", "1"], "python", "services.workers.vllm"),
    (["/usr/bin/python3.11", "-c", "from multiprocessing.resource_tracker import main;main(7)"], "python3",
     "multiprocessing.resource_tracker"),
    (["/r/.venv/bin/envoy", "-c", "x.yaml"], "envoy", "envoy"),
    ([], "kworker", "kworker"),
])
def test_label_from_argv(argv, comm, label):
    assert cpu.label_from_argv(argv, comm) == label


def test_engine_group_sorts_every_process_into_its_column():
    names = {"envoy": "envoy", "gateway-0": "gateway", "preprocessor": "preprocessor", "router": "router",
             "router-1": "router", "postprocessor": "postprocessor", "nats": "nats", "vllm-0": "worker",
             "vllm-1": "worker", "api-server": "api-server",
             child_name("vllm-0", "VLLM::EngineCore", 5): "engine",
             child_name("api-server", "VLLM::EngineCore", 6): "engine"}
    assert {n: engine_group(n) for n in names} == names


def test_per_request_columns_sum_the_frontend_tier_only():
    usage = cpu.CpuUsage({"envoy": 10.0, "gateway-0": 30.0, "nats": 2.0, "vllm-0": 50.0,
                          child_name("vllm-0", "VLLM::EngineCore", 5): 400.0}, [])
    per = columns(usage.per_request(10, engine_group))
    assert per == pytest.approx({"envoy": 1.0, "gateway": 3.0, "nats": 0.2, "worker": 5.0, "engine": 40.0,
                                 "total": 49.2, "frontend": 4.2, "fe-total": 9.2})
    assert "frontend" not in columns({"api-server": 3.0, "engine": 9.0})
    # vLLM's API server is outside the engine: issue 40 item 4 counts it to the frontend total
    assert columns({"api-server": 3.0, "engine": 9.0})["fe-total"] == 3.0


def test_goal_verdict():
    assert goal_verdict(4.0, 5.0, 105.0, 100.0) == (True, True)
    assert goal_verdict(5.1, 5.0, 89.0, 100.0) == (False, False)
    assert goal_verdict(5.0, 5.0, 90.0, 100.0) == (True, True)  # both bounds inclusive
    assert goal_verdict(1.0, 5.0, 100.0, math.nan) == (True, False)


def _stats(concurrency: int, ttft: float, req_s: float = 1.0) -> LevelStats:
    nan = {q: math.nan for q in (50, 90, 99)}
    return LevelStats(concurrency, 10, 10, 0, 10.0, req_s, 64 * req_s, {50: ttft, 90: ttft, 99: ttft}, nan, nan,
                      1.0, 208.0, 64.0, 0.0, [])


def _record(deployment: str, concurrency: int, ttft: float, cpu_per_request: dict[str, float]) -> EngineRecord:
    return EngineRecord(deployment, _stats(concurrency, ttft), cpu_per_request, {}, 0.1, 1.0, 0.0, 0.0)


def test_goal_lines_compare_each_mesh_level_with_the_server_at_the_same_concurrency():
    records = [
        _record("split", 8, 120.0, {"frontend": 6.0, "worker": 2.0, "engine": 90.0}),
        _record("inproc", 8, 104.0, {"frontend": 3.0, "worker": 2.0, "engine": 90.0}),
        _record("split", 32, 300.0, {"frontend": 5.0, "worker": 1.0, "engine": 50.0}),  # no server level at 32
        _record("vllm", 8, 100.0, {"api-server": 4.0, "engine": 80.0}),
    ]
    lines = goal_lines(records)
    assert len(lines) == 2
    split, inproc = lines
    assert split.startswith("c=8 split: frontend 6.00 vs vLLM API server 4.00") and "1.50x) -> NOT MET" in split
    assert "TTFT p50 120 vs 100 ms (+20%) -> NOT MET" in split and "frontend + worker process 8.00" in split
    assert "0.75x) -> MET" in inproc and "(+4%) -> MET" in inproc
    assert "NOT COMPARABLE" not in split + inproc


def test_goal_lines_mark_a_level_with_failed_requests():
    failed = _record("inproc", 8, 104.0, {"frontend": 3.0})
    failed.stats = dataclasses.replace(failed.stats, ok=8, errors=2, first_errors=["worker stopped responding"])
    (line,) = goal_lines([failed, _record("vllm", 8, 100.0, {"api-server": 4.0})])
    assert line.endswith("NOT COMPARABLE: inproc 2/10 failed (worker stopped responding)")


def test_chat_body_sends_min_tokens_only_when_asked():
    assert "min_tokens" not in orjson.loads(chat_body("m", "p", 64, True))
    body = orjson.loads(chat_body("m", "p", 64, True, min_tokens=64))
    assert (body["min_tokens"], body["max_tokens"], body["ignore_eos"]) == (64, 64, True)
