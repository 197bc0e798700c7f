"""A repeatable flag (``add(..., repeatable=True)``): one item per use, its env twin whitespace-separated, the
flag replacing the env's items rather than adding to them, and each item checked like a one-off flag's value."""

from __future__ import annotations

import pytest

from services.common.flags import FlagParser

pytestmark = pytest.mark.unit


def parser(env: dict[str, str]) -> FlagParser:
    p = FlagParser("gateway", "test", env)
    p.add("--extension", repeatable=True, dynamo_env="DYN_EXTENSIONS", help="an extension")
    p.add("--weight", repeatable=True, type=int, choices=(1, 2, 3), help="a weight")
    return p


def test_each_use_adds_an_item_and_none_is_an_empty_tuple():
    args = parser({}).parse(["--extension", "a:f", "--extension=b", "--weight", "2"])
    assert args.extension == ("a:f", "b")
    assert args.weight == (2,)
    assert parser({}).parse([]).extension == ()


def test_the_env_twin_splits_on_whitespace_and_the_dynamo_twin_is_read_when_ours_is_unset():
    p = parser({"DYN_EXTENSIONS": " one  two\tthree\n"})
    assert p.parse([]).extension == ("one", "two", "three")
    assert p.sources["extension"] == "env DYN_EXTENSIONS"
    ours = parser({"MESHFRONT_GATEWAY_EXTENSION": "mine", "DYN_EXTENSIONS": "theirs"})
    assert ours.parse([]).extension == ("mine",)


def test_the_flag_replaces_the_env_items_instead_of_adding_to_them():
    args = parser({"DYN_EXTENSIONS": "from-env other"}).parse(["--extension", "x", "--extension", "y"])
    assert args.extension == ("x", "y")


def test_each_env_item_is_checked_like_the_flag_and_a_bad_one_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        parser({"MESHFRONT_GATEWAY_WEIGHT": "1 7"}).parse([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MESHFRONT_GATEWAY_WEIGHT='7'" in err and "invalid choice" in err, err
    # the flag wins: given, the env twin's bad item is never used
    assert parser({"MESHFRONT_GATEWAY_WEIGHT": "x"}).parse(["--weight", "3"]).weight == (3,)
    with pytest.raises(SystemExit):
        parser({}).parse(["--weight", "nine"])
