"""`make test`: every tier of the test suite, side by side where the machine allows, and what each cost.

The tiers are independent processes (lint, the pytest tiers, the engine environments' own runs), so the
slow parts overlap: the engine environments build (or come from the cache, services/launcher/engine_env.py)
while the unit and mesh tiers run, and a tier that needs one waits for it alone. At most ``--jobs``
tiers run at once (default: one more than the machine's cores, at least 3): most of a mesh test's time is
waiting on processes and sockets, and each tier keeps less than a core busy on average (the report's CPU
column: the engine and service tiers about half their wall time, the mesh tier under 0.9), so one tier per core
leaves cores idle.

Each tier's output goes to ``build/test-logs/<tier>.log``; a failed tier's whole log is printed when it
ends, a passed one's last line. The run ends with one line per tier (its result and wall time, and what
it waited for), so the cost of every tier stays visible, and exits non-zero if any tier failed.

    python tools/test_tiers.py [--jobs N] [--only TIER,...] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "build" / "test-logs"
BIN = ROOT / ".venv" / "bin"
# The engine environments' own pytest runs: their packages, not the mesh's, so no project addopts.
NOT_RUN = -1000
# The mesh tests that start Phoenix (.venv-phoenix) or SGLang's chat processor (.venv-sglang).
MESH_WITH_ENVS = ("tests/mesh/test_tracing.py", "tests/mesh/test_chat_processor_sglang.py")
ENGINE_ENV_PYTEST = ("-m", "pytest", "--durations=15", "-o", "addopts=-ra --strict-markers --import-mode=importlib")


@dataclasses.dataclass
class Tier:
    name: str
    argv: list[str]
    needs: tuple[str, ...] = ()  # tiers that must pass first (an environment build, say)
    pytest: bool = True  # takes the extra pytest arguments
    takes_slot: bool = True  # counts against --jobs
    # filled in as it runs
    started: float = 0.0
    ended: float = 0.0
    cpu_s: float = 0.0  # user + system CPU of the tier's process and every descendant it waited for
    returncode: int | None = None  # None while waiting or running; NOT_RUN when what it needs failed

    @property
    def log(self) -> Path:
        return LOGS / f"{self.name}.log"


def tiers() -> list[Tier]:
    # Every pytest tier lists its slowest tests in its log, so a test that grows shows where.
    py, pytest = str(BIN / "python"), [str(BIN / "python"), "-m", "pytest", "--durations=15"]
    env = [py, "-m", "services.launcher.engine_env"]
    lint = [["buf", "lint"], ["buf", "breaking", "protos", "--against", "tools/released-protos.binpb"],
            ["ruff", "check", "."], ["mypy"], ["python", "tools/codegen.py", "--check"],
            ["python", "tools/k8s_envoy_config.py", "--check"]]
    return [
        # The environments first: the longest builds start before anything else (instant when cached).
        Tier("env-vllm", [*env, "vllm"], pytest=False, takes_slot=False),
        Tier("env-phoenix", [*env, "phoenix"], pytest=False, takes_slot=False),
        Tier("env-sglang", [*env, "sglang"], pytest=False, takes_slot=False),
        # The rest longest first, so the longest tiers (engine, mesh) are not the last to start.
        Tier("engine", [*pytest, "tests/engine"], needs=("env-vllm",)),
        # By directory, not by marker: each pytest collects (imports) only its own tests.
        Tier("mesh", [*pytest, "tests/mesh", *(f"--ignore={f}" for f in MESH_WITH_ENVS)]),
        Tier("service+deploy", [*pytest, "tests/service", "tests/deploy"]),
        Tier("unit", [*pytest, "tests/unit"]),
        # The adapters checked against the engines' own classes, each in its engine's environment (SGLang cannot
        # run a model on a CPU; this is where its adapter is tested), and our tool-call and reasoning parsers
        # against the engines' on every golden stream (test_*_parser_oracle.py, about a minute each).
        Tier("engine-env-vllm", [".venv-vllm/bin/python", *ENGINE_ENV_PYTEST, "tests/engine_env/vllm"],
             needs=("env-vllm",)),
        Tier("lint", ["bash", "-c", " && ".join(shlex.join([str(BIN / a[0]), *a[1:]]) for a in lint)], pytest=False),
        Tier("engine-env-sglang", [".venv-sglang/bin/python", *ENGINE_ENV_PYTEST, "tests/engine_env/sglang"],
             needs=("env-sglang",)),
        # The mesh tests that run a process from another environment wait for it; the rest of the tier does not.
        Tier("mesh-envs", [*pytest, *MESH_WITH_ENVS], needs=("env-phoenix", "env-sglang")),
        # Its own process: its conftest puts vLLM-Omni's source on the path, which the vLLM checks must not see.
        Tier("engine-env-omni", [".venv-vllm/bin/python", *ENGINE_ENV_PYTEST, "tests/engine_env/vllm_omni"],
             needs=("env-vllm",)),
    ]


def summary(log: str) -> str:
    """pytest's last "== N passed in T ==" line (engines log after it), or the log's last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    pytest_lines = [line for line in lines if line.startswith("=") and " in " in line and line.endswith("=")]
    return (pytest_lines or lines or [""])[-1].strip("= ")


