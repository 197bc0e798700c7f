"""An env twin goes through the same checks as its flag: Kubernetes configures every service through env."""

from __future__ import annotations

import pytest

from services.allinone import config as allinone_config
from services.common.flags import FlagParser, add_common_flags
from services.router import config as router_config
from services.workers.mocker import config as mocker_config

pytestmark = pytest.mark.unit


def one_line_exit_2(parse, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flag", ["--tool-call-parser", "--reasoning-parser"])
def test_an_unknown_parser_name_in_the_env_twin_fails_the_worker_as_the_flag_does(flag, demo_model_dir, capsys):
    env_name = "MESHFRONT_MOCKER_" + flag.lstrip("-").replace("-", "_").upper()
    model = ["--model-dir", str(demo_model_dir)]
    err = one_line_exit_2(lambda: mocker_config.parse_config(model, {env_name: "hermes3"}), capsys)
    assert f"{env_name}='hermes3'" in err and flag in err and "invalid choice" in err
    err = one_line_exit_2(lambda: mocker_config.parse_config(["--model-dir", str(demo_model_dir), flag, "hermes3"], {}),
                          capsys)
    assert "hermes3" in err


@pytest.mark.parametrize("kind", ["hf", "vllm", "sglang"])
@pytest.mark.parametrize("flag", ["--tool-call-parser", "--reasoning-parser"])
def test_every_engine_worker_checks_its_parser_env_twins_against_the_registry(kind, flag, demo_model_dir, capsys):
    """The engine workers parse their flags apart from the mocker (engine flags pass through): the same check."""
    import importlib

    config = importlib.import_module(f"services.workers.{kind}.config")
    env_name = f"MESHFRONT_{kind.upper()}_" + flag.lstrip("-").replace("-", "_").upper()
    err = one_line_exit_2(lambda: config.parse_config(["--model-dir", str(demo_model_dir)], {env_name: "hermes3"}),
                          capsys)
    assert f"{env_name}='hermes3'" in err and "invalid choice" in err
    name = "qwen3_coder" if flag == "--tool-call-parser" else "nemotron"
    cfg = config.parse_config(["--model-dir", str(demo_model_dir)], {env_name: name})
    field = flag.lstrip("-").replace("-", "_")
    assert getattr(cfg.args if kind != "hf" else cfg.worker, field) == name


def test_a_known_parser_name_in_the_env_twin_reaches_the_card(demo_model_dir):
    cfg = mocker_config.parse_config(["--model-dir", str(demo_model_dir)],
                                     {"MESHFRONT_MOCKER_TOOL_CALL_PARSER": "hermes"})
    assert cfg.worker.tool_call_parser == "hermes"


def test_the_flag_wins_over_a_bad_env_twin(demo_model_dir):
    cfg = mocker_config.parse_config(["--model-dir", str(demo_model_dir), "--tool-call-parser", "qwen3"],
                                     {"MESHFRONT_MOCKER_TOOL_CALL_PARSER": "hermes3"})
    assert cfg.worker.tool_call_parser == "qwen3"


def test_a_bad_choice_in_a_stage_env_twin_fails_the_all_in_one_process(capsys):
    err = one_line_exit_2(lambda: allinone_config.parse_config([], {"MESHFRONT_ROUTER_ROUTER_MODE": "kvv"}), capsys)
    assert "MESHFRONT_ROUTER_ROUTER_MODE='kvv'" in err


@pytest.mark.parametrize(("env", "value"), [("MESHFRONT_ROUTER_PORT", "nine"),
                                            ("MESHFRONT_ROUTER_QUEUE_TIMEOUT_S", "soon"),
                                            ("MESHFRONT_ROUTER_KV_EVENTS", "ture")])
def test_an_env_twin_that_is_not_of_the_flags_type_is_one_line_and_exit_2(env, value, capsys):
    err = one_line_exit_2(lambda: router_config.parse_config([], {env: value}), capsys)
    assert f"{env}={value!r}" in err


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("true", True), ("On", True), ("0", False),
                                            ("false", False), ("no", False)])
def test_boolean_env_twins(raw, value):
    assert router_config.parse_config([], {"MESHFRONT_ROUTER_KV_EVENTS": raw}).router_kv_events is value


def test_an_argparse_error_is_one_line_naming_the_command(capsys):
    p = FlagParser("router", "", {})
    add_common_flags(p, port=1)
    err = one_line_exit_2(lambda: p.parse(["--port", "x"]), capsys)
    assert err.startswith("meshfront router: argument --port: invalid int value: 'x'")
