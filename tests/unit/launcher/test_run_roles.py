"""`meshfront run --prefill-workers P --decode-workers D`: workers started with those roles, each kind's
flags kept, and shapes that cannot serve refused before anything starts."""

from __future__ import annotations

import pytest

from services.launcher.plan import MeshPlan, specs
from services.launcher.run import _generating_workers, _placement, parse_args

pytestmark = pytest.mark.unit


def modes(workers) -> list[str]:
    return [w.extra[w.extra.index("--disaggregation-mode") + 1] if "--disaggregation-mode" in w.extra else "agg"
            for w in workers]


def test_prefill_and_decode_workers_start_with_their_roles_and_no_aggregated_ones_by_default(tmp_path):
    args = parse_args(["--prefill-workers", "1", "--decode-workers", "3", "--embedding-workers", "0",
                       "--image-workers", "0", "--video-workers", "0", "--free-ports", "--run-dir", str(tmp_path)])
    workers = _generating_workers(args, "/models/demo", ("--speedup-ratio", "10"))
    assert modes(workers) == ["prefill", "decode", "decode", "decode"]
    assert all(w.extra[:2] == ("--speedup-ratio", "10") and w.kind == "mocker" for w in workers)
    plan = MeshPlan(workers=workers, **_placement(args))
    argv = {s.name: s.argv for s in specs(plan)}
    assert argv["mocker-0"][argv["mocker-0"].index("--disaggregation-mode") + 1] == "prefill"
    assert len(plan.worker_ports) == 4


def test_whole_request_workers_can_run_beside_them():
    args = parse_args(["--workers", "1", "--prefill-workers", "2"])
    assert modes(_generating_workers(args, "/m", ())) == ["agg", "prefill", "prefill"]
    assert parse_args([]).workers == 2 and modes(_generating_workers(parse_args([]), "/m", ())) == ["agg", "agg"]


def test_vllm_workers_get_the_mode_with_their_engine_flags():
    args = parse_args(["--worker-kind", "vllm", "--prefill-workers", "1", "--decode-workers", "1",
                       "--engine-args=--enforce-eager"])
    workers = _generating_workers(args, "/m", ("--enforce-eager",))
    assert [w.kind for w in workers] == ["vllm", "vllm"] and modes(workers) == ["prefill", "decode"]
    assert all(w.extra[0] == "--enforce-eager" for w in workers)


@pytest.mark.parametrize(("argv", "says"), [
    (["--prefill-workers", "2"], "--prefill-workers needs a worker that decodes"),
    (["--prefill-workers", "1", "--decode-workers", "1", "--worker-kind", "hf"], "not hf"),
    (["--decode-workers", "-1"], "must be >= 0"),
])
def test_shapes_that_cannot_serve_are_refused(argv, says, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert says in capsys.readouterr().err
