"""A worker's LoRA adapters (services/workers/lora.py), the flags that give them (mocker, vLLM), and the
adapter salt in the hashes a worker publishes (mocker cache, vLLM event translation)."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.common.discovery import LoraAdapter, ModelCard, WorkerCard
from services.common.errors import InvalidRequest, NotFound
from services.common.hashing import block_hashes, sequence_hashes
from services.workers.config import ConfigError
from services.workers.engine_kv import BlockHashTranslator, BlocksStored
from services.workers.lora import LoraSettings, WorkerAdapters, parse_lora_modules
from services.workers.mocker.config import parse_config as parse_mocker
from services.workers.mocker.lora import SimulatedLora
from services.workers.mocker.sequence import full_blocks
from services.workers.vllm.config import parse_config as parse_vllm

pytestmark = pytest.mark.unit


@pytest.fixture
def adapter_dir(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return str(tmp_path)


class Published:
    def __init__(self):
        self.cards: list[tuple[LoraAdapter, ...]] = []

    async def __call__(self, adapters):
        self.cards.append(adapters)


def test_load_resolve_unload_publish_the_card_and_give_fresh_ids(adapter_dir):
    async def main():
        published = Published()
        adapters = WorkerAdapters(LoraSettings(2, True, (LoraAdapter("a", adapter_dir),)), SimulatedLora(), published)
        await adapters.start()
        assert [a.name for a in adapters.adapters] == ["a"] and published.cards == []  # the first card lists it
        assert await adapters.load(LoraAdapter("b", adapter_dir)) is True
        assert await adapters.load(LoraAdapter("b", adapter_dir)) is False
        assert [a.name for a in published.cards[-1]] == ["a", "b"]
        first = (await adapters.resolve(LoraAdapter("b", ""))).lora_id
        await adapters.unload("b")
        assert [a.name for a in published.cards[-1]] == ["a"]
        with pytest.raises(NotFound):
            await adapters.unload("b")
        # A request naming an adapter held elsewhere loads it here (runtime loading), under a new id.
        again = await adapters.resolve(LoraAdapter("b", adapter_dir))
        assert again.lora_id != first and [a.name for a in published.cards[-1]] == ["a", "b"]
    asyncio.run(main())


def test_without_runtime_loading_or_lora_an_unknown_adapter_is_refused(adapter_dir, tmp_path_factory):
    async def main():
        fixed = WorkerAdapters(LoraSettings(1, False), SimulatedLora())
        with pytest.raises(NotFound, match="not loaded on this worker"):
            await fixed.resolve(LoraAdapter("x", adapter_dir))
        with pytest.raises(InvalidRequest, match="at runtime"):
            await fixed.load(LoraAdapter("x", adapter_dir))
        off = WorkerAdapters(LoraSettings(), None)
        with pytest.raises(NotFound, match="serves no LoRA"):
            await off.resolve(LoraAdapter("x", adapter_dir))
        loader = WorkerAdapters(LoraSettings(1, True), SimulatedLora())
        with pytest.raises(InvalidRequest, match="adapter_config.json"):
            await loader.load(LoraAdapter("x", str(tmp_path_factory.mktemp("empty"))))
        assert loader.adapters == ()
    asyncio.run(main())


def test_lora_modules_flags(adapter_dir, demo_model_dir):
    adapters, errors = parse_lora_modules(["a=x", "b", "a=y"])
    assert [a.name for a in adapters] == ["a"] and len(errors) == 2
    cfg = parse_mocker(["--model-dir", str(demo_model_dir), "--enable-lora", "--max-loras", "3",
                        "--lora-modules", f"a={adapter_dir},b={adapter_dir}"])
    assert cfg.lora.max_loras == 3 and [a.name for a in cfg.lora.modules] == ["a", "b"]
    with pytest.raises(ConfigError, match="need --enable-lora"):
        parse_mocker(["--model-dir", str(demo_model_dir), "--lora-modules", f"a={adapter_dir}"])
    # vLLM's forms: several items after one flag, JSON objects, the flag repeated; the rest goes to vLLM.
    vllm = parse_vllm(["--model-dir", str(demo_model_dir), "--enable-lora", "--lora-modules", f"a={adapter_dir}",
                       json.dumps({"name": "b", "path": adapter_dir}), "--max-loras", "2",
                       f"--lora-modules=c={adapter_dir}"])
    assert [a.name for a in vllm.lora_modules] == ["a", "b", "c"]
    assert vllm.engine_argv == ("--enable-lora", "--max-loras", "2")


def test_cards_carry_adapters_across_json():
    card = WorkerCard("w", "h:1", ModelCard("m", "/m", lora_adapters=(LoraAdapter("a", "/a"),)), max_loras=2,
                      lora_runtime_loading=True)
    assert WorkerCard.from_json(card.to_json()) == card


def test_adapter_blocks_are_salted_in_the_mocker_and_in_vllm_event_translation():
    tokens = list(range(64))
    base, salted = full_blocks(tokens, 16), full_blocks(tokens, 16, lora_name="ada")
    assert {b.block_hash for b in base}.isdisjoint(b.block_hash for b in salted)
    assert [b.block_hash for b in salted] == sequence_hashes(block_hashes(tokens, 16, lora_name="ada"))

    class Listener:
        def __init__(self):
            self.hashes: list[int] = []

        def stored(self, blocks, parent):
            self.hashes += [b.block_hash for b in blocks]

        def removed(self, hashes):
            pass

        def cleared(self):
            pass

    listener = Listener()
    BlockHashTranslator(listener, 16).apply(BlocksStored(["e1", "e2", "e3", "e4"], None, tokens, 16, lora_name="ada"))
    assert listener.hashes == [b.block_hash for b in salted]  # what the preprocessor computes for "ada"
