"""``meshfront <command>``: one entry point for the launcher and every service."""

from __future__ import annotations

import runpy
import sys

COMMANDS = {
    "gateway": "services.gateway",
    "preprocessor": "services.preprocessor",
    "router": "services.router",
    "postprocessor": "services.postprocessor",
    "allinone": "services.allinone",
    "mocker": "services.workers.mocker",
    "hf": "services.workers.hf",
    "vllm": "services.workers.vllm",
    "sglang": "services.workers.sglang",
    "embed": "services.workers.embed",
    "build-model": "services.models",
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in {"-h", "--help"}:
        print("usage: meshfront {run," + ",".join(COMMANDS) + "} [flags]  (each command has --help)")
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "run":
        from services.launcher.run import main as run_main

        sys.exit(run_main(rest))
    if command not in COMMANDS:
        print(f"meshfront: unknown command {command!r}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [f"meshfront {command}", *rest]
    runpy.run_module(COMMANDS[command], run_name="__main__")
