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


def render(*, listen_host: str, listen_port: int, admin_port: int, gateways: Sequence[tuple[str, int]],
           admin_host: str = "127.0.0.1", tls: tuple[str, str] | None = None, tls_client_ca: str = "",
           gateway_dns: bool = False, descriptor: str | None = None, upstream_tls: tuple[str, str, str] | None = None,
           otlp: tuple[str, int] | None = None, extension_routes: Sequence[tuple[str, Sequence[str]]] = ()) -> str:
    """The shipped config with these addresses.

    ``tls=(cert, key)`` (PEM files) terminates TLS on the listener with ALPN h2 and
    http/1.1, so HTTP clients and gRPC clients (KServe, the gateway's own service)
    share the port as they do in cleartext. ``tls_client_ca`` (a PEM file, with ``tls``)
    makes the listener require a client certificate that CA signed (mTLS at the edge:
    Dynamo's ``--tls-client-ca-cert-path``); a client without one fails the handshake,
    before any HTTP or gRPC. ``gateway_dns`` resolves the gateway
    hosts with STRICT_DNS (every address a name returns is an endpoint: a headless
    Kubernetes Service); ``descriptor`` overrides the transcoder's descriptor path.
    ``upstream_tls=(ca, cert, key)`` makes Envoy reach the gateways over mTLS (the mesh's
    ``--tls-*`` flags): it verifies them against ``ca`` and presents ``cert``.
    ``otlp=(host, port)``: Envoy's OpenTelemetry tracer sends the edge span of every request to that OTLP/gRPC
    collector (a name resolved like ``gateway_dns``'s) and passes its ``traceparent`` to the gateway.
    ``extension_routes``: (path, methods) of every route the gateways' extensions serve
    (services/gateway/extensions/edge.py ``edge_routes``); see ``extension_route``.
    """
    cfg = yaml.safe_load(ENVOY_YAML.read_text())
    cfg["admin"]["address"]["socket_address"].update(address=admin_host, port_value=admin_port)
    listener = cfg["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address=listen_host, port_value=listen_port)
    if tls_client_ca and tls is None:
        raise ValueError("a client CA needs the listener's own certificate and key (tls)")
    if tls is not None:
        listener["filter_chains"][0]["transport_socket"] = downstream_tls(*tls, client_ca=tls_client_ca)
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    for f in hcm["http_filters"]:
        if f["name"] == "envoy.filters.http.grpc_json_transcoder":
            f["typed_config"]["proto_descriptor"] = descriptor or str(DESCRIPTOR)
            transcoder = f["typed_config"]
    # First: an extension path under /v1/ must win over the /v1/ prefix route.
    hcm["route_config"]["virtual_hosts"][0]["routes"][:0] = [
        extension_route(path, methods, transcoder) for path, methods in extension_routes]
    cluster = next(c for c in cfg["static_resources"]["clusters"] if c["name"] == "gateway")
    if gateway_dns:
        # Re-resolved every 5 s: pods that scale in or out join the balancing within seconds.
        cluster.update(type="STRICT_DNS", dns_lookup_family="V4_ONLY", dns_refresh_rate="5s",
                       respect_dns_ttl=False)
    if upstream_tls is not None:
        cluster["transport_socket"] = upstream_mtls(*upstream_tls)
    cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": [
        {"endpoint": {"address": {"socket_address": {"address": h, "port_value": p}}}} for h, p in gateways]}]
    if otlp is not None:
        hcm["tracing"] = edge_tracing()
        cfg["static_resources"]["clusters"].append(otlp_cluster(*otlp))
    return yaml.dump(cfg, Dumper=_Expanded, sort_keys=False)


EXTENSION_SERVICE = "meshfront.gateway.v1.ExtensionRoutesService"


def extension_route(path: str, methods: Sequence[str], transcoder: dict) -> dict:
    """The route of one extension path: the Lua filter reads its methods from the route's metadata (404 and
    405 as for every route) and names the path to the gateway; the transcoder, configured for this route
    alone, knows only ExtensionRoutesService, whose catch-all bindings never see a built-in path."""
    return {
        "match": {"path": path},
        "route": {"cluster": "gateway", "timeout": "30s"},
        "metadata": {"filter_metadata": {"envoy.filters.http.lua": {"extension_methods": ", ".join(methods)}}},
        "typed_per_filter_config": {"envoy.filters.http.grpc_json_transcoder": {
            **transcoder, "services": [EXTENSION_SERVICE]}},
    }


class _Expanded(yaml.SafeDumper):
    """Writes a node the shipped file shares through a YAML anchor (the Anthropic routes' filter) in full
    at each use, not as PyYAML's ``&id001`` / ``*id001``: the rendered file reads like the shipped one."""

    def ignore_aliases(self, data: object) -> bool:
        return True


OTLP_CLUSTER = "opentelemetry_collector"


def edge_tracing() -> dict:
    """The listener's tracing: every request gets an edge span (continuing a client's ``traceparent``),
    tagged with its ``x-request-id``, and the gateway receives the span's ``traceparent``."""
    return {
        "random_sampling": {"value": 100},
        "spawn_upstream_span": False,  # one edge span per request: the gateway's own span is its child
        "custom_tags": [{"tag": "meshfront.request_id", "request_header": {"name": "x-request-id"}}],
        "provider": {
            "name": "envoy.tracers.opentelemetry",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
                "grpc_service": {"envoy_grpc": {"cluster_name": OTLP_CLUSTER}, "timeout": "1s"},
                "service_name": "meshfront-envoy",
            },
        },
    }


def otlp_cluster(host: str, port: int) -> dict:
    """The OTLP/gRPC collector (HTTP/2, plaintext); a name is re-resolved like the gateways'."""
    return {
        "name": OTLP_CLUSTER,
        "type": "STRICT_DNS",
        "dns_lookup_family": "V4_ONLY",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": OTLP_CLUSTER, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}]}]},
    }


def downstream_tls(cert: str, key: str, client_ca: str = "") -> dict:
    """A TLS transport socket for the edge listener (TLS 1.2+, ALPN h2 then http/1.1); with ``client_ca``, a
    client must present a certificate that CA signed (any other, or none, ends the handshake)."""
    context: dict = {
        "alpn_protocols": ["h2", "http/1.1"],
        "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
        "tls_certificates": [{"certificate_chain": {"filename": cert}, "private_key": {"filename": key}}],
    }
    socket: dict = {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                    "common_tls_context": context}
    if client_ca:
        context["validation_context"] = {"trusted_ca": {"filename": client_ca}}
        socket["require_client_certificate"] = True
    return {"name": "envoy.transport_sockets.tls", "typed_config": socket}


def upstream_mtls(ca: str, cert: str, key: str) -> dict:
    """Envoy -> gateway over TLS: a client certificate, the mesh CA as the only trust, ALPN h2 (gRPC)."""
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
                "tls_certificates": [{"certificate_chain": {"filename": cert},
                                      "private_key": {"filename": key}}],
                "validation_context": {"trusted_ca": {"filename": ca}},
            },
        },
    }
