"""Small hosts on one machine for ``python -m bench scale``: a network namespace and a CPU quota each.

A replica of the stage under test runs in its own network namespace (bench/netns.py's ``Lab``:
one address per host on a private bridge) and in its own CPU cgroup whose quota stands for the
host's cores. Both cgroup layouts are handled: v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` under
the ``cpu`` controller's mount) and v2 (``cpu.max``). Each group's ``cpu.stat`` gives the throttling
counters (``nr_periods``, ``nr_throttled``, ``throttled_time`` in ns on v1, ``throttled_usec`` on v2)
that tell whether the replicas were held back by their quota, i.e. were the bottleneck.

A process joins its group before it execs (``cgroup_argv``), so none of its CPU escapes the quota.
``CpuHosts.close`` removes every group it made; groups left by a run that was killed outright are
removed by the next run (``sweep``) once they hold no process.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import pathlib
import uuid
from collections.abc import Iterator, Sequence

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
PARENT = "meshfront-scale"  # every group this bench makes lives under this one
CLONE_NEWNET = 0x40000000


class CgroupUnavailable(RuntimeError):
    """No CPU controller this process may create groups in (not root, read-only cgroupfs, no cpu)."""


@dataclasses.dataclass(frozen=True)
class CpuController:
    """Where the CPU controller is mounted and which layout it has."""

    path: pathlib.Path
    version: int  # 1 or 2

    def quota_files(self, cores: float, period_us: int) -> dict[str, str]:
        """File name -> content that limits a group to ``cores`` CPUs in each ``period_us``."""
        quota = quota_us(cores, period_us)
        if self.version == 1:
            return {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota)}
        return {"cpu.max": f"{quota} {period_us}"}


def quota_us(cores: float, period_us: int) -> int:
    """The quota the kernel will hold a group to: at least 1 ms per period, its minimum."""
    return max(1000, round(cores * period_us))


def effective_cores(cores: float, period_us: int) -> float:
    return quota_us(cores, period_us) / period_us


def find_controller(root: pathlib.Path = CGROUP_ROOT) -> CpuController:
    """The v1 ``cpu`` hierarchy if mounted (``root/cpu`` or ``root/cpu,cpuacct``), else v2 at ``root``
    when its ``cgroup.controllers`` lists cpu; raises CgroupUnavailable naming what it found."""
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        path = root / name
        if (path / "cpu.cfs_quota_us").exists():
            return CpuController(path, 1)
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return CpuController(root, 2)
    raise CgroupUnavailable(f"no cgroup CPU controller under {root} (neither cpu/cpu.cfs_quota_us nor a v2 "
                            "cgroup.controllers listing cpu)")


@dataclasses.dataclass(frozen=True)
class Throttling:
    """The counters of one group's ``cpu.stat`` (cumulative)."""

    periods: int
    throttled: int
    throttled_ms: float

    def minus(self, before: Throttling) -> Throttling:
        return Throttling(self.periods - before.periods, self.throttled - before.throttled,
                          self.throttled_ms - before.throttled_ms)


def parse_cpu_stat(text: str) -> Throttling:
    """``cpu.stat`` of either layout -> Throttling (v1 ``throttled_time`` is ns, v2 ``throttled_usec`` us)."""
    fields = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
    if "throttled_time" in fields:
        throttled_ms = int(fields["throttled_time"]) / 1e6
    elif "throttled_usec" in fields:
        throttled_ms = int(fields["throttled_usec"]) / 1e3
    else:
        raise ValueError(f"cpu.stat has no throttling time: {text!r}")
    return Throttling(int(fields["nr_periods"]), int(fields["nr_throttled"]), throttled_ms)


