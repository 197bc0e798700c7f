"""What every ``python -m bench`` scenario's command line shares: list and speed-up parsing, printing,
the machine line each table is headed with."""

from __future__ import annotations

import os
import platform


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def speedup(text: str) -> float:
    return 0.0 if text == "instant" else float(text)


def emit(line: str) -> None:
    print(line, flush=True)


def machine_line() -> str:
    return f"{os.cpu_count()} cores (shared with other work: figures are noisy), {platform.python_implementation()} " \
           f"{platform.python_version()}, load avg {os.getloadavg()[0]:.1f} at start"
