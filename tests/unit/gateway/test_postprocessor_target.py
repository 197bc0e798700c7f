"""The gateway reaches postprocessors through one client, the multiplexed one; its target is checked at start."""

import pytest

from services.common.discovery import WorkerRegistry
from services.gateway import config as gateway_config
from services.gateway.assembly import build
from services.gateway.postprocessor_mux import MuxPostprocessor

pytestmark = pytest.mark.unit


async def test_the_postprocessor_client_is_the_multiplexed_one():  # grpc.aio channels need a loop
    cfg = gateway_config.parse_config(["--postprocessor", "ipv4:127.0.0.1:9400,127.0.0.1:9401"], env={})
    built = build(cfg, WorkerRegistry(cfg.nats_url, "test"))
    try:
        assert isinstance(built.service.pipeline.post, MuxPostprocessor)
    finally:
        for close in built.closers:
            await close()


def test_a_dns_target_without_a_port_fails_at_start():
    with pytest.raises(ValueError, match="name:port"):
        gateway_config.parse_config(["--postprocessor", "dns:///postprocessor-headless"], env={})


def test_the_removed_transport_flag_is_refused():
    # --postprocessor-transport unary was removed (bench/RESULTS.md): a deployment still passing it hears so.
    with pytest.raises(SystemExit):
        gateway_config.parse_config(["--postprocessor-transport", "unary"], env={})
