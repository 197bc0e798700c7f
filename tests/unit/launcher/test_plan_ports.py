"""free_port hands out loopback ports the kernel never gives to port-0 binds or outgoing connections."""

import socket

import pytest

from services.launcher.plan import _ephemeral_range, free_port

pytestmark = pytest.mark.unit


def test_ports_are_below_the_ephemeral_range_free_and_never_repeated():
    low, _ = _ephemeral_range()
    ports = [free_port() for _ in range(100)]
    assert len(set(ports)) == 100 and all(10_000 <= p < low for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # still free to bind
