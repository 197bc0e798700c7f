"""``meshfront <command>``: one entry point for the launcher and every service.

Each command's module has ``main(argv)`` (services/common/service_main.py, services/workers/entry.py),
called with the arguments after the command: nothing rewrites ``sys.argv``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# command -> its package (the deploy tests read each package's config module from here)
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
    "sglang-diffusion": "services.workers.sglang_diffusion",
    "vllm-omni": "services.workers.vllm_omni",
    "embed": "services.workers.embed",
    "diffusers": "services.workers.diffusers",
    "build-model": "services.models",
}
# Where a command's ``main(argv)`` is, when not in its package's ``main`` module.
_MAIN_MODULES = {"build-model": "services.models.cli"}


def main_module(command: str) -> str:
    return _MAIN_MODULES.get(command, f"{COMMANDS[command]}.main")


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in {"-h", "--help"}:
        print("usage: meshfront {run,frontend,trace,keys,attach," + ",".join(COMMANDS) +
              "} [flags]  (each command has --help)")
        sys.exit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command == "run":
        from services.launcher.run import main as run_main

        sys.exit(run_main(rest))
    if command == "frontend":  # Dynamo's python -m dynamo.frontend, its flags and DYN_* twins
        from services.frontend.main import main as frontend_main

        sys.exit(frontend_main(rest))
    if command == "keys":  # API keys in NATS (meshfront run --auth): create, revoke, list, usage
        from services.launcher.keys_cli import main as keys_main

        sys.exit(keys_main(rest))
    if command == "trace":  # a request's span tree from the trace viewer (meshfront run --trace)
        from services.launcher.trace_cli import main as trace_main

        sys.exit(trace_main(rest))
    if command == "attach":  # stock engines serving SMG's engine gRPC, registered by address (docs/engine-grpc.md)
        from services.workers.attach.main import main as attach_main

        sys.exit(attach_main(rest))
    if command not in COMMANDS:
        print(f"meshfront: unknown command {command!r}", file=sys.stderr)
        sys.exit(2)
    sys.exit(importlib.import_module(main_module(command)).main(rest))
