"""--postprocessor-transport: mux (one stream per replica) by default, unary on request, checked at start."""

import pytest

from services.allinone import config as allinone_config
from services.common.discovery import WorkerRegistry
from services.gateway import clients
from services.gateway import config as gateway_config
from services.gateway.assembly import build
from services.gateway.postprocessor_mux import MuxPostprocessor

pytestmark = pytest.mark.unit


async def test_mux_by_default_and_unary_on_request():  # grpc.aio channels need a loop
    for argv, kind in (([], MuxPostprocessor), (["--postprocessor-transport", "unary"], clients.GrpcPostprocessor)):
        cfg = gateway_config.parse_config(argv, env={})
        built = build(cfg, WorkerRegistry(cfg.nats_url, "test"))
        assert isinstance(built.service.pipeline.post, kind)
        for close in built.closers:
            await close()


@pytest.mark.parametrize(("argv", "match"), [
    (["--postprocessor-transport", "grpc"], "--postprocessor-transport"),
    (["--postprocessor", "dns:///postprocessor-headless"], "name:port"),
])
def test_a_bad_setting_fails_at_start(argv, match):
    with pytest.raises(ValueError, match=match):
        gateway_config.parse_config(argv, env={})


def test_the_all_in_one_process_does_not_offer_it():
    with pytest.raises(SystemExit):
        allinone_config.parse_config(["--postprocessor-transport", "unary"], env={})
