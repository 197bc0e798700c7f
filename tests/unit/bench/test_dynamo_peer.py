"""The Dynamo peer shape of ``python -m bench mesh`` (bench/dynamo_peer.py): what it would start, and the
flags that pick it. Starting Dynamo itself needs its own environment; that is the bench's job."""

from __future__ import annotations

import pathlib

import pytest

from bench import cli, cpu, dynamo_peer, mesh

pytestmark = pytest.mark.unit


def test_every_process_listens_on_loopback_and_shares_the_mesh_settings(tmp_path: pathlib.Path):
    env = dynamo_peer.environment(tmp_path, 4333)
    assert env["NATS_SERVER"] == "nats://127.0.0.1:4333"
    hosts = {k: v for k, v in env.items() if k.endswith("_HOST")}
    assert hosts and set(hosts.values()) == {"127.0.0.1"}
    procs = dict(dynamo_peer.commands(pathlib.Path("/venv/bin/python"), "/models/demo", "org/demo", 2, 1000.0,
                                      "round-robin", 8123, 4333, tmp_path))
    assert list(procs) == ["nats", dynamo_peer.FRONTEND, "mocker-0", "mocker-1"]
    frontend = procs[dynamo_peer.FRONTEND]
    assert frontend[frontend.index("--http-host") + 1] == "127.0.0.1"
    assert frontend[frontend.index("--http-port") + 1] == "8123"
    assert frontend[frontend.index("--router-mode") + 1] == "round-robin"
    for name in ("mocker-0", "mocker-1"):
        argv = procs[name]
        assert argv[argv.index("--speedup-ratio") + 1] == "1000"
        assert argv[argv.index("--model-path") + 1] == "/models/demo"
        assert argv[argv.index("--model-name") + 1] == "org/demo"
    assert procs["nats"][procs["nats"].index("-a") + 1] == "127.0.0.1"


def test_the_frontend_is_the_gateway_column_and_the_mockers_are_workers():
    assert cpu.group_of(dynamo_peer.FRONTEND) == "gateway"
    assert cpu.group_of("mocker-1") == "workers"


def test_the_mesh_bench_takes_the_peer_shape_and_a_gateway_count():
    args = cli.parse_args(["mesh", "--shape", "split,dynamo", "--gateways", "2"])
    assert args.shape == ("split", mesh.PEER)
    assert cli._config(args, args.shape).gateways == 2
    with pytest.raises(SystemExit):
        cli.parse_args(["mesh", "--shape", "vllm-serve"])
