"""Renders deploy/envoy/envoy.yaml for a concrete set of ports and gateway replicas.

The shipped file is the single source of the edge config; this only rewrites
addresses, so a launched Envoy and the validated file never drift apart.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENVOY_YAML = ROOT / "deploy" / "envoy" / "envoy.yaml"
DESCRIPTOR = ROOT / "deploy" / "envoy" / "gateway.pb"


def render(*, listen_host: str, listen_port: int, admin_port: int, gateways: Sequence[tuple[str, int]]) -> str:
    cfg = yaml.safe_load(ENVOY_YAML.read_text())
    cfg["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=admin_port)
    listener = cfg["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address=listen_host, port_value=listen_port)
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    for f in hcm["http_filters"]:
        if f["name"] == "envoy.filters.http.grpc_json_transcoder":
            f["typed_config"]["proto_descriptor"] = str(DESCRIPTOR)
    cluster = next(c for c in cfg["static_resources"]["clusters"] if c["name"] == "gateway")
    cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": [
        {"endpoint": {"address": {"socket_address": {"address": h, "port_value": p}}}} for h, p in gateways]}]
    return yaml.safe_dump(cfg, sort_keys=False)
