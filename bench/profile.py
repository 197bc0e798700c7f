"""Sampling profiles of mesh processes during a measured level (py-spy), summarised as top frames.

``python -m bench mesh --profile DIR`` runs ``py-spy record`` on the named processes for the whole
of every measured level (non-blocking, so a process is never paused, unless ``--profile-native``
asks for C and Cython frames too), keeps the collapsed stacks in DIR and prints, per process, the
functions with the most samples: by self time (the frame that was running) and inclusive (anywhere
on the stack). Idle threads are not sampled, so the shares are of
the CPU the process actually used. py-spy comes from PyPI (requirements/lock.txt).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy() -> str:
    """The py-spy binary beside this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("--profile needs py-spy (pip install -r requirements/lock.txt)")
    return found


def _frame_name(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py)``: lines of one function add up."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    return f"{m['func']} ({Path(m['file']).name})"


@dataclasses.dataclass
class Profile:
    """Sample counts of one process's collapsed stacks."""

    samples: int
    self_counts: collections.Counter[str]
    inclusive_counts: collections.Counter[str]

    @classmethod
    def parse(cls, text: str) -> Profile:
        own: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        total = 0
        for line in text.splitlines():
            m = _LINE.match(line.strip())
            if not m:
                continue
            count = int(m["count"])
            frames = [_frame_name(f) for f in m["stack"].split(";") if f]
            if not frames:
                continue
            total += count
            own[frames[-1]] += count
            for name in set(frames):
                inclusive[name] += count
        return cls(total, own, inclusive)

    def summary(self, top: int = 12) -> list[str]:
        if not self.samples:
            return ["  (no samples)"]
        lines = [f"  {self.samples} samples; self:"]
        lines += [f"    {100 * n / self.samples:5.1f} %  {name}" for name, n in self.self_counts.most_common(top)]
        # The frames on every stack of the main thread (runpy, main, the event loop's run) say nothing.
        roots = max(self.inclusive_counts.values())
        lines.append("  inclusive (below the event loop):")
        lines += [f"    {100 * n / self.samples:5.1f} %  {name}"
                  for name, n in self.inclusive_counts.most_common() if n < roots][:top]
        return lines


class Profiler:
    """py-spy on some of a mesh's processes, started and stopped around one level.

    Args:
        out_dir: where the collapsed stacks go (``<label>-<process>.txt``).
        pids: every process of the mesh by launcher name.
        names: which to profile: a name matches itself and its numbered replicas (``gateway`` matches
            ``gateway-0``).
        rate: samples per second.
        native: sample C/Cython frames too (grpc's Cython layer and core, uvloop), not only Python's.
    """

    def __init__(self, out_dir: Path, pids: dict[str, int], names: tuple[str, ...], rate: int = 200,
                 native: bool = False):
        self._out = out_dir
        self._out.mkdir(parents=True, exist_ok=True)
        self._targets = {n: pid for n, pid in pids.items()
                         if any(n == want or n.startswith(f"{want}-") for want in names)}
        if not self._targets:
            raise RuntimeError(f"--profile-process {','.join(names)} matches none of {sorted(pids)}")
        self._rate = rate
        self._native = native
        self._running: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(self, label: str) -> None:
        binary = py_spy()
        for name, pid in self._targets.items():
            path = self._out / f"{label}-{name}.txt"
            proc = subprocess.Popen(
                [binary, "record", "--pid", str(pid), "--rate", str(self._rate),
                 # Native unwinding must pause the process per sample; Python-only sampling need not.
                 *(["--native"] if self._native else ["--nonblocking"]), "--format", "raw", "-o", str(path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self._running[name] = (proc, path)

    def stop(self) -> dict[str, Profile]:
        """Stops every recorder (py-spy writes its file on SIGINT) and parses what they wrote."""
        running, self._running = self._running, {}
        for proc, _ in running.values():
            proc.send_signal(signal.SIGINT)
        profiles = {}
        for name, (proc, path) in running.items():
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if not path.exists():
                raise RuntimeError(f"py-spy wrote no profile of {name}: {err.decode(errors='replace')[-500:]}")
            profiles[name] = Profile.parse(path.read_text())
        return profiles


def report(label: str, profiles: dict[str, Profile], top: int = 12) -> str:
    lines = []
    for name, profile in profiles.items():
        lines.append(f"{label} {name}:")
        lines += profile.summary(top)
    return "\n".join(lines)