def cgroup_argv(procs_file: pathlib.Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run by a shell that first moves itself into the group, then execs (same pid)."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs_file), *argv]


class CpuHosts:
    """Groups ``PARENT/<run tag>/<host>`` with a quota each; ``close`` removes them (they must be empty)."""

    def __init__(self, controller: CpuController | None = None, period_us: int = 20_000):
        self.controller = controller or find_controller()
        self.period_us = period_us
        self.run_dir = self.controller.path / PARENT / f"run-{uuid.uuid4().hex[:8]}"
        self.groups: dict[str, pathlib.Path] = {}
        try:
            sweep(self.controller.path / PARENT)
            if self.controller.version == 2:
                _enable_cpu_v2(self.controller.path / PARENT)
            self.run_dir.mkdir(parents=True)
            if self.controller.version == 2:
                (self.run_dir / "cgroup.subtree_control").write_text("+cpu")
        except OSError as e:
            raise CgroupUnavailable(f"cannot create {self.run_dir}: {e}") from e

    def add(self, host: str) -> pathlib.Path:
        """A group for ``host``, not limited yet (a service starts and warms at full speed)."""
        group = self.run_dir / host
        group.mkdir()
        self.groups[host] = group
        return group

    def limit(self, host: str, cores: float) -> float:
        """Holds ``host`` to ``cores``; returns the cores the kernel will actually allow (1 ms minimum)."""
        for name, value in self.controller.quota_files(cores, self.period_us).items():
            (self.groups[host] / name).write_text(value)
        return effective_cores(cores, self.period_us)

    def unlimit(self) -> None:
        """Lifts every group's quota: a service drains on SIGTERM within its grace only at full speed."""
        files = {1: {"cpu.cfs_quota_us": "-1"}, 2: {"cpu.max": f"max {self.period_us}"}}[self.controller.version]
        for group in self.groups.values():
            for name, value in files.items():
                with contextlib.suppress(OSError):  # a group this run could not limit: nothing to lift
                    (group / name).write_text(value)

    def procs_file(self, host: str) -> pathlib.Path:
        return self.groups[host] / "cgroup.procs"

    def throttling(self, host: str) -> Throttling:
        return parse_cpu_stat((self.groups[host] / "cpu.stat").read_text())

    def pids(self, host: str) -> list[int]:
        return [int(p) for p in self.procs_file(host).read_text().split()]

    def close(self) -> list[str]:
        """Removes every group (after their processes are gone); returns the ones that could not be."""
        left = []
        for host, group in self.groups.items():
            try:
                group.rmdir()
            except OSError as e:
                left.append(f"{host}: {e}")
        with contextlib.suppress(OSError):
            self.run_dir.rmdir()
        with contextlib.suppress(OSError):  # still holding another run's groups: that run removes it
            self.run_dir.parent.rmdir()
        self.groups.clear()
        return left


def _enable_cpu_v2(parent: pathlib.Path) -> None:
    parent.mkdir(exist_ok=True)
    (parent.parent / "cgroup.subtree_control").write_text("+cpu")
    (parent / "cgroup.subtree_control").write_text("+cpu")


def sweep(parent: pathlib.Path) -> list[pathlib.Path]:
    """Removes run groups under ``parent`` that hold no process (left by a run killed outright)."""
    removed: list[pathlib.Path] = []
    if not parent.is_dir():
        return removed
    for run in parent.glob("run-*"):
        groups = [g for g in run.iterdir() if g.is_dir()]
        if any((g / "cgroup.procs").read_text().strip() for g in groups):
            continue  # a run still going (another bench), or processes that outlived theirs: leave them
        for g in groups:
            with contextlib.suppress(OSError):
                g.rmdir()
        with contextlib.suppress(OSError):
            run.rmdir()
            removed.append(run)
    return removed


@contextlib.contextmanager
def inside_namespace(name: str) -> Iterator[None]:
    """Runs the calling thread in network namespace ``name`` (``ip netns`` names it under /var/run/netns),
    then puts it back: sockets it opens meanwhile, and processes it starts, live in that namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open(f"/proc/{os.getpid()}/task/{_gettid()}/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the bench's own network namespace failed")
    finally:
        os.close(target)
        os.close(home)


def _gettid() -> int:
    import threading

    return threading.get_native_id()
