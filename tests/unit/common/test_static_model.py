"""A static model rewrites its own cards (directory, no published files, block size) and no other card."""

from __future__ import annotations

import argparse

import pytest

from services.common import static_model
from services.common.cards import ModelCard, WorkerCard


def _card(name: str) -> WorkerCard:
    return WorkerCard(worker_id="w-1", address="127.0.0.1:1",
                      model=ModelCard(name=name, model_dir="/workers/dir", block_size=16, model_files="dynamo/abc"))


def test_the_static_models_cards_read_its_directory_and_block_size(tmp_path):
    model = static_model.parse(static_model.flag_value(f"m={tmp_path}"), 32)
    assert model is not None
    card = model.apply(_card("m")).model
    assert (card.model_dir, card.model_files, card.block_size) == (str(tmp_path), "", 32)
    assert static_model.parse(f"m={tmp_path}", 0).apply(_card("m")).model.block_size == 16  # the card's own
    assert model.apply(_card("other")) == _card("other")


def test_bad_values_are_one_line_errors(tmp_path):
    for bad in ("m", "=x", f"m={tmp_path / 'missing'}"):
        with pytest.raises(argparse.ArgumentTypeError):
            static_model.flag_value(bad)
    with pytest.raises(ValueError, match="needs --static-model"):
        static_model.parse("", 32)
    assert static_model.parse("", 0) is None
