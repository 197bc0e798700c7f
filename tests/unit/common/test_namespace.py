"""Namespace names, the NATS names derived from them, and Dynamo's discovery filter (services/common/namespace.py)."""

from __future__ import annotations

import pytest

from services.common.discovery import WorkerCard
from services.common.flags import FlagParser, add_common_flags
from services.common.kv_events import dump_subject, events_subject
from services.common.model_files import ModelFilesUnavailable, reference, split_reference
from services.common.namespace import (
    DEFAULT_NAMESPACE,
    DiscoveryFilter,
    Namespace,
    split_worker_key,
)
from services.router.config import parse_config as router_config
from services.workers.mocker.config import parse_config as mocker_config


@pytest.mark.parametrize("name", ["dynamo", "a", "team-a_1", "X" * 64])
def test_a_name_of_letters_digits_dash_and_underscore_is_a_namespace(name):
    assert Namespace(name).name == name


@pytest.mark.parametrize("name", ["", "a.b", "a*", "a>", "a b", "ns/1", "é", "X" * 65])
def test_anything_else_is_one_clear_line(name):
    with pytest.raises(ValueError, match=r"^--namespace .* is not a namespace: 1 to 64 characters") as e:
        Namespace(name)
    assert "\n" not in str(e.value)


def test_every_nats_name_carries_the_namespace():
    ns = Namespace("alpha")
    assert ns.bucket("meshfront_responses") == "meshfront_responses_alpha"
    assert ns.subject("meshfront.router.lifecycle") == "meshfront.router.lifecycle.alpha"
    assert ns.worker_key("mocker-1a2b") == "alpha.mocker-1a2b"
    assert events_subject(ns, "org/model.v1", "w.1") == "meshfront.kv.events.alpha.org_model_v1.w_1"
    assert dump_subject(ns, "w1") == "meshfront.kv.dump.alpha.w1"
    assert Namespace.of("") == DEFAULT_NAMESPACE == Namespace("dynamo")


def test_a_registration_key_names_its_namespace_and_a_legacy_key_is_the_defaults():
    assert split_worker_key("alpha.mocker-1") == ("alpha", "mocker-1")
    assert split_worker_key("alpha.w.with.dots") == ("alpha", "w.with.dots")  # namespaces have no dots
    assert split_worker_key("mocker-1") == ("dynamo", "mocker-1")


def test_model_file_references_name_the_namespace_whose_store_holds_them():
    digest = "ab" * 32
    assert reference(Namespace("alpha"), digest) == f"alpha/{digest}"
    assert reference(Namespace("alpha"), "") == ""  # no files published
    assert split_reference(f"alpha/{digest}") == (Namespace("alpha"), digest)
    assert split_reference(digest) == (DEFAULT_NAMESPACE, digest)  # a card from before namespaces
    with pytest.raises(ModelFilesUnavailable, match="is not a namespace"):
        split_reference(f"a.b/{digest}")


@pytest.mark.parametrize(("namespace", "prefix", "seen", "unseen", "keys"), [
    # Empty or the literal "dynamo": no filtering (Dynamo's rule).
    ("dynamo", "", ["dynamo", "alpha", "alpha-2"], [], ">"),
    ("", "", ["dynamo", "alpha"], [], ">"),
    # Exact: that namespace alone, watched narrowly.
    ("alpha", "", ["alpha"], ["alpha-2", "dynamo", "alph"], "alpha.>"),
    # The prefix wins over --namespace (even an exact one) and matches the name's start.
    ("alpha", "team", ["team", "team-a", "teamb"], ["alpha", "dynamo", "my-team"], ">"),
    ("dynamo", "team-", ["team-a"], ["team", "dynamo"], ">"),
])
def test_the_discovery_filter_is_dynamos(namespace, prefix, seen, unseen, keys):
    f = DiscoveryFilter(namespace, prefix)
    assert [ns for ns in seen if f.admits(ns)] == seen
    assert [ns for ns in unseen if f.admits(ns)] == []
    assert f.keys == keys
    assert f.subjects("meshfront.kv.events") == f"meshfront.kv.events.{keys}"


def test_a_card_carries_its_namespace_and_an_old_card_reads_as_the_defaults():
    from services.common.discovery import ModelCard

    card = WorkerCard("w1", "127.0.0.1:1", ModelCard("m", "/m"), namespace="alpha")
    assert WorkerCard.from_json(card.to_json()).namespace == "alpha"
    legacy = card.to_json().replace(b',"namespace":"alpha"', b"")
    assert b"namespace" not in legacy and WorkerCard.from_json(legacy).namespace == "dynamo"


def _flags(env=None) -> FlagParser:
    p = FlagParser("router", "test", env or {})
    add_common_flags(p, port=1)
    return p


def test_the_flags_default_to_dynamos_namespace_and_take_its_env_names():
    args = _flags().parse([])
    assert (args.namespace, args.namespace_prefix) == ("dynamo", "")
    args = _flags({"DYN_NAMESPACE": "alpha", "DYN_NAMESPACE_PREFIX": "team"}).parse([])
    assert (args.namespace, args.namespace_prefix) == ("alpha", "team")
    # Meshfront's own twin wins over Dynamo's, and the flag over both.
    assert _flags({"DYN_NAMESPACE": "alpha", "MESHFRONT_NAMESPACE": "beta"}).parse([]).namespace == "beta"
    assert _flags({"MESHFRONT_NAMESPACE": "beta"}).parse(["--namespace", "gamma"]).namespace == "gamma"
    assert _flags().parse(["--namespace", ""]).namespace == ""  # Dynamo's "unset": no filter


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["--namespace", "a.b"], {}, "--namespace 'a.b' is not a namespace"),
    (["--namespace-prefix", "team>"], {}, "--namespace-prefix 'team>' is not a namespace"),
    ([], {"DYN_NAMESPACE": "a b"}, "DYN_NAMESPACE='a b' (the env twin of --namespace): invalid namespace_name value"),
])
def test_a_bad_name_is_exit_status_2_with_one_line(argv, env, says, capsys):
    with pytest.raises(SystemExit) as e:
        router_config(argv, env)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_a_stage_config_carries_both_and_a_worker_only_its_namespace(tmp_path, demo_model_dir):
    cfg = router_config(["--namespace", "alpha", "--namespace-prefix", "team"], {})
    assert (cfg.namespace, cfg.namespace_prefix) == ("alpha", "team")
    worker = mocker_config(["--model-dir", str(demo_model_dir), "--namespace", "alpha"], {}).worker
    assert worker.scope == Namespace("alpha")
    with pytest.raises(SystemExit):  # a worker registers in one namespace; a prefix means nothing to it
        mocker_config(["--model-dir", str(demo_model_dir), "--namespace-prefix", "team"], {})
