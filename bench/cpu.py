"""CPU time per server process over a measured window, from ``/proc/<pid>/stat`` and schedstat.

``utime + stime`` in ``/proc/<pid>/stat`` covers all of a process's threads (living and exited) but
not its children; every mesh service is a single process, so the pid alone is the service. It is
printed in clock ticks (usually 10 ms), too coarse for windows of a second or two, so the figures
used are the sum of the per-thread nanosecond counters in ``/proc/<pid>/task/*/schedstat``; that sum
misses threads that exit inside the window, so the tick figure is kept as a cross-check and a
window where the two disagree by more than a couple of ticks per process is flagged.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")

# Report columns, in order, and which process names fold into each.
GROUPS = ("envoy", "gateway", "preprocessor", "router", "postprocessor", "workers", "nats")


def group_of(process_name: str) -> str:
    """``gateway-1`` -> gateway, ``mocker-0``/``hf-0`` -> workers, other names stay as they are."""
    if process_name.startswith("gateway"):
        return "gateway"
    if process_name.startswith(("mocker", "hf")):
        return "workers"
    return process_name


def read_cpu_ms(pid: int) -> float | None:
    """utime + stime of ``pid`` in ms; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing ')'.
    fields = raw[raw.rindex(b")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of the full line
    return (utime + stime) * TICK_MS


def read_threads_cpu_ms(pid: int) -> float | None:
    """Sum of the on-CPU nanoseconds of ``pid``'s live threads, in ms; None when the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return None
    ns = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                ns += int(f.read().split(None, 1)[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread exited meanwhile
            continue
    return ns / 1e6


@dataclasses.dataclass(frozen=True)
class CpuSample:
    ms: dict[str, float]  # process name -> cumulative CPU ms (thread schedstat sum)
    tick_ms: dict[str, float]  # the same from /proc/<pid>/stat, tick resolution


def sample(pids: Mapping[str, int]) -> CpuSample:
    ms, tick_ms = {}, {}
    for name, pid in pids.items():
        ticks = read_cpu_ms(pid)
        precise = read_threads_cpu_ms(pid)
        if ticks is not None and precise is not None:
            ms[name], tick_ms[name] = precise, ticks
    return CpuSample(ms, tick_ms)


@dataclasses.dataclass(frozen=True)
class CpuUsage:
    """CPU spent between two samples, per process and per report group."""

    per_process_ms: dict[str, float]
    missing: list[str]  # processes that vanished during the window
    per_process_tick_ms: dict[str, float] = dataclasses.field(default_factory=dict)

    def disagreements(self) -> list[str]:
        """Processes whose schedstat and tick figures differ by more than tick rounding explains."""
        return [f"{name}: {ms:.0f} vs {self.per_process_tick_ms[name]:.0f} ms"
                for name, ms in self.per_process_ms.items()
                if name in self.per_process_tick_ms and abs(ms - self.per_process_tick_ms[name]) > 3 * TICK_MS]

    def by_group(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, ms in self.per_process_ms.items():
            g = group_of(name)
            out[g] = out.get(g, 0.0) + ms
        return out

    @property
    def total_ms(self) -> float:
        return sum(self.per_process_ms.values())

    def per_request(self, requests: int) -> dict[str, float]:
        """Group -> CPU ms per request, plus ``total``."""
        n = max(1, requests)
        out = {g: ms / n for g, ms in self.by_group().items()}
        out["total"] = self.total_ms / n
        return out


def usage_between(before: CpuSample, after: CpuSample) -> CpuUsage:
    per = {name: after.ms[name] - ms for name, ms in before.ms.items() if name in after.ms}
    ticks = {name: after.tick_ms[name] - ms for name, ms in before.tick_ms.items() if name in after.tick_ms}
    return CpuUsage(per, sorted(set(before.ms) - set(after.ms)), ticks)


def read_machine_busy_ms() -> float:
    """Busy CPU ms of the whole machine (all cores) from /proc/stat, to spot other load in a window."""
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) * TICK_MS
