"""gRPC targets as the mesh's flags take them: one address, an ``ipv4:``/``ipv6:`` list, or a dns name.

``--router`` and ``--postprocessor`` accept all three. gRPC resolves them itself for per-request
calls; the gateway's multiplexed postprocessor client (one stream per replica) and the TLS name
check need to know the replicas themselves.
"""

from __future__ import annotations


def split_target(target: str) -> tuple[list[str], tuple[str, int] | None]:
    """(the fixed replica addresses, or the (host, port) of a ``dns:`` name to resolve).

    Raises:
        ValueError: a dns target without a port.
    """
    scheme, _, rest = target.partition(":")
    if scheme in ("ipv4", "ipv6") and rest:
        return [f"{scheme}:{address}" for address in rest.split(",") if address], None
    if scheme == "dns" and rest:
        name = rest.removeprefix("//").split("/", 1)[-1]  # dns:///name:port or dns://authority/name:port
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"target {target!r}: a dns target needs name:port")
        return [], (host, int(port))
    return [target], None


def address_host(address: str) -> str:
    """The host of one ``ipv4:h:p`` / ``ipv6:[h]:p`` address (brackets stripped)."""
    scheme, _, rest = address.partition(":")
    host = rest.rsplit(":", 1)[0] if scheme == "ipv4" or rest.startswith("[") else rest
    return host.strip("[]")
