"""``meshfront frontend``'s configuration: Dynamo's defaults, env twins, sources, and what each process is given."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.allinone.config import parse_config
from services.frontend.config import ConfigError, describe, parse
from services.frontend.main import plan_for
from tests.conftest import ROOT


def test_dynamo_defaults_apply_under_the_frontend():
    cfg = parse([], env={})
    assert (cfg.http_host, cfg.http_port, cfg.migration_limit, cfg.metrics_prefix) == ("0.0.0.0", 8000, 0,
                                                                                         "dynamo_frontend")
    assert cfg.enable_anthropic_api is False and cfg.kserve_grpc_server is False and cfg.router_replica_sync is False


def test_a_value_remembers_where_it_came_from_and_the_flag_wins_over_env():
    cfg = parse(["--router-mode", "random", "--kv-events"],
                env={"DYN_HTTP_PORT": "8123", "DYN_ROUTER_MODE": "kv", "NATS_SERVER": "nats://10.0.0.1:4222"})
    assert cfg.settings["http_port"].value == 8123 and cfg.settings["http_port"].source == "env DYN_HTTP_PORT"
    assert cfg.settings["router_mode"].value == "random" and cfg.settings["router_mode"].source == "flag"
    assert cfg.settings["router_kv_events"].source == "flag"  # a deprecated alias is the flag too
    assert cfg.nats_url == "nats://10.0.0.1:4222" and cfg.settings["nats_url"].source == "env NATS_SERVER"
    assert cfg.settings["migration_limit"].source == "default"
    text = describe(cfg)
    assert "http_port" in text and "(env DYN_HTTP_PORT)" in text and "router_mode" in text


def test_the_all_in_one_process_is_given_exactly_the_resolved_stage_settings():
    cfg = parse(["--router-mode", "kv", "--migration-limit", "2", "--no-exclude-tools-when-tool-choice-none",
                 "--namespace", "team-a", "--router-temperature", "0.5"], env={"DYN_METRICS_PREFIX": "acme"})
    inner = parse_config(cfg.stage_argv("allinone"), env={})
    assert inner.router.router_mode == "kv" and inner.router.router_temperature == 0.5
    assert inner.postprocessor.migration_limit == 2
    assert inner.gateway.metrics_prefix == "acme"
    assert inner.preprocessor.hide_tools_for_tool_choice_none is False
    assert "--namespace=team-a" in cfg.stage_argv("allinone")
    assert all("--http-port" not in a for a in cfg.stage_argv("allinone"))  # the edge's flags stay here


def test_split_and_preprocess_workers_shape_the_plan(tmp_path):
    plan = plan_for(parse(["--dyn-preprocess-workers", "2", "--nats-url", "nats://127.0.0.1:4999"], env={}),
                    tmp_path)
    assert not plan.inproc and plan.preprocessors == 2 and plan.external_nats_url == "nats://127.0.0.1:4999"
    assert not parse([], env={}).split and plan_for(parse([], env={}), tmp_path).inproc


@pytest.mark.parametrize(("argv", "message"), [
    (["--tls-cert-path", "/etc/hostname"], "--tls-cert-path and --tls-key-path must be provided together"),
    (["--interactive", "--kserve-grpc-server"], "different modes"),
    (["--migration-limit", "-1"], "postprocessor"),
    (["--http-host", "no-such-host.invalid"], "--http-host 'no-such-host.invalid'"),
])
def test_a_bad_combination_is_one_line(argv, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse(argv, env={})


def _frontend(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from services.cli import main; main()", "frontend", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_check_config_prints_each_setting_and_its_source_and_exits_0():
    done = _frontend("--check-config", "--router-mode", "kv", env={"DYN_HTTP_PORT": "8111"})
    assert done.returncode == 0, done.stderr
    assert "http_port" in done.stdout and "8111  (env DYN_HTTP_PORT)" in done.stdout
    assert "'kv'  (flag)" in done.stdout


def test_a_bad_flag_exits_2_with_one_line_and_version_prints_the_version():
    done = _frontend("--request-plane", "nats")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--request-plane nats" in done.stderr
    done = _frontend("--http-port", "x")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    done = _frontend("--version")
    assert done.returncode == 0 and "meshfront frontend" in done.stdout and "Dynamo 1.6.1" in done.stdout


def test_dump_config_is_the_resolved_settings_as_json(tmp_path):
    from services.frontend.config import as_json

    data = json.loads(json.dumps(as_json(parse(["--http-port", "8001"], env={})), default=str))
    assert data["settings"]["http_port"] == {"value": 8001, "source": "flag", "flag": "--http-port",
                                             "owner": "frontend"}


def test_a_static_model_becomes_every_stages_static_model_flags(tmp_path):
    cfg = parse(["--model-name", " m ", "--model-path", str(tmp_path), "--kv-cache-block-size", "32"], env={})
    assert cfg.model_name == "m"  # stripped, as Dynamo's validate_model_name does
    for stage in ("allinone", "gateway", "preprocessor", "postprocessor", "router"):
        argv = cfg.stage_argv(stage)
        assert f"--static-model=m={tmp_path}" in argv and "--static-model-block-size=32" in argv
    inner = parse_config(cfg.stage_argv("allinone"), env={})
    assert inner.static_model == f"m={tmp_path}" and inner.static_model_block_size == 32
    with pytest.raises(ConfigError, match="--model-path needs --model-name"):
        parse(["--model-path", str(tmp_path)], env={})
    with pytest.raises(SystemExit):  # argparse: not a directory (Dynamo's validate_model_path)
        parse(["--model-name", "m", "--model-path", str(tmp_path / "missing")], env={})
