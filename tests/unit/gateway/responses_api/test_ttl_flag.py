"""--responses-ttl-s reaches the response store in both shapes; NATS TTLs are whole seconds, at least 1."""

import pytest

from services.allinone import config as allinone_config
from services.common.discovery import WorkerRegistry
from services.gateway import config as gateway_config
from services.gateway.assembly import build
from services.launcher.plan import MeshPlan, specs
from services.launcher.run import STAGES, parse_args

pytestmark = pytest.mark.unit


async def test_default_is_an_hour_and_the_flag_sets_the_store_ttl():  # grpc.aio channels need a loop
    assert gateway_config.parse_config([], env={}).responses_ttl_s == 3600
    cfg = gateway_config.parse_config(["--responses-ttl-s", "90"], env={})
    built = build(cfg, WorkerRegistry(cfg.nats_url, "test"))
    assert built.service.response_store.ttl_s == 90
    assert built.service.response_store.nats_url == cfg.nats_url


def test_env_twin_and_all_in_one():
    assert gateway_config.parse_config([], env={"MESHFRONT_GATEWAY_RESPONSES_TTL_S": "7"}).responses_ttl_s == 7
    assert allinone_config.parse_config(["--responses-ttl-s", "5"], env={}).gateway.responses_ttl_s == 5


@pytest.mark.parametrize("value", ["0", "-3"])
def test_ttl_below_one_second_is_refused(value):
    with pytest.raises(ValueError, match="--responses-ttl-s"):
        gateway_config.parse_config(["--responses-ttl-s", value], env={})


@pytest.mark.parametrize("inproc", [False, True])
def test_meshfront_run_forwards_it_to_every_gateway(tmp_path, inproc):
    """`meshfront run --gateway-flag=--responses-ttl-s=60`: each gateway process (either shape) parses it."""
    args = parse_args(["--gateways", "2", "--gateway-flag=--responses-ttl-s=60", *(["--inproc"] if inproc else [])])
    plan = MeshPlan(gateway_ports=[9100, 9101], inproc=inproc, run_dir=tmp_path,
                    service_args={stage: tuple(getattr(args, f"{stage}_flag")) for stage in STAGES})
    gateways = [s for s in specs(plan) if s.name.startswith("gateway-")]
    assert len(gateways) == 2
    for spec in gateways:
        module, argv = spec.argv[2], spec.argv[3:]
        if inproc:
            assert module == "services.allinone"
            assert allinone_config.parse_config(argv, env={}).gateway.responses_ttl_s == 60
        else:
            assert module == "services.gateway"
            assert gateway_config.parse_config(argv, env={}).responses_ttl_s == 60
