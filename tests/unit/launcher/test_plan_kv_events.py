"""Only a kv router reads the workers' KV events and load reports: under any other mode the launcher starts the
workers whose engines publish them with --no-kv-events, before their own flags (which win)."""

from __future__ import annotations

import pytest

from services.launcher.plan import MeshPlan, WorkerSpec, specs
from services.workers.mocker.config import parse_config

pytestmark = pytest.mark.unit

MOCKER = WorkerSpec("/m", "demo", "mocker", ("--speedup-ratio", "10"))
HF = WorkerSpec("/m", "demo", "hf")


def worker_argv(plan: MeshPlan, tmp_path) -> dict[str, list[str]]:
    plan.run_dir, plan.worker_ports = tmp_path, [9500 + i for i in range(len(plan.workers))]
    return {s.name: s.argv for s in specs(plan) if s.name.startswith(("mocker", "hf"))}


@pytest.mark.parametrize(("mode", "inproc"), [("round-robin", False), ("least-loaded", True), ("random", False)])
def test_workers_under_a_router_that_reads_no_events_publish_none(tmp_path, mode, inproc):
    argv = worker_argv(MeshPlan(workers=[MOCKER, HF], router_mode=mode, inproc=inproc), tmp_path)
    mocker = argv["mocker-0"]
    assert mocker.index("--no-kv-events") < mocker.index("--speedup-ratio")  # the worker's own flags come after
    assert "--no-kv-events" not in argv["hf-1"]  # a kind without a prefix cache has no such flag


def test_a_kv_router_or_a_router_mode_among_the_stage_flags_keeps_them():
    assert MeshPlan(workers=[MOCKER], router_mode="kv").worker_flags(MOCKER) == []
    plan = MeshPlan(workers=[MOCKER], service_args={"router": ("--router-mode=kv",)})
    assert plan.routes_by_kv_events and plan.worker_flags(MOCKER) == []


def test_a_workers_own_kv_events_flag_wins_over_the_plans(demo_model_dir):
    assert parse_config(["--model-dir", str(demo_model_dir), "--no-kv-events", "--kv-events"], {}).worker.kv_events
