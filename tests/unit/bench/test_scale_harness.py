"""bench/scale_hosts.py and bench/scale.py's layout: cgroup layouts, quota files, throttling counters, the
join-then-exec wrapper and which host runs what. None of it needs root: the cgroup trees are fakes under
tmp_path, and the wrapper is checked with a plain file standing in for ``cgroup.procs``."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from bench import scale_hosts
from bench.scale import ScaleConfig, topology
from bench.scale_hosts import CpuController, CpuHosts, Throttling, cgroup_argv, find_controller, parse_cpu_stat

pytestmark = pytest.mark.unit

V1_STAT = "nr_periods 120\nnr_throttled 30\nthrottled_time 4500000000\nnr_bursts 0\nburst_time 0\n"
V2_STAT = "usage_usec 900\nuser_usec 600\nsystem_usec 300\nnr_periods 50\nnr_throttled 5\nthrottled_usec 2500\n"


def test_finds_the_v1_cpu_hierarchy_before_v2(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cgroup.controllers").write_text("cpu io memory\n")
    assert find_controller(tmp_path) == CpuController(tmp_path / "cpu", 1)


def test_finds_v2_when_it_delegates_cpu(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert find_controller(tmp_path) == CpuController(tmp_path, 2)


def test_no_cpu_controller_is_named(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset io memory\n")  # cpuset is not cpu
    with pytest.raises(scale_hosts.CgroupUnavailable, match="no cgroup CPU controller"):
        find_controller(tmp_path)


def test_quota_files_per_layout_and_the_kernels_one_ms_minimum():
    v1, v2 = CpuController(scale_hosts.CGROUP_ROOT / "cpu", 1), CpuController(scale_hosts.CGROUP_ROOT, 2)
    assert v1.quota_files(0.1, 20_000) == {"cpu.cfs_period_us": "20000", "cpu.cfs_quota_us": "2000"}
    assert v2.quota_files(0.25, 100_000) == {"cpu.max": "25000 100000"}
    assert v1.quota_files(0.01, 20_000)["cpu.cfs_quota_us"] == "1000"  # 200 us would be refused


def test_cpu_stat_of_both_layouts():
    assert parse_cpu_stat(V1_STAT) == Throttling(120, 30, 4500.0)
    assert parse_cpu_stat(V2_STAT) == Throttling(50, 5, 2.5)
    assert Throttling(120, 30, 4500.0).minus(Throttling(100, 10, 500.0)) == Throttling(20, 20, 4000.0)
    with pytest.raises(ValueError, match="no throttling time"):
        parse_cpu_stat("nr_periods 1\nnr_throttled 0\n")


def test_groups_start_unlimited_then_take_the_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    hosts = CpuHosts(CpuController(tmp_path / "cpu", 1), period_us=20_000)
    group = hosts.add("r0")
    assert group.parent == hosts.run_dir and not (group / "cpu.cfs_quota_us").exists()
    hosts.limit("r0", 0.05)
    assert (group / "cpu.cfs_quota_us").read_text() == "1000"
    assert (group / "cpu.cfs_period_us").read_text() == "20000"
    (group / "cpu.stat").write_text(V1_STAT)
    assert hosts.throttling("r0").throttled == 30
    assert hosts.procs_file("r0") == group / "cgroup.procs"


def test_the_wrapper_joins_the_group_then_execs_the_same_pid(tmp_path):
    procs = tmp_path / "cgroup.procs"  # a plain file: what the shell writes is what the kernel would get
    out = subprocess.run(cgroup_argv(procs, ["sh", "-c", "echo $$"]), capture_output=True, text=True, timeout=10,
                         check=True).stdout
    assert out.strip() == procs.read_text().strip()  # the program is the process that joined


def test_a_wrapper_that_cannot_join_does_not_run_the_program(tmp_path):
    r = subprocess.run(cgroup_argv(tmp_path / "missing" / "cgroup.procs", ["echo", "ran"]), capture_output=True,
                       text=True, timeout=10)
    assert r.returncode != 0 and "ran" not in r.stdout  # never unthrottled by accident


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_stage_under_test_runs_on_replica_hosts_and_its_callers_spread_over_them(tmp_path):
    replicas = ["10.214.0.20", "10.214.0.21"]
    procs = topology("preprocessor", replicas, "10.214.0.10", "/models/demo", ScaleConfig(workers=2), tmp_path)
    by_name = {p.name: p for p in procs}
    assert [(p.host, _flag(p.argv, "--host")) for p in procs if p.name.startswith("preprocessor")] == [
        ("r0", "10.214.0.20"), ("r1", "10.214.0.21")]
    assert _flag(by_name["gateway-0"].argv, "--preprocessor") == "ipv4:10.214.0.20:9200,10.214.0.21:9200"
    assert _flag(by_name["gateway-0"].argv, "--router") == "10.214.0.10:9300"
    assert {p.host for p in procs if not p.name.startswith("preprocessor")} == {"rest"}
    assert {"nats", "mocker-0", "mocker-1", "router-0", "postprocessor-0", "gateway-0", "envoy"} <= set(by_name)
    assert _flag(by_name["mocker-0"].argv, "--nats-url") == "nats://10.214.0.10:4222"


def test_router_replicas_are_every_callers_target(tmp_path):
    procs = topology("router", ["10.214.0.20", "10.214.0.21", "10.214.0.22"], "10.214.0.10", "/m", ScaleConfig(),
                     tmp_path, router_mode="kv")
    by_name = {p.name: p for p in procs}
    target = "ipv4:10.214.0.20:9300,10.214.0.21:9300,10.214.0.22:9300"
    assert _flag(by_name["gateway-0"].argv, "--router") == target
    assert _flag(by_name["postprocessor-0"].argv, "--router") == target  # it migrates streams through them
    assert all(_flag(by_name[f"router-{i}"].argv, "--router-mode") == "kv" for i in range(3))


def test_all_in_one_replicas_are_envoys_gateways(tmp_path):
    procs = topology("allinone", ["10.214.0.20", "10.214.0.21"], "10.214.0.10", "/m", ScaleConfig(), tmp_path)
    names = {p.name for p in procs}
    assert {"allinone-0", "allinone-1"} <= names and not names & {"preprocessor-0", "router-0", "gateway-0"}
    cfg = yaml.safe_load((tmp_path / "envoy.yaml").read_text())
    cluster = next(c for c in cfg["static_resources"]["clusters"] if c["name"] == "gateway")
    endpoints = [e["endpoint"]["address"]["socket_address"] for e in cluster["load_assignment"]["endpoints"][0][
        "lb_endpoints"]]
    assert [(e["address"], e["port_value"]) for e in endpoints] == [("10.214.0.20", 9100), ("10.214.0.21", 9100)]


def test_a_quota_under_the_kernels_minimum_reports_what_the_kernel_allows(tmp_path):
    (tmp_path / "cpu").mkdir()
    hosts = CpuHosts(CpuController(tmp_path / "cpu", 1), period_us=20_000)
    hosts.add("r0")
    assert hosts.limit("r0", 0.04) == pytest.approx(0.05)  # 800 us asked, 1 ms held: the row says 0.05
    assert hosts.limit("r0", 0.1) == pytest.approx(0.1)


def test_quotas_are_lifted_for_the_teardown(tmp_path):
    (tmp_path / "cpu").mkdir()
    hosts = CpuHosts(CpuController(tmp_path / "cpu", 1), period_us=100_000)
    for h in ("r0", "r1"):
        hosts.add(h)
        hosts.limit(h, 0.015)
    hosts.unlimit()
    assert [(hosts.groups[h] / "cpu.cfs_quota_us").read_text() for h in ("r0", "r1")] == ["-1", "-1"]


def test_load_is_per_replica_but_the_same_for_every_router_kv_row():
    from bench.scale import load_scale

    cfg = ScaleConfig(kv_replicas=(1, 3))
    assert [load_scale(cfg, n, kv=False) for n in (1, 2, 4)] == [1, 2, 4]
    # Per replica, one router would see 120 requests and three 360: 16 groups' first misses alone
    # made three routers read 9 points more cached.
    assert [load_scale(cfg, n, kv=True) for n in (1, 3)] == [3, 3]


def test_every_mesh_service_serves_metrics_on_a_port_of_its_own(tmp_path):
    # The row scrapes the meshfront_mux_* counters of every worker and stage (messages per request per hop):
    # the rest's processes share one address, so their metrics ports must differ.
    procs = topology("postprocessor", ["10.214.0.20", "10.214.0.21"], "10.214.0.10", "/m", ScaleConfig(workers=2),
                     tmp_path)
    scraped = {p.name: p.metrics_port for p in procs if p.metrics_port}
    assert set(scraped) == {"mocker-0", "mocker-1", "preprocessor-0", "router-0", "postprocessor-0",
                            "postprocessor-1", "gateway-0"}
    assert all(_flag(p.argv, "--metrics-port") == str(p.metrics_port) for p in procs if p.metrics_port)
    assert len(set(scraped.values())) == len(scraped)
