"""The router refuses settings it cannot honour, by flag and by env twin, before it starts."""

from __future__ import annotations

import pytest

from services.router import config as router_config
from services.router.main import main

pytestmark = pytest.mark.unit

BAD = [("--max-in-flight-per-worker", "-3"), ("--queue-timeout-s", "-5"), ("--router-temperature", "-1"),
       ("--kv-overlap-weight", "-1"), ("--hotspot-ratio", "0.5"), ("--router-ttl-secs", "0"),
       ("--drain-grace-s", "-1")]


def env_twin(flag: str) -> str:
    return "MESHFRONT_ROUTER_" + flag.lstrip("-").replace("-", "_").upper()


@pytest.mark.parametrize(("flag", "value"), BAD)
def test_a_bad_value_is_refused_by_flag_and_by_env_twin(flag, value):
    with pytest.raises(ValueError, match=flag):
        router_config.parse_config([flag, value], {})
    with pytest.raises(ValueError, match=flag):
        router_config.parse_config([], {env_twin(flag): value})


@pytest.mark.parametrize("mode", ["round-robin", "kv"])
def test_a_value_only_kv_reads_is_refused_under_every_mode(mode):
    with pytest.raises(ValueError, match="--router-temperature"):
        router_config.parse_config(["--router-mode", mode, "--router-temperature", "-1"], {})


@pytest.mark.parametrize(("flag", "value"), BAD[:3])
def test_the_router_process_exits_2_with_one_line(flag, value, capsys, monkeypatch):
    for name in [env_twin(f) for f, _ in BAD]:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_:
        main([flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"meshfront router: {flag} {value}"), err


def test_every_error_is_listed_at_once():
    with pytest.raises(ValueError) as e:
        router_config.parse_config(["--max-in-flight-per-worker", "-3", "--queue-timeout-s", "-5"], {})
    assert "--max-in-flight-per-worker" in str(e.value) and "--queue-timeout-s" in str(e.value)


def test_good_values_pass():
    cfg = router_config.parse_config(["--max-in-flight-per-worker", "4", "--queue-timeout-s", "2",
                                      "--router-temperature", "0.5"], {})
    assert (cfg.max_in_flight_per_worker, cfg.queue_timeout_s, cfg.router_temperature) == (4, 2.0, 0.5)
