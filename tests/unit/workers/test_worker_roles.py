"""A worker's part in disaggregated serving: ``--disaggregation-mode`` (and its env twin) registers a role
on the card; cards from before roles read as ``both``; kinds that cannot run a leg have no such flag."""

from __future__ import annotations

import orjson
import pytest

from services.common.discovery import (
    BOTH,
    DECODE,
    KV_RELEASE_BY_DECODE,
    KV_RELEASE_BY_PREFILL,
    PREFILL,
    ModelCard,
    WorkerCard,
)
from services.workers.mocker.config import parse_config as parse_mocker
from services.workers.server import worker_card
from services.workers.vllm.config import parse_config as parse_vllm

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("mode", "role"), [("prefill", PREFILL), ("decode", DECODE), ("agg", BOTH)])
def test_mocker_mode_is_the_cards_role(demo_model_dir, mode, role):
    cfg = parse_mocker(["--model-dir", str(demo_model_dir), "--disaggregation-mode", mode], env={})
    card = worker_card(cfg.worker, "h:1")
    assert card.role == role
    assert WorkerCard.from_json(card.to_json()).role == role


def test_mode_defaults_to_agg_and_has_an_env_twin(demo_model_dir):
    assert worker_card(parse_mocker(["--model-dir", str(demo_model_dir)], env={}).worker, "h:1").role == BOTH
    cfg = parse_mocker(["--model-dir", str(demo_model_dir)], env={"MESHFRONT_MOCKER_DISAGGREGATION_MODE": "decode"})
    assert cfg.worker.role == DECODE


def test_a_bad_mode_fails_the_start(demo_model_dir, capsys):
    with pytest.raises(SystemExit) as e:
        parse_mocker(["--model-dir", str(demo_model_dir), "--disaggregation-mode", "both"], env={})
    assert e.value.code == 2 and "--disaggregation-mode" in capsys.readouterr().err


def test_vllm_takes_the_mode_and_does_not_pass_it_to_the_engine(demo_model_dir):
    cfg = parse_vllm(["--model-dir", str(demo_model_dir), "--disaggregation-mode", "prefill",
                      "--enforce-eager"], env={})
    assert cfg.worker(context_length=64, block_size=16).role == PREFILL
    assert cfg.engine_argv == ("--enforce-eager",)


def test_a_card_from_before_roles_reads_as_both_and_an_unknown_role_is_refused():
    card = WorkerCard("w", "h:1", ModelCard("m", "/m"))
    old = orjson.loads(card.to_json())
    del old["role"]
    assert WorkerCard.from_json(orjson.dumps(old)).role == BOTH
    with pytest.raises(ValueError, match="role"):
        WorkerCard.from_json(orjson.dumps({**old, "role": "encode"}))


def test_who_releases_a_prefill_hold_is_on_the_card_the_prefill_worker_by_default(demo_model_dir):
    """The mocker's prefill worker frees its own holds; vLLM's are freed through the decode worker, which the
    vLLM worker's card says once, at registration (services/workers/vllm/main.py)."""
    cfg = parse_mocker(["--model-dir", str(demo_model_dir), "--disaggregation-mode", "prefill"], env={})
    assert worker_card(cfg.worker, "h:1").kv_release_by == KV_RELEASE_BY_PREFILL
    card = worker_card(cfg.worker, "h:1", kv_release_by=KV_RELEASE_BY_DECODE)
    assert WorkerCard.from_json(card.to_json()).kv_release_by == KV_RELEASE_BY_DECODE
    old = orjson.loads(card.to_json())
    del old["kv_release_by"]  # a card from before the field
    assert WorkerCard.from_json(orjson.dumps(old)).kv_release_by == KV_RELEASE_BY_PREFILL
    with pytest.raises(ValueError, match="kv_release_by"):
        WorkerCard.from_json(orjson.dumps({**old, "kv_release_by": "router"}))
