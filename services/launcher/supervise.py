"""Supervises the mesh's processes the way Kubernetes supervises a pod's containers.

``meshfront run`` hands the plan's process specs to :class:`Supervisor`:

- every process runs in its own session (so its process group holds it and everything it forks);
  its output is printed line by line as ``HH:MM:SS name | line``, as honcho printed it;
- a process that exits is restarted after an exponential backoff, with a line that says how it
  ended (exit code or signal). What is left of its process group (an engine's children) is killed
  first, as Kubernetes kills a container's every process;
- a process that fails ``max_fast_failures`` times in a row, each time within ``crash_window_s`` of
  its start, is given up on (CrashLoopBackOff's verdict, but final): the whole mesh is stopped and
  :meth:`Supervisor.run` returns 1;
- SIGINT / SIGTERM stop everything: SIGTERM to each process group in stop order (Envoy and gateways
  first, NATS last), SIGKILL to a group that is still there after the grace period, and to every
  orphan a process left behind. A second SIGINT kills at once.

The restart decisions are pure functions (:func:`judge_exit`, :func:`describe_exit`) so they are
tested without processes (tests/unit/launcher/test_supervise.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import datetime
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TextIO

# --- restart policy (pure) -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """When and how fast a dead process comes back.

    A failure is *fast* when the process ran less than ``crash_window_s``. A process comes back at
    once after a run that lasted the window, and after its first fast failure (its clients are
    waiting). Further fast failures in a row wait ``backoff_initial_s``, then ``backoff_factor`` times
    longer each time, up to ``backoff_max_s``; the ``max_fast_failures``-th in a row is final. A run
    that lasts the window resets the count, as Kubernetes resets its backoff once a container has run
    for a while.
    """

    backoff_initial_s: float = 1.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 30.0
    crash_window_s: float = 10.0
    max_fast_failures: int = 5

    def __post_init__(self) -> None:
        if self.max_fast_failures < 1:
            raise ValueError("max_fast_failures must be at least 1")
        if self.backoff_initial_s < 0 or self.backoff_factor < 1 or self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff must be 0 <= initial <= max with a factor >= 1")
        if self.crash_window_s <= 0:
            raise ValueError("crash_window_s must be positive")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What to do about one exit: give up, or start again after ``delay_s``."""

    give_up: bool
    delay_s: float
    # Fast failures in a row, this exit included (0 when the process had run past the window).
    fast_failures: int
    fast: bool


def backoff_delay(policy: RestartPolicy, fast_failures: int) -> float:
    """Delay before the next start after ``fast_failures`` fast failures in a row (0: it had run a while)."""
    if fast_failures <= 1:
        return 0.0
    return min(policy.backoff_max_s, policy.backoff_initial_s * policy.backoff_factor ** (fast_failures - 2))


def judge_exit(policy: RestartPolicy, fast_failures_before: int, uptime_s: float) -> Verdict:
    """Decides about a process that exited after ``uptime_s`` seconds, given its fast failures in a row."""
    fast = uptime_s < policy.crash_window_s
    streak = fast_failures_before + 1 if fast else 0
    if streak >= policy.max_fast_failures:
        return Verdict(True, 0.0, streak, fast)
    return Verdict(False, backoff_delay(policy, streak), streak, fast)


