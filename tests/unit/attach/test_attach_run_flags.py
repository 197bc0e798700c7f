"""`meshfront run --engine-grpc ADDR` and `meshfront attach`'s flags: the run starts the registrar instead of
simulated workers, with a command line the registrar accepts; bad combinations are refused before anything starts."""

from __future__ import annotations

import pytest

from services.launcher import engine_grpc
from services.launcher.plan import MeshPlan, specs
from services.launcher.run import _generating_workers, _placement, parse_args
from services.workers.attach.main import flag_error, parser, settings_of

pytestmark = pytest.mark.unit

NO_EXTRAS = ["--embedding-workers", "0", "--image-workers", "0", "--video-workers", "0"]


def test_run_with_engines_starts_the_registrar_and_no_simulated_worker(tmp_path):
    args = parse_args(["--engine-grpc", "10.0.0.1:50051", "--engine-grpc", "10.0.0.2:50051", *NO_EXTRAS,
                       "--free-ports", "--run-dir", str(tmp_path)])
    assert _generating_workers(args, "/m", ()) == []
    workers = engine_grpc.attach_worker(args, "", "", ())
    plan = MeshPlan(workers=workers, **_placement(args))
    argv = next(s.argv for s in specs(plan) if s.name == "attach-0")
    assert argv[1:3] == ["-m", "services.workers.attach"]
    parsed = parser().parse(argv[3:])  # what the plan passes, the registrar takes
    assert flag_error(parsed) is None
    assert parsed.engine_grpc == ("10.0.0.1:50051", "10.0.0.2:50051") and parsed.port == plan.worker_ports[0]
    assert (settings_of(parsed).protocol, parsed.model_dir, parsed.model_name) == ("vllm_engine", "", "")


@pytest.mark.parametrize(("flags", "why"), [
    (["--workers", "2"], "no --workers"),
    (["--prefill-workers", "1", "--decode-workers", "1"], "--prefill-workers"),
    (["--engine-protocol", "tgi"], "invalid choice"),
])
def test_run_refuses_what_cannot_go_with_engines(flags, why, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--engine-grpc", "127.0.0.1:50051", *flags])
    last = capsys.readouterr().err.splitlines()[-1]  # after run's usage, as for its other flags
    assert exit_.value.code == 2 and last.startswith("meshfront run: error: ") and why in last, last


@pytest.mark.parametrize(("argv", "why"), [
    ([], "give --engine-grpc ADDR or --engine-dns NAME:PORT"),
    (["--engine-dns", "engines"], "is not NAME:PORT"),
    (["--engine-grpc", "e:1", "--block-size", "-1"], "--block-size must be positive"),
    (["--engine-grpc", "e:1", "--tool-call-parser", "nope"], "invalid choice"),
])
def test_attach_refuses_bad_flags_in_one_line(argv, why, capsys):
    from services.workers.attach.main import main

    status: object
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and why in err and err.count("\n") == 1 and err.startswith("meshfront attach: "), err


def test_attach_takes_dynamos_parser_spellings():
    args = parser().parse(["--engine-dns", "engines.default.svc:50051", "--dyn-tool-call-parser", "hermes",
                           "--dyn-reasoning-parser", "qwen3"])
    settings = settings_of(args)
    assert (settings.tool_call_parser, settings.reasoning_parser) == ("hermes", "qwen3")
