"""CPU time per server process over a measured window, from ``/proc/<pid>/stat`` and schedstat.

``utime + stime`` in ``/proc/<pid>/stat`` covers all of a process's threads (living and exited) but
not its children; every mesh service is a single process, so the pid alone is the service. An engine
worker is not (vLLM's API process runs its engine core in a child process, which has children of its
own): ``descendants`` finds a process's children, grandchildren and so on from the parent pids in
``/proc/*/stat``, so they can be sampled as processes of their own. It is
printed in clock ticks (usually 10 ms), too coarse for windows of a second or two, so the figures
used are the sum of the per-thread nanosecond counters in ``/proc/<pid>/task/*/schedstat``; that sum
misses threads that exit inside the window, so the tick figure is kept as a cross-check and a
window where the two disagree by more than a couple of ticks per process is flagged.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")

# Report columns, in order, and which process names fold into each.
GROUPS = ("envoy", "gateway", "preprocessor", "router", "postprocessor", "workers", "nats")


def group_of(process_name: str) -> str:
    """``gateway-1`` -> gateway, ``mocker-0``/``hf-0`` -> workers, other names stay as they are."""
    if process_name.startswith("gateway"):
        return "gateway"
    if process_name.startswith(("mocker", "hf", "vllm", "sglang")):
        return "workers"
    return process_name


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the command name); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing ')'.
    return raw[raw.rindex(b")") + 2:].split()


def parent_table() -> dict[int, int]:
    """pid -> parent pid of every process on the machine (a snapshot of ``/proc``)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                out[int(entry)] = int(fields[1])  # field 4 of the full line
    return out


def descendants(pid: int, parents: Mapping[int, int] | None = None) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), parents before their children.

    ``parents`` is a pid -> parent pid table (default: ``parent_table()`` now).
    """
    parents = parent_table() if parents is None else parents
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    out, queue = [], sorted(children.get(pid, ()))
    while queue:
        p = queue.pop(0)
        if p in out or p == pid:  # a table with a cycle cannot come from /proc, but must not hang
            continue
        out.append(p)
        queue += sorted(children.get(p, ()))
    return out


def process_label(pid: int) -> str | None:
    """A short name for ``pid``: its process title when it set one (``VLLM::EngineCore``), else its
    command's base name with the module run by ``python -m`` or ``-c``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        with open(f"/proc/{pid}/comm", "rb") as f:
            comm = f.read().decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return label_from_argv(argv, comm)


def label_from_argv(argv: list[str], comm: str = "") -> str:
    """``process_label``'s rule on a command line (pure, for tests)."""
    if not argv:
        return comm or "?"
    if len(argv) == 1 and " " in argv[0]:  # setproctitle may write the whole title into argv[0]
        argv = argv[0].split()
    base = os.path.basename(argv[0])
    if not base.startswith("python"):
        return base  # a process title (VLLM::EngineCore) or a plain program
    for flag in ("-m", "-c"):
        if flag in argv[1:-1]:
            arg = argv[argv.index(flag) + 1]
            if flag == "-c":  # multiprocessing's helpers: "from multiprocessing.resource_tracker import main..."
                words = arg.replace(";", " ").split()
                arg = next((w for w in words if w.startswith("multiprocessing.")), "python -c")
            return arg
    return base


def read_cpu_ms(pid: int) -> float | None:
    """utime + stime of ``pid`` in ms; None when the process is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
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

    def by_group(self, group: Callable[[str], str] = group_of) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, ms in self.per_process_ms.items():
            g = group(name)
            out[g] = out.get(g, 0.0) + ms
        return out

    @property
    def total_ms(self) -> float:
        return sum(self.per_process_ms.values())

    def per_request(self, requests: int, group: Callable[[str], str] = group_of) -> dict[str, float]:
        """Group -> CPU ms per request, plus ``total``."""
        n = max(1, requests)
        out = {g: ms / n for g, ms in self.by_group(group).items()}
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
