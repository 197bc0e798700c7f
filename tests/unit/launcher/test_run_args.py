"""`meshfront run` defaults: the demo script exists and is a valid mocker script; flags reach the workers."""

import json

import pytest

from services.launcher.run import DEMO_SCRIPT, parse_args
from services.workers.mocker.outputs import parse_script

pytestmark = pytest.mark.unit


def test_demo_script_is_a_valid_mocker_script_with_a_default():
    rules, default = parse_script(json.loads(DEMO_SCRIPT.read_text()))
    assert default and "Meshfront" in default
    assert any(match == "weather in Paris" and "<tool_call>" in text for match, text in rules)


def test_run_defaults_and_overrides():
    args = parse_args([])
    assert args.mocker_script == str(DEMO_SCRIPT) and args.workers == 2 and args.http_port == 8000
    args = parse_args(["--mocker-script", "", "--router-mode", "kv", "--workers", "4"])
    assert args.mocker_script == "" and args.router_mode == "kv" and args.workers == 4


def test_stage_flags_are_repeatable_and_default_to_none():
    args = parse_args(["--inproc", "--postprocessor-flag=--stream-idle-timeout-s=30",
                       "--postprocessor-flag=--migration-limit=1", "--router-flag=--kv-overlap-weight=2"])
    assert args.postprocessor_flag == ["--stream-idle-timeout-s=30", "--migration-limit=1"]
    assert args.router_flag == ["--kv-overlap-weight=2"] and args.preprocessor_flag == [] == args.gateway_flag


def test_metrics_prefix_is_forwarded_to_every_gateway():
    args = parse_args(["--metrics-prefix", "dynamo_frontend", "--gateway-flag=--log-level=DEBUG"])
    assert args.gateway_flag == ["--log-level=DEBUG", "--metrics-prefix=dynamo_frontend"]
    assert parse_args([]).gateway_flag == []
    with pytest.raises(SystemExit):
        parse_args(["--metrics-prefix", "dynamo-frontend"])  # not a Prometheus name


