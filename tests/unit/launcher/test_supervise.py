"""The launcher's restart decisions, without processes: backoff, give-up, exit descriptions, stop order."""

from __future__ import annotations

import io
import re
import signal

import pytest

from services.launcher.plan import MeshPlan, WorkerSpec
from services.launcher.run import STOP_ORDER, _placement, parse_args
from services.launcher.supervise import Printer, RestartPolicy, backoff_delay, describe_exit, judge_exit, stop_groups

pytestmark = pytest.mark.unit

POLICY = RestartPolicy(backoff_initial_s=1.0, backoff_factor=2.0, backoff_max_s=30.0, crash_window_s=10.0,
                       max_fast_failures=5)


def run_exits(policy: RestartPolicy, uptimes: list[float]) -> list:
    """Feeds exits one after the other as the supervisor does, carrying the fast-failure count."""
    streak, verdicts = 0, []
    for uptime in uptimes:
        v = judge_exit(policy, streak, uptime)
        streak = v.fast_failures
        verdicts.append(v)
    return verdicts


def test_a_process_that_ran_a_while_comes_back_at_once():
    v = judge_exit(POLICY, 0, 3600.0)
    assert not v.give_up and not v.fast and v.fast_failures == 0 and v.delay_s == 0.0


def test_fast_failures_double_the_backoff_after_the_first_and_the_fifth_in_a_row_gives_up():
    verdicts = run_exits(POLICY, [0.2] * 5)
    assert [v.delay_s for v in verdicts[:4]] == [0.0, 1.0, 2.0, 4.0]
    assert [v.fast_failures for v in verdicts] == [1, 2, 3, 4, 5]
    assert [v.give_up for v in verdicts] == [False, False, False, False, True]


def test_a_run_that_lasts_the_window_resets_the_count():
    verdicts = run_exits(POLICY, [1, 1, 1, 1, 10.0, 1, 1, 1, 1])
    assert not any(v.give_up for v in verdicts)
    assert verdicts[4].fast_failures == 0 and verdicts[4].delay_s == 0.0
    assert [v.delay_s for v in verdicts[5:]] == [0.0, 1.0, 2.0, 4.0]
    assert run_exits(POLICY, [1, 1, 1, 1, 10.0, 1, 1, 1, 1, 1])[-1].give_up


def test_the_window_boundary_is_not_fast():
    assert not judge_exit(POLICY, 4, 10.0).give_up
    assert judge_exit(POLICY, 4, 9.999).give_up


def test_backoff_is_capped():
    policy = RestartPolicy(max_fast_failures=100)
    assert backoff_delay(policy, 50) == policy.backoff_max_s
    assert backoff_delay(policy, 0) == backoff_delay(policy, 1) == 0.0 and backoff_delay(policy, 2) == 1.0
    assert [v.delay_s for v in run_exits(policy, [0.1] * 12)][-1] == 30.0


def test_a_limit_of_one_gives_up_on_the_first_fast_failure_only():
    policy = RestartPolicy(max_fast_failures=1)
    assert judge_exit(policy, 0, 0.1).give_up
    assert not judge_exit(policy, 0, 60).give_up


@pytest.mark.parametrize("kw", [{"max_fast_failures": 0}, {"backoff_initial_s": -1}, {"backoff_factor": 0.5},
                                {"backoff_max_s": 0.1, "backoff_initial_s": 1}, {"crash_window_s": 0}])
def test_nonsense_policies_are_refused(kw):
    with pytest.raises(ValueError):
        RestartPolicy(**kw)


def test_exit_descriptions_name_the_code_or_the_signal():
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGKILL) == "signal 9 (SIGKILL)"
    assert describe_exit(-signal.SIGSEGV) == "signal 11 (SIGSEGV)"
    assert describe_exit(-200) == "signal 200 (unknown)"


def test_stop_order_edge_first_nats_last_workers_before_it():
    plan = MeshPlan(workers=[WorkerSpec("d", "m")] * 2, worker_ports=[1, 2], gateway_ports=[3, 4], routers=2)
    names = ["nats", *plan.service_names(), "envoy"]
    assert stop_groups(names, STOP_ORDER) == [["gateway-0", "gateway-1", "envoy"],
                                              ["preprocessor", "router", "router-1", "postprocessor"],
                                              ["mocker-0", "mocker-1"], ["nats"]]
    assert stop_groups(["a", "b", "nats"], [["nats"]]) == [["nats"], ["a", "b"]]  # unlisted names go last
    assert stop_groups(["a"], []) == [["a"]]


def test_printer_prefixes_time_and_padded_name_and_colours_only_a_terminal():
    out = io.StringIO()
    p = Printer(["nats", "postprocessor"], out)
    p.line("nats", "ready")
    p.system("nats started (pid=1)")
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"\d\d:\d\d:\d\d nats {10}\| ready", lines[0])
    assert re.fullmatch(r"\d\d:\d\d:\d\d system {8}\| nats started \(pid=1\)", lines[1])
    coloured = io.StringIO()
    Printer(["nats"], coloured, colour=True).line("nats", "x")
    assert coloured.getvalue().startswith("\033[0m\033[36m") and coloured.getvalue().endswith("| \033[0mx\n")


def test_run_flags_for_supervision_and_isolation(tmp_path):
    args = parse_args([])
    assert args.crash_window_s == 10.0 and args.crash_limit == 5 and not args.free_ports and args.run_dir == ""
    placement = _placement(args)
    # Two mocker workers, the embedding worker, the image and the video simulators (one each by default).
    assert placement == {"gateway_ports": [9100], "worker_ports": [9500, 9501, 9502, 9503, 9504]}
    args = parse_args(["--run-dir", str(tmp_path), "--gateways", "2", "--crash-limit", "3", "--embedding-workers", "0",
                       "--image-workers", "0", "--video-workers", "0"])
    assert _placement(args) == {"gateway_ports": [9100, 9101], "worker_ports": [9500, 9501], "run_dir": tmp_path}
    assert args.crash_limit == 3 and parse_args(["--free-ports"]).free_ports  # free ports: the mesh test's
    with pytest.raises(SystemExit):
        parse_args(["--crash-limit", "0"])
