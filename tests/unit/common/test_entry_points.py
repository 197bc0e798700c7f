"""Every process has one entry shape: ``main(argv)`` parses the argv it is given, and a bad value is one
line on stderr and exit status 2, before anything binds, loads or connects."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import subprocess
import sys

import pytest

from services import cli

pytestmark = pytest.mark.unit

SERVICES = ["gateway", "preprocessor", "router", "postprocessor", "allinone"]
WORKERS = ["mocker", "hf", "embed", "vllm", "sglang", "diffusers", "sglang-diffusion", "vllm-omni"]


@pytest.fixture
def no_env_twins(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("MESHFRONT_")]:
        monkeypatch.delenv(name)


def test_every_command_is_a_service_or_a_worker():
    assert set(cli.COMMANDS) == {*SERVICES, *WORKERS, "build-model"}


@pytest.mark.parametrize("command", SERVICES + WORKERS)
def test_every_main_takes_argv_and_a_bad_value_exits_2_with_one_line(command, capsys, monkeypatch, no_env_twins):
    main = importlib.import_module(cli.main_module(command)).main
    assert list(inspect.signature(main).parameters) == ["argv"]
    # Were sys.argv read instead of the argv given, this would print the help and exit 0.
    monkeypatch.setattr(sys, "argv", [f"meshfront {command}", "--help"])
    with pytest.raises(SystemExit) as exit_:
        main(["--drain-grace-s", "-1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"meshfront {command}: ") and "--drain-grace-s -1" in err, err


def test_the_cli_hands_the_command_its_argv_and_leaves_sys_argv_alone(capsys, monkeypatch, no_env_twins):
    argv = ["meshfront", "router", "--queue-timeout-s", "-5"]
    monkeypatch.setattr(sys, "argv", list(argv))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["router", "--queue-timeout-s", "-5"])
    assert exit_.value.code == 2 and sys.argv == argv
    assert capsys.readouterr().err.startswith("meshfront router: --queue-timeout-s -5 must be >= 0")


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["services.router", "--router-temperature", "-1"], {}, "meshfront router: --router-temperature -1 must be >= 0"),
    (["services.workers.mocker", "--model-dir", "."], {"MESHFRONT_MOCKER_TOOL_CALL_PARSER": "hermes3"},
     "meshfront mocker: MESHFRONT_MOCKER_TOOL_CALL_PARSER='hermes3' (the env twin of --tool-call-parser): "
     "invalid choice"),
])
def test_a_process_given_a_bad_value_exits_2_with_one_line(argv, env, expected):
    proc = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), **env})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(expected), proc.stderr
    assert "READY" not in proc.stdout


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_an_engine_worker_without_its_engine_names_a_command_that_prepares_it(kind, demo_model_dir, capsys,
                                                                                 no_env_twins):
    assert importlib.util.find_spec(kind) is None  # the mesh's own environment never has the engines
    from services.launcher import engine_env
    from services.launcher.run import parse_args

    main = importlib.import_module(cli.main_module(kind)).main
    with pytest.raises(SystemExit) as exit_:
        main(["--model-dir", str(demo_model_dir), "--no-register"])
    err = str(exit_.value.code)
    assert err.startswith(f"{kind}: ") and "\n" not in err and kind in engine_env.ENGINES
    for command in ("meshfront run --worker-kind", "python -m services.launcher.engine_env"):
        if command in err:  # whichever command the message names must accept this kind
            if command.startswith("meshfront run"):
                assert parse_args(["--worker-kind", kind]).worker_kind == kind
            break
    else:
        pytest.fail(f"the message names no command that prepares {kind}: {err}")
