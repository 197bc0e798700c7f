"""A static model: one model's files and block size set by the frontend, not by its workers' cards.

Dynamo's ``--model-name NAME --model-path DIR`` (and ``--kv-cache-block-size``) on ``meshfront frontend``
become the common flags ``--static-model NAME=DIR`` and ``--static-model-block-size N`` of every frontend
stage. Where cards enter a stage (the discovery mirror, services/common/discovery.py), each card of NAME gets
DIR as its model directory and no model-files digest, so the preprocessor and postprocessor read the
tokenizer, chat template and config from DIR instead of the ones the workers published through NATS (they
need not publish any: "served without discovery metadata"); with a block size, the router hashes NAME's
prompts into blocks of that size. Every other card passes untouched.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from services.common.cards import WorkerCard


@dataclasses.dataclass(frozen=True)
class StaticModel:
    name: str
    model_dir: str
    block_size: int = 0  # 0: the workers' cards' own

    def apply(self, card: WorkerCard) -> WorkerCard:
        """``card`` with this model's directory (and block size) when it serves this model."""
        if card.model.name != self.name:
            return card
        model = dataclasses.replace(card.model, model_dir=self.model_dir, model_files="",
                                    block_size=self.block_size or card.model.block_size)
        return dataclasses.replace(card, model=model)


def flag_value(value: str) -> str:
    """``--static-model``'s value checked: ``NAME=DIR`` with DIR a directory (made absolute); empty is none."""
    if not value:
        return ""
    name, sep, model_dir = value.partition("=")
    if not sep or not name.strip() or not model_dir:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=DIR")
    if not os.path.isdir(model_dir):
        raise argparse.ArgumentTypeError(f"{value!r}: {model_dir} is not a directory")
    return f"{name.strip()}={os.path.abspath(model_dir)}"


def block_size(value: str) -> int:
    size = int(value)
    if size < 0:
        raise argparse.ArgumentTypeError(f"{size} must be >= 0")
    return size


def parse(value: str, block: int = 0) -> StaticModel | None:
    """The StaticModel of checked flag values (``flag_value``); None when there is none. Raises ValueError for a
    block size without a model."""
    if not value:
        if block:
            raise ValueError("--static-model-block-size needs --static-model NAME=DIR")
        return None
    name, _, model_dir = value.partition("=")
    return StaticModel(name, model_dir, block)