def describe_exit(returncode: int) -> str:
    """``exit code 1`` or ``signal 9 (SIGKILL)``, from a Popen-style return code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return f"signal {-returncode} ({name})"
    return f"exit code {returncode}"


def stop_groups(names: Iterable[str], tiers: Sequence[Iterable[str]]) -> list[list[str]]:
    """Orders ``names`` for stopping: one group per tier (names or ``prefix*`` patterns), then the rest.

    Each group is stopped (and waited for) before the next one gets SIGTERM.
    """
    left = list(names)
    groups: list[list[str]] = []
    for tier in tiers:
        patterns = list(tier)
        group = [n for n in left if any(n == p or (p.endswith("*") and n.startswith(p[:-1])) for p in patterns)]
        left = [n for n in left if n not in group]
        if group:
            groups.append(group)
    if left:
        groups.append(left)
    return groups


# --- output ----------------------------------------------------------------------------------------

# honcho's palette: cyan, yellow, green, magenta, red, blue, then their intense versions.
COLOURS = ("36", "33", "32", "35", "31", "34", "1;36", "1;33", "1;32", "1;35", "1;31", "1;34")
SYSTEM = "system"


class Printer:
    """``HH:MM:SS name | line``, names padded to one width, coloured when the output is a terminal."""

    def __init__(self, names: Iterable[str], out: TextIO | None = None, colour: bool | None = None):
        self.out = out if out is not None else sys.stdout
        names = [SYSTEM, *names]
        self.width = max(len(n) for n in names)
        if colour is None:
            colour = self.out.isatty() and os.environ.get("NO_COLOR") is None
        self.colour = colour
        self.colours = {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(n for n in names if n != SYSTEM)}

    def prefix(self, name: str) -> str:
        text = f"{datetime.datetime.now():%H:%M:%S} {name.ljust(self.width)} | "
        code = self.colours.get(name)
        return f"\033[0m\033[{code}m{text}\033[0m" if self.colour and code else text

    def line(self, name: str, text: str) -> None:
        try:
            self.out.write(self.prefix(name) + text + "\n")
            self.out.flush()
        except (OSError, ValueError):  # a closed or broken output must not stop the supervision
            pass

    def system(self, text: str) -> None:
        self.line(SYSTEM, text)


# --- processes -------------------------------------------------------------------------------------

_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> bool:
    """Orphaned descendants are reparented to us rather than to init, so the final sweep finds them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _killpg(pgid: int, sig: int) -> bool:
    """Signals a whole process group; False when nothing is left in it."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live or zombie process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return int(fields[1]), fields[0]


def children_of(pid: int) -> list[tuple[int, str]]:
    """Direct children (pid, state) of ``pid`` (Linux /proc; empty elsewhere)."""
    out = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                stat = _proc_stat(int(entry))
                if stat and stat[0] == pid:
                    out.append((int(entry), stat[1]))
    return out


async def wait_exit(proc: subprocess.Popen) -> int:
    """Waits for the process itself to exit (not for its pipes to close, as asyncio's wait() does)."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (not Linux 5.3+): poll
        while proc.poll() is None:
            await asyncio.sleep(0.1)
        return proc.returncode
    try:
        exited = loop.create_future()
        loop.add_reader(fd, lambda: None if exited.done() else exited.set_result(None))
        try:
            await exited
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
    return proc.wait()


@dataclasses.dataclass
class Spec:
    """What the supervisor needs of a process: a name, a command line and its whole environment."""

    name: str
    argv: list[str]
    env: Mapping[str, str] | None = None


class _Child:
    def __init__(self, spec: Spec, policy: RestartPolicy):
        self.spec = spec
        self.policy = policy
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.fast_failures = 0
        self.restarts = 0
        self.task: asyncio.Task | None = None

    def running_pid(self) -> int | None:
        """The pid while the process runs, else None."""
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None


class Supervisor:
    """Runs ``specs`` until a signal (returns 0) or until one of them crash-loops (returns 1).

    ``policies`` overrides ``policy`` per process name; ``stop_order`` is a list of name groups (see
    :func:`stop_groups`) stopped one after the other. With ``adopt_orphans`` (Linux) the supervisor
    becomes the child subreaper of everything it starts and kills whatever is orphaned beneath it.
    """

    def __init__(self, specs: Sequence[Spec], policy: RestartPolicy | None = None, *,
                 policies: Mapping[str, RestartPolicy] | None = None, stop_order: Sequence[Sequence[str]] = (),
                 stop_grace_s: float = 15.0, out: TextIO | None = None, colour: bool | None = None,
                 adopt_orphans: bool = False):
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique: {names}")
        policy = policy or RestartPolicy()
        self.children = {s.name: _Child(s, (policies or {}).get(s.name, policy)) for s in specs}
        self.printer = Printer(names, out, colour)
        self.stop_grace_s = stop_grace_s
        self.order = stop_groups(names, stop_order)
        self.returncode = 0
        self._stopping: asyncio.Event | None = None
        self._force = False
        self._reason = ""
        # Only for a process that does nothing but supervise (the launcher): every child it has that
        # is not one of the supervised processes is then an orphan to kill.
        self.adopt_orphans = adopt_orphans

    # -- public -------------------------------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        """The current pid of every running process."""
        return {n: pid for n, c in self.children.items() if (pid := c.running_pid()) is not None}

    def request_stop(self, reason: str, returncode: int = 0) -> None:
        if self._stopping is None or self._stopping.is_set():
            return
        self._reason = reason
        self.returncode = returncode
        self._stopping.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self.adopt_orphans:
            self.adopt_orphans = _become_subreaper()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
        try:
            for child in self.children.values():
                child.task = asyncio.create_task(self._supervise(child), name=f"supervise {child.spec.name}")
            await self._stopping.wait()
            self.printer.system(f"stopping every process ({self._reason})")
            await self._stop_all()
        finally:
            for child in self.children.values():
                if child.task is not None and not child.task.done():
                    child.task.cancel()
            await asyncio.gather(*(c.task for c in self.children.values() if c.task), return_exceptions=True)
            for child in self.children.values():  # cancelled or not, nothing may outlive the launcher
                if child.proc is not None:
                    _killpg(child.proc.pid, signal.SIGKILL)
                    if child.proc.returncode is None:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            child.proc.wait(5)
            self._sweep_orphans()
            for sig in installed:
                loop.remove_signal_handler(sig)
        self.printer.system("every process stopped" + (f"; exit status {self.returncode}" if self.returncode else ""))
        return self.returncode

    # -- internals ----------------------------------------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._stopping is not None and self._stopping.is_set():
            if sig == signal.SIGINT and not self._force:
                self._force = True
                self.printer.system(f"{name} again: killing every process now")
                for child in self.children.values():
                    if child.proc is not None:
                        _killpg(child.proc.pid, signal.SIGKILL)
            return
        self.request_stop(f"{name} received")

    async def _pump(self, name: str, pipe) -> None:
        """Prints the process's output line by line until EOF (or until cancelled)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        pending = b""
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self.printer.line(name, raw.decode("utf-8", "replace").rstrip("\r"))
                if len(pending) > 65536:  # a very long line without a newline: print what there is
                    self.printer.line(name, pending.decode("utf-8", "replace"))
                    pending = b""
        finally:
            if pending:
                self.printer.line(name, pending.decode("utf-8", "replace").rstrip("\r"))
            transport.close()

    def _start(self, child: _Child) -> subprocess.Popen:
        spec = child.spec
        # Its own session: its process group holds it and whatever it forks (an engine's workers), and
        # a terminal's Ctrl-C reaches only the launcher, which then stops everything in order.
        proc = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=dict(spec.env) if spec.env is not None else None,
                                start_new_session=True)
        child.proc = proc
        child.started_at = time.monotonic()
        return proc

    async def _supervise(self, child: _Child) -> None:
        assert self._stopping is not None
        name = child.spec.name
        while not self._stopping.is_set():
            rc: int | None = None
            try:
                proc = self._start(child)
            except OSError as e:  # not even started (missing binary): a fast failure like any other
                self.printer.system(f"{name} could not start: {e}")
                child.proc, child.started_at = None, time.monotonic()
            else:
                self.printer.system(f"{name} started (pid={proc.pid})"
                                    + (f", restart {child.restarts}" if child.restarts else ""))
                pump = asyncio.create_task(self._pump(name, proc.stdout))
                try:
                    rc = await wait_exit(proc)
                finally:
                    # Whatever it forked goes with it, as a container's processes do: its group, and
                    # children that left the group (orphans now, reparented to us).
                    _killpg(proc.pid, signal.SIGKILL)
                    self._sweep_orphans()
                    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                        # Something we cannot see may still hold the pipe open: do not wait for it forever.
                        async with asyncio.timeout(2.0):
                            await asyncio.shield(pump)
                    if not pump.done():
                        pump.cancel()
            if self._stopping.is_set():
                self.printer.system(f"{name} stopped" + (f" with {describe_exit(rc)}" if rc is not None else ""))
                return
            uptime = time.monotonic() - child.started_at
            verdict = judge_exit(child.policy, child.fast_failures, uptime)
            child.fast_failures = verdict.fast_failures
            how = f"ended with {describe_exit(rc)}" if rc is not None else "could not start"
            if verdict.give_up:
                self.printer.system(
                    f"{name} {how} after {uptime:.1f} s: {verdict.fast_failures} failures in a row, each "
                    f"within {child.policy.crash_window_s:g} s of its start; giving up and stopping the mesh")
                self.request_stop(f"{name} is crash-looping", 1)
                return
            child.restarts += 1
            when = f"in {verdict.delay_s:g} s" if verdict.delay_s else "now"
            self.printer.system(f"{name} {how} after {uptime:.1f} s; restarting {when}"
                                + (f" (fast failure {verdict.fast_failures} of {child.policy.max_fast_failures})"
                                   if verdict.fast else ""))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(verdict.delay_s):
                    await self._stopping.wait()

    async def _stop_all(self) -> None:
        for group in self.order:
            children = [self.children[n] for n in group]
            for child in children:
                if (pid := child.running_pid()) is not None:
                    _killpg(pid, signal.SIGTERM)
            tasks = [c.task for c in children if c.task is not None and not c.task.done()]
            if not tasks:
                continue
            _, late = await asyncio.wait(tasks, timeout=self.stop_grace_s)
            if late:
                for child in children:
                    if child.task in late and child.proc is not None:
                        self.printer.system(f"{child.spec.name} ignored SIGTERM for {self.stop_grace_s:g} s: SIGKILL")
                        _killpg(child.proc.pid, signal.SIGKILL)
                await asyncio.wait(late, timeout=5.0)

    def _sweep_orphans(self) -> None:
        """Kills and reaps processes that were reparented to us (a killed process's escaped children)."""
        if not self.adopt_orphans:
            return
        ours = {c.proc.pid for c in self.children.values() if c.proc is not None}
        for pid, state in children_of(os.getpid()):
            if pid in ours:
                continue
            if state != "Z":
                self.printer.system(f"killing orphaned process {pid}")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
