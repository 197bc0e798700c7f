"""A private L2 network of Linux network namespaces: one "host" per namespace.

Every host gets its own address on a subnet that exists only inside the
namespaces this module creates: a switch namespace holds a bridge, and each host
namespace holds one end of a veth pair whose other end is a bridge port. Nothing
is added to the caller's namespace (veths are created inside the switch), and
the loopback interface of every host stays DOWN, so a service that dials
127.0.0.1 or binds it fails instead of quietly working. ``close`` deletes every
namespace (which deletes the veths and the bridge with them).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import uuid


class NetnsUnavailable(RuntimeError):
    """This machine does not let us create network namespaces (not root, seccomp, no iproute2)."""


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def probe() -> None:
    """Raises NetnsUnavailable with the exact failure if ``ip netns add`` or a veth is refused."""
    name = f"mfprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", name)
    except (RuntimeError, OSError) as e:
        raise NetnsUnavailable(str(e)) from e
    try:
        _ip("-n", name, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
    except RuntimeError as e:
        raise NetnsUnavailable(str(e)) from e
    finally:
        _ip("netns", "del", name)


class Lab:
    """Hosts on ``<prefix>.0/24`` (``prefix`` like ``10.213.0``), joined by one bridge."""

    def __init__(self, prefix: str = "10.213.0"):
        self.prefix = prefix
        self.tag = f"mf{uuid.uuid4().hex[:6]}"
        self.switch = f"{self.tag}-sw"
        self.hosts: dict[str, str] = {}  # host name -> address
        self.procs: list[subprocess.Popen] = []
        self._namespaces: list[str] = []
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def add_host(self, host: str, octet: int) -> str:
        """Creates namespace ``host`` with address ``prefix.octet/24`` on eth0; returns the address."""
        ns, port = self.namespace(host), f"v{len(self.hosts)}"
        address = f"{self.prefix}.{octet}"
        self._add_namespace(ns)
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        self.hosts[host] = address
        return address

    def start(self, host: str, argv: list[str], log: pathlib.Path, env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        """Runs ``argv`` on ``host`` (``ip netns exec`` execs it: the pid is the program's own)."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", self.namespace(host), *argv], stdout=out,
                                    stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.namespace(host), *argv], capture_output=True,
                              text=True, timeout=timeout)

    def stop_processes(self, grace: float = 10.0) -> list[int]:
        """SIGTERMs every process, SIGKILLs stragglers; returns the pids that ignored SIGTERM."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        stubborn = []
        for proc in self.procs:
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                stubborn.append(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return stubborn

    def close(self) -> None:
        self.stop_processes()
        for ns in reversed(self._namespaces):
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", ns)
        self._namespaces.clear()