class Runner:
    """Starts tiers in plan order as slots free up; a tier waits for what it needs in its place, and an
    environment build takes no slot (it is mostly downloading and unpacking, and the tiers that need it wait)."""

    def __init__(self, plan: list[Tier], jobs: int, pytest_args: list[str]):
        self.plan, self.jobs, self.pytest_args = plan, jobs, pytest_args
        self.by_name = {t.name: t for t in plan}
        self.changed = threading.Condition()
        self.printing = threading.Lock()
        self.t0 = time.monotonic()
        self.stat0 = cpu_times()

    def say(self, line: str) -> None:
        with self.printing:  # tiers end on their own threads: one line at a time
            print(f"[{time.monotonic() - self.t0:6.0f} s] {line}", flush=True)

    def run(self) -> int:
        LOGS.mkdir(parents=True, exist_ok=True)
        waiting, running = list(self.plan), list[Tier]()
        with self.changed:
            while waiting or any(t.returncode is None for t in running):
                held = 0  # slots kept by waiting tiers
                for tier in list(waiting):
                    needs = [self.by_name[n] for n in tier.needs if n in self.by_name]
                    busy = held + sum(1 for t in running if t.returncode is None and t.takes_slot)
                    if tier.takes_slot and busy >= self.jobs:
                        continue
                    if any(n.returncode is None for n in needs):
                        # It keeps its place: a later tier must not take the slot it starts in once its
                        # environment is ready (seconds from the cache; while a cold build runs, the build
                        # has the cores anyway).
                        held += tier.takes_slot
                        continue
                    waiting.remove(tier)
                    failed = [n.name for n in needs if n.returncode != 0]
                    if failed:
                        tier.returncode = NOT_RUN
                        self.say(f"{tier.name}: not run ({', '.join(failed)} failed)")
                        continue
                    running.append(tier)
                    tier.started = time.monotonic()
                    threading.Thread(target=self._run_tier, args=(tier,), daemon=True).start()
                self.changed.wait(5)
        self._report()
        return 0 if all(t.returncode == 0 for t in self.plan) else 1

    def _run_tier(self, tier: Tier) -> None:
        argv = tier.argv + (self.pytest_args if tier.pytest else [])
        self.say(f"{tier.name}: started ({shlex.join(argv)})")
        with open(tier.log, "w") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            # wait4, not wait: its rusage is what the tier cost in CPU, which wall time alone does not show
            # (a tier waiting on sockets leaves the cores to the others).
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = returncode = os.waitstatus_to_exitcode(status)
        tier.cpu_s = usage.ru_utime + usage.ru_stime
        tier.ended = time.monotonic()
        text = tier.log.read_text(errors="replace")
        if returncode == 0:
            self.say(f"{tier.name}: passed in {tier.ended - tier.started:.0f} s ({summary(text)})")
        else:
            self.say(f"{tier.name}: FAILED (exit {returncode}) in {tier.ended - tier.started:.0f} s; "
                     f"its log:\n{text}\n[end of {tier.name}'s log]")
        with self.changed:
            tier.returncode = returncode
            self.changed.notify_all()

    def _report(self) -> None:
        print(f"\n{'tier':<20} {'result':<8} {'wall s':>7} {'from s':>7} {'CPU s':>7}")
        for t in self.plan:
            result = "passed" if t.returncode == 0 else "not run" if t.returncode == NOT_RUN else "FAILED"
            wall, start = (t.ended - t.started, t.started - self.t0) if t.ended else (0.0, 0.0)
            print(f"{t.name:<20} {result:<8} {wall:7.0f} {start:7.0f} {t.cpu_s:7.0f}")
        busy, cores = machine_busy(self.stat0, cpu_times())
        print(f"{'make test':<20} {'':<8} {time.monotonic() - self.t0:7.0f} {'':>7} {'':>7}  "
              f"(the machine's {cores} cores {busy:.0%} busy)", flush=True)


def cpu_times() -> list[int]:
    """The machine's CPU time so far, in ticks by kind (user, nice, system, idle, iowait, ...): /proc/stat."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def machine_busy(before: list[int], after: list[int]) -> tuple[float, int]:
    """The share of all cores' time spent busy between two readings, and the number of cores."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    idle = spent[3] + spent[4]  # idle and iowait
    return (1 - idle / sum(spent) if sum(spent) else 0.0), os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pytest_args = args[args.index("--") + 1:] if "--" in args else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=max(3, (os.cpu_count() or 2) + 1), help="tiers at once")
    parser.add_argument("--only", default="", help="comma-separated tiers (and what they need)")
    opts = parser.parse_args(args[: args.index("--")] if "--" in args else args)
    plan = tiers()
    if opts.only:
        by_name = {t.name: t for t in plan}
        wanted: set[str] = set()
        stack = opts.only.split(",")
        while stack:
            name = stack.pop()
            if name not in by_name:
                parser.error(f"unknown tier {name!r} (tiers: {', '.join(by_name)})")
            wanted.add(name)
            stack.extend(by_name[name].needs)
        plan = [t for t in plan if t.name in wanted]
    return Runner(plan, opts.jobs, pytest_args).run()


if __name__ == "__main__":
    sys.exit(main())