def test_postprocessor_replicas_each_get_a_port_and_the_gateway_lists_them_all():
    from services.launcher.plan import MeshPlan, WorkerSpec, specs
    from services.launcher.run import _placement

    args = parse_args(["--postprocessors", "2", "--embedding-workers", "0", "--image-workers", "0",
                       "--video-workers", "0"])
    workers = [WorkerSpec("/models/demo", "demo", "mocker")] * args.workers
    plan = MeshPlan(workers=workers, postprocessors=args.postprocessors, **_placement(args))
    by_name = {s.name: s for s in specs(plan)}
    assert {"postprocessor", "postprocessor-1"} <= by_name.keys()
    gateway = by_name["gateway-0"].argv
    assert gateway[gateway.index("--postprocessor") + 1] == "ipv4:127.0.0.1:9400,127.0.0.1:9401"
    for bad in (["--postprocessors", "0"], ["--inproc", "--postprocessors", "2"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_preprocessor_replicas_each_get_a_port_and_the_gateway_lists_them_all():
    from services.launcher.plan import MeshPlan, WorkerSpec, specs
    from services.launcher.run import STOP_ORDER, _placement

    args = parse_args(["--preprocessors", "2", "--embedding-workers", "0", "--image-workers", "0",
                       "--video-workers", "0"])
    workers = [WorkerSpec("/models/demo", "demo", "mocker")] * args.workers
    plan = MeshPlan(workers=workers, preprocessors=args.preprocessors, **_placement(args))
    by_name = {s.name: s for s in specs(plan)}
    assert {"preprocessor", "preprocessor-1"} <= by_name.keys() and "preprocessor-1" in plan.service_names()
    assert by_name["preprocessor-1"].argv[by_name["preprocessor-1"].argv.index("--port") + 1] == "9201"
    gateway = by_name["gateway-0"].argv
    assert gateway[gateway.index("--preprocessor") + 1] == "ipv4:127.0.0.1:9200,127.0.0.1:9201"
    assert "preprocessor-*" in STOP_ORDER[1]  # replicas stop with the stages, before the workers
    for bad in (["--preprocessors", "0"], ["--inproc", "--preprocessors", "2"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.parametrize("free_ports", [False, True])
def test_router_replicas_each_get_a_port_and_every_caller_lists_them_all(free_ports):
    from services.launcher.plan import MeshPlan, WorkerSpec, specs
    from services.launcher.run import STOP_ORDER, _placement

    args = parse_args(["--routers", "3", "--embedding-workers", "0", "--image-workers", "0", "--video-workers", "0",
                       *(["--free-ports"] if free_ports else [])])
    workers = [WorkerSpec("/models/demo", "demo", "mocker")] * args.workers
    plan = MeshPlan(workers=workers, routers=args.routers, **_placement(args))
    by_name = {s.name: s for s in specs(plan)}
    routers = [by_name[n] for n in ("router", "router-1", "router-2")]
    ports = [r.argv[r.argv.index("--port") + 1] for r in routers]
    assert len(set(ports)) == 3 and (free_ports or ports == ["9300", "9301", "9302"])
    target = "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports)
    for caller in ("gateway-0", "postprocessor"):  # the gateway routes; the postprocessor routes migrations
        argv = by_name[caller].argv
        assert argv[argv.index("--router") + 1] == target, caller
    assert "router-*" in STOP_ORDER[1]
    for bad in (["--routers", "0"], ["--inproc", "--routers", "2"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.parametrize("free_ports", [False, True])
def test_nats_cluster_runs_three_routed_nodes_and_every_process_lists_them_all(free_ports):
    from services.launcher.plan import MeshPlan, WorkerSpec, specs
    from services.launcher.run import STOP_ORDER, _placement

    args = parse_args(["--nats-cluster", "3", "--embedding-workers", "0", "--image-workers", "0",
                       "--video-workers", "0", *(["--free-ports"] if free_ports else [])])
    workers = [WorkerSpec("/models/demo", "demo", "mocker")] * args.workers
    plan = MeshPlan(workers=workers, nats_cluster=args.nats_cluster, **_placement(args))
    by_name = {s.name: s for s in specs(plan)}
    nodes = [by_name[n] for n in ("nats", "nats-1", "nats-2")]
    assert len({n.ready_port for n in nodes}) == 3 and len(plan.nats_dirs) == 3
    routes = {n.argv[n.argv.index("--cluster") + 1] for n in nodes}
    for node in nodes:  # each node names itself, joins the one cluster and routes to the two others
        argv = node.argv
        assert argv[argv.index("-n") + 1] == node.name and argv[argv.index("--cluster_name") + 1] == "meshfront"
        assert set(argv[argv.index("--routes") + 1].split(",")) == routes - {argv[argv.index("--cluster") + 1]}
        assert "-js" in argv and argv[argv.index("-sd") + 1] == str(plan.run_dir / f"nats-{node.ready_port}")
    urls = ",".join(f"nats://127.0.0.1:{n.ready_port}" for n in nodes)
    for name in ("mocker-0", "router", "gateway-0", "preprocessor", "postprocessor"):
        argv = by_name[name].argv
        assert argv[argv.index("--nats-url") + 1] == urls, name
    assert "nats-*" in STOP_ORDER[-1]  # stopped last, after every client
    single = MeshPlan(workers=workers, **_placement(parse_args(["--embedding-workers", "0", "--image-workers", "0",
                                                                "--video-workers", "0"])))
    assert single.nats_url == "nats://127.0.0.1:4222"
    assert "--cluster" not in next(s for s in specs(single) if s.name == "nats").argv
    with pytest.raises(SystemExit):
        parse_args(["--nats-cluster", "2"])  # two nodes have no majority once one dies
