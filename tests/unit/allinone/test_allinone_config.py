"""The all-in-one process takes every stage's flags and hands each to that stage's own ``build``."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from services.allinone import config as allinone_config
from services.allinone.assembly import build
from services.allinone.clients import InProcessPostprocessor, InProcessPreprocessor, InProcessRouter
from services.common.discovery import WorkerRegistry
from services.common.flags import FlagCollision, FlagParser, add_common_flags
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.policies.kv_aware import KvAware
from services.router.events import KvEventSubscriber

pytestmark = pytest.mark.unit


def built(argv: list[str], env: dict[str, str] | None = None):
    cfg = allinone_config.parse_config(argv, env={} if env is None else env)
    return cfg, build(cfg, WorkerRegistry(cfg.nats_url, "test"), metrics_registry=CollectorRegistry())


def stage_flags(name: str) -> list[str]:
    """The flags a stage's own process offers beyond the common ones."""
    p = FlagParser(name, "", {})
    add_common_flags(p, port=1)
    common = set(p.owners)
    allinone_config.STAGES[name].add_flags(p)
    return [f for f in p.owners if f not in common]


def test_every_stage_flag_is_offered_once_or_fixed_explicitly():
    p = allinone_config.parser({})
    for name in allinone_config.STAGES:
        for flag in stage_flags(name):
            owner = p.owners[flag]
            fixed = allinone_config.FIXED.get(name, {})
            assert owner == name or (flag in fixed and owner.startswith("fixed:")), (name, flag, owner)


def test_stage_flags_reach_each_stage_build():
    cfg, mesh = built(["--port", "0", "--router-mode", "kv", "--kv-overlap-weight", "2.5",
                       "--max-in-flight-per-worker", "4", "--no-router-replica-sync",
                       "--stream-idle-timeout-s", "30", "--migration-limit", "1",
                       "--offload-threshold", "7", "--default-chat-template-kwargs", '{"enable_thinking": false}'])
    assert cfg.router.router_mode == "kv" and cfg.router.kv_overlap_weight == 2.5
    router = mesh.router.service
    assert isinstance(router.policy, KvAware) and router.policy.overlap_weight == 2.5
    assert router.busy.max_in_flight == 4
    assert isinstance(mesh.router.parts["ingest"], KvEventIngest)
    assert isinstance(mesh.router.parts["events"], KvEventSubscriber)
    assert mesh.router.parts["sync"] is None
    post = mesh.postprocessor.service
    assert post._idle is not None and post._idle.idle_s == 30
    assert post.migrator.limit == 1 and post.migrator._router is router  # migrations ask the in-process router
    assert type(mesh.postprocessor.parts["workers"]).__name__ == "MuxWorkerClient"  # the one worker client
    pre = mesh.preprocessor.service
    assert pre._offload_threshold == 7 and pre._default_kwargs == {"enable_thinking": False}
    pipeline = mesh.gateway.service.pipeline
    # Releases ride on the next Route in both shapes (services/gateway/releases.py).
    assert isinstance(pipeline.pre, InProcessPreprocessor) and isinstance(pipeline.router._router, InProcessRouter)
    assert isinstance(pipeline.post, InProcessPostprocessor)


def test_defaults_match_each_stage_process_and_env_twins_are_the_stages_own():
    cfg, mesh = built([], env={"MESHFRONT_ROUTER_ROUTER_MODE": "kv", "MESHFRONT_POSTPROCESSOR_MIGRATION_LIMIT": "0",
                               "MESHFRONT_ALLINONE_PORT": "9999"})
    assert cfg.port == 9999 and cfg.router.router_mode == "kv" and cfg.postprocessor.migration_limit == 0
    assert isinstance(mesh.router.parts["ingest"], KvEventIngest)
    assert mesh.router.parts["sync"] is not None  # replica sync on, as in the router's own process
    assert cfg.drain_grace_s == 10.0 == cfg.postprocessor.drain_grace_s == cfg.preprocessor.drain_grace_s


def test_no_kv_events_is_approximate_mode_as_in_the_router_process():
    _, mesh = built(["--router-mode", "kv", "--no-kv-events"])
    assert mesh.router.parts["ingest"] is None and mesh.router.parts["events"] is None


def test_stage_targets_are_refused_with_the_reason(capsys):
    for flag in ("--router", "--preprocessor", "--postprocessor"):
        with pytest.raises(SystemExit):
            allinone_config.parse_config([flag, "127.0.0.1:1"], env={})
        assert "in-process" in capsys.readouterr().err


def test_an_unresolved_collision_fails_loudly():
    p = FlagParser("allinone", "", {})
    p.stage("router").add("--foo")
    with pytest.raises(FlagCollision, match="--foo of postprocessor collides with --foo of router"):
        p.stage("postprocessor").add("--foo")


def test_invalid_stage_settings_are_errors():
    with pytest.raises(ValueError, match="--migration-limit"):
        allinone_config.parse_config(["--migration-limit", "-1"], env={})
    with pytest.raises(ValueError, match="--default-chat-template-kwargs"):
        allinone_config.parse_config(["--default-chat-template-kwargs", "[1]"], env={})
