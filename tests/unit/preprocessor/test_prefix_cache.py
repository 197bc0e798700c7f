"""The prefix cache (core/prefix_cache.py) gives exactly the ids of a full render and encode, turn by turn, on every
conversation the preprocessor's render tests hold, under every template they render with, and on the
tokenizer formats the project builds (tiktoken, SentencePiece) and fastokens."""

from __future__ import annotations

import dataclasses
import functools
import gc
import json

import pytest
from prometheus_client import REGISTRY
from tokenizers import AddedToken, Tokenizer

from services.common.errors import InvalidRequest
from services.common.tokenizer_files import TokenizerOptions
from services.models.tokenizer_models import build_tokenizer_model
from services.preprocessor.config import parse_config
from services.preprocessor.core.artifacts import ArtifactCache, ModelArtifacts
from services.preprocessor.core.prefix_cache import Cuts, PrefixCache, _map_cuts
from services.preprocessor.core.prompt import ChatInput, encode, prepare_chat, render_chat_prompt
from services.preprocessor.core.renderers import DEFAULT_PREFIX_CACHE_BYTES, OursChatRenderer, load_chat_renderer
from services.preprocessor.metrics import register_prefix_cache_collector
from tests.conftest import ROOT
from tests.unit.preprocessor import test_chat_jinja as jinja_goldens
from tests.unit.preprocessor import test_render as render_goldens
from tests.unit.preprocessor import test_service_tool_guidance as guidance_goldens

pytestmark = pytest.mark.unit

WEATHER = render_goldens.WEATHER_TOOL
# An agent-style conversation: reasoning on every assistant turn (the template drops it from all but the
# last), tool calls and their results, and text that ends a turn without a newline.
AGENT = [
    {"role": "system", "content": "You are an agent. Answer briefly."},
    {"role": "user", "content": "What's the weather in Oslo and Paris? 東京 too 🤖"},
    {"role": "assistant", "content": "", "reasoning_content": "Need two calls.", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "a", "content": '{"temp": 3}'},
    {"role": "assistant", "content": "Oslo is 3°C.", "reasoning_content": "Now Paris."},
    {"role": "user", "content": "and Paris?"},
    {"role": "assistant", "content": "Paris: 21°C", "reasoning_content": "remembered"},
    {"role": "user", "content": "thanks!!"},
]


def text_parts_only(messages: list[dict]) -> list[dict]:
    """The render tests' bare ``{"type": "image"}`` part is for the template alone; the preprocessor takes
    media as image_url parts (its own tests)."""
    return [{**m, "content": [p for p in m["content"] if p["type"] == "text"]} if isinstance(m["content"], list)
            else m for m in messages]


GOLDEN_CONVERSATIONS = {
    **{f"chat_jinja:{k}": text_parts_only(v) for k, v in jinja_goldens.CONVERSATIONS.items() if v},
    "render:system-user": render_goldens.SYSTEM_USER,
    "render:tool-round-trip": render_goldens.TOOL_ROUND_TRIP,
    "tool_guidance:history": guidance_goldens.HISTORY,
    "agent": AGENT,
}
# Each way the request's options change the rendering: tools, thinking off, tool_choice none.
OPTIONS = {"plain": {}, "tools": {"tools": [WEATHER]}, "thinking-off": {"kwargs": {"enable_thinking": False}},
           "tools-hidden": {"tools": [WEATHER], "choice_none": True}}


def chat(messages, tools=None, kwargs=None, choice_none=False, template="") -> ChatInput:
    return ChatInput(json.dumps(messages), json.dumps(tools) if tools else "", choice_none,
                     json.dumps(kwargs) if kwargs else "", template_override=template)


def full_and_cached(artifacts: ModelArtifacts, cache: PrefixCache, c: ChatInput) -> tuple[list[int], list[int]]:
    return prepare_chat(artifacts, c).token_ids, prepare_chat(artifacts, c, prefix_cache=cache).token_ids


def every_turn(messages: list[dict]):
    """Each prefix of the conversation that a client would send: up to each message."""
    return [messages[:i] for i in range(1, len(messages) + 1)]


def test_every_golden_conversation_turn_by_turn(artifacts):
    cache = PrefixCache(64 << 20)
    compared = 0
    for name, conversation in GOLDEN_CONVERSATIONS.items():
        for option, o in OPTIONS.items():
            for turn in every_turn(conversation):
                full, cached = full_and_cached(artifacts, cache, chat(turn, **o))
                assert cached == full, (name, option, len(turn))
                compared += 1
    assert compared > 100
    assert cache.stats.hits > cache.stats.misses  # most turns reused an earlier one's ids
    assert cache.stats.reused_tokens > cache.stats.encoded_tokens
    assert cache.stats.fallbacks == 0


def test_every_golden_template_turn_by_turn(artifacts):
    """The render tests' small templates (text with and without markers, whitespace control, BOS/EOS given
    as kwargs) over their conversations; a template that fails does so with and without the cache."""
    cache = PrefixCache(64 << 20)
    for template_name, template in jinja_goldens.TEMPLATES.items():
        for name, raw in jinja_goldens.CONVERSATIONS.items():
            conversation = text_parts_only(raw)
            kwargs = {**jinja_goldens.CONTEXT, "bos_token": "<|im_start|>"}  # a BOS the tokenizer has
            for turn in every_turn(conversation) or [conversation]:
                c = chat(turn, [WEATHER], kwargs, template=template)
                try:
                    full = prepare_chat(artifacts, c).token_ids
                except InvalidRequest:
                    with pytest.raises(InvalidRequest):
                        prepare_chat(artifacts, c, prefix_cache=cache)
                    continue
                assert prepare_chat(artifacts, c, prefix_cache=cache).token_ids == full, (template_name, name)
    assert cache.stats.hits > 0


@pytest.fixture(scope="module")
def other_formats() -> dict[str, ModelArtifacts]:
    root = ROOT / "build" / "models" / "tokenizer-kinds"  # built once (SentencePiece trains ~1 s), then reused
    dirs = {kind: str(build_tokenizer_model(kind, root / kind)) for kind in ("tiktoken", "sentencepiece")}
    loaded = {kind: ArtifactCache().get(d) for kind, d in dirs.items()}
    # fastokens over the small tiktoken vocabulary: loading it over the demo's 151k takes seconds.
    fast = ArtifactCache(TokenizerOptions(backend="fastokens", fallback=False)).get(dirs["tiktoken"])
    assert not isinstance(fast.encoder, Tokenizer)  # fastokens' own, not the fallback
    return {**loaded, "fastokens": fast}


# The SentencePiece model's chat markers are normalised added tokens, matched after its normaliser, whose
# anchored rules ("^ ", " $") see the whole text between raw markers: no safe cut at them. Its raw
# markers are <s> and </s>, which this template uses around each message.
SP_TEMPLATE = ("{% for m in messages %}<s> {{ m.role }}\n{{ m.content }} </s>{% endfor %}"
               "{% if add_generation_prompt %}<s> assistant\n{% endif %}")


@pytest.mark.parametrize(("kind", "template", "hits"), [
    ("tiktoken", "", True), ("sentencepiece", "", False), ("sentencepiece", SP_TEMPLATE, True),
    ("fastokens", "", True)])
def test_other_tokenizers_turn_by_turn(kind, template, hits, other_formats):
    """SentencePiece's metaspace (a space prepended to the text's first piece only) and normaliser, tiktoken's
    pattern, and fastokens' own handling of added tokens: the same ids as encoding whole."""
    artifacts = other_formats[kind]
    # The preprocessor does not cache over fastokens (artifacts.py: not worth it); the cache is right over it.
    cuts = Cuts.of(artifacts.tokenizer.get_added_tokens_decoder())
    assert (artifacts.prefix_cuts is None) == (kind == "fastokens") and cuts is not None
    cache = PrefixCache(64 << 20)
    for conversation in (AGENT, render_goldens.SYSTEM_USER, jinja_goldens.CONVERSATIONS["user-only"]):
        plain = [{"role": m["role"], "content": m.get("content") or " x "} for m in conversation]
        for turn in every_turn(plain):
            text = render_chat_prompt(artifacts, chat(turn, template=template))
            full = encode(artifacts, text)
            assert cache.encode(artifacts.model_dir, artifacts.encoder, cuts, text,
                                functools.partial(encode, artifacts)) == full, (kind, len(turn))
    assert (cache.stats.hits > 0) == hits
    assert cache.stats.fallbacks == 0


def test_edited_history_reuses_only_what_is_unchanged(artifacts):
    cache = PrefixCache(64 << 20)
    for turn in every_turn(AGENT):
        full_and_cached(artifacts, cache, chat(turn, [WEATHER]))
    edited = [dict(m) for m in AGENT]
    edited[1]["content"] = "What's the weather in Rome?"  # the first user message, under later turns
    before = cache.stats.reused_tokens
    full, cached = full_and_cached(artifacts, cache, chat(edited, [WEATHER]))
    assert cached == full
    system_only = len(prepare_chat(artifacts, chat(AGENT[:1], [WEATHER])).token_ids) - 3  # less the gen. prompt
    assert cache.stats.reused_tokens - before == system_only


def test_changed_tools_reuse_nothing_after_the_system_turn(artifacts):
    cache = PrefixCache(64 << 20)
    full_and_cached(artifacts, cache, chat(AGENT, [WEATHER]))
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    full, cached = full_and_cached(artifacts, cache, chat(AGENT, [other]))
    assert cached == full
    assert cache.stats.hits == 0  # the tools are in the first (system) turn: no common cut before them


def test_models_never_share_entries(artifacts):
    """Two model directories (say, over the same tokenizer file): the same text, never each other's entries."""
    other = dataclasses.replace(artifacts, model_dir=artifacts.model_dir + "-other")
    cache = PrefixCache(64 << 20)
    full_and_cached(artifacts, cache, chat(AGENT))
    full, cached = full_and_cached(other, cache, chat(AGENT))
    assert cached == full
    assert (cache.stats.hits, cache.stats.misses) == (0, 2)
    full_and_cached(other, cache, chat(AGENT))
    assert cache.stats.hits == 1


def test_another_encoder_for_the_model_drops_its_entries_and_is_checked(artifacts, other_formats):
    """The model directory loaded again, here with an encoder that splits otherwise (another vocabulary: its
    markers have other ids): the old encoder's entries go, and every prompt is checked, found not to hold the
    predicted markers, and encoded whole."""
    cache = PrefixCache(64 << 20)
    full_and_cached(artifacts, cache, chat(AGENT))
    assert len(cache) == 1
    mismatched = dataclasses.replace(artifacts, encoder=other_formats["tiktoken"].encoder)
    for turn in every_turn(AGENT):
        full, cached = full_and_cached(mismatched, cache, chat(turn))
        assert cached == full
    assert cache.stats.fallbacks == len(AGENT) and cache.stats.hits == 0 and len(cache) == 0


def test_full_cache_evicts_the_oldest_and_stays_within_its_bytes(artifacts):
    one = PrefixCache(64 << 20)
    full_and_cached(artifacts, one, chat(AGENT))
    capacity = one.size_bytes * 3  # room for about three conversations
    cache = PrefixCache(capacity)
    for i in range(10):
        conversation = [{"role": "system", "content": f"session {i}"}, *AGENT[1:]]
        for turn in every_turn(conversation):
            full, cached = full_and_cached(artifacts, cache, chat(turn))
            assert cached == full
            assert cache.size_bytes <= capacity
    assert cache.stats.evictions > 0
    assert 1 <= len(cache) <= 3
    tiny = PrefixCache(100)  # smaller than any entry: nothing is kept, every prompt still encodes right
    full, cached = full_and_cached(artifacts, tiny, chat(AGENT))
    assert cached == full and len(tiny) == 0


def test_extended_turns_leave_one_entry_per_conversation(artifacts):
    """A turn that extends the last one replaces its entry (nothing finds the old one any more)."""
    cache = PrefixCache(64 << 20)
    talk = [{"role": "system", "content": "Be brief."}]
    for i in range(6):
        talk.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"})
        full_and_cached(artifacts, cache, chat(talk))
    assert len(cache) == 1 and cache.stats.hits == 5


def test_nul_characters_bypass_the_cache(artifacts):
    cache = PrefixCache(64 << 20)
    messages = [{"role": "user", "content": "a\0b"}]
    full, cached = full_and_cached(artifacts, cache, chat(messages))
    assert cached == full and len(cache) == 0


def test_tokens_that_take_whitespace_leave_no_safe_cut():
    added = {1: AddedToken("<a>", special=True, normalized=False),
             2: AddedToken("<mask>", special=True, normalized=False, lstrip=True)}
    assert Cuts.of(added) is None
    assert Cuts.of({}) is None
    cuts = Cuts.of({1: added[1], 3: AddedToken("<ab>", special=True, normalized=False)})
    assert cuts is not None
    assert [m.group() for m in cuts.pattern.finditer("x<ab><a>b")] == ["<ab>", "<a>"]  # longest first


def test_ids_that_do_not_hold_the_predicted_markers_are_refused():
    ids = {"<a>": 7, "<b>": 8}
    assert _map_cuts([7, 1, 8, 2], [(0, "<a>"), (3, "<b>")], ids, 10) == [10, 12]
    assert _map_cuts([1, 7, 8], [(0, "<a>"), (3, "<b>")], ids, 10) is None  # the cut is not the first id
    assert _map_cuts([7, 1, 2], [(0, "<a>"), (3, "<b>")], ids, 10) is None  # a marker missing
    assert _map_cuts([7, 8, 8], [(0, "<a>"), (3, "<b>")], ids, 10) is None  # one more than the text has


def test_flag_sizes_or_turns_off_the_cache():
    assert parse_config([]).tokenizer_prefix_cache_bytes == DEFAULT_PREFIX_CACHE_BYTES
    cfg = parse_config(["--tokenizer-prefix-cache-bytes", "0"])
    renderer = load_chat_renderer(cfg.chat_processor, cfg.tokenizer_prefix_cache_bytes)
    assert isinstance(renderer, OursChatRenderer) and renderer.prefix_cache is None
    sized = load_chat_renderer("ours", 1 << 20)
    assert isinstance(sized, OursChatRenderer) and sized.prefix_cache is not None
    assert sized.prefix_cache.capacity_bytes == 1 << 20
    with pytest.raises(ValueError, match="--tokenizer-prefix-cache-bytes must be >= 0"):
        parse_config(["--tokenizer-prefix-cache-bytes", "-1"])


def test_metrics_count_what_the_caches_did(artifacts):
    register_prefix_cache_collector()
    register_prefix_cache_collector()  # once per process, however many preprocessors are built

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(f"meshfront_preprocessor_prefix_cache_{name}", labels) or 0.0

    gc.collect()  # the sums are over live caches: earlier tests' must be gone before the first reading
    hits, misses = sample("lookups_total", result="hit"), sample("lookups_total", result="miss")
    reused = sample("prompt_tokens_total", source="reused")
    cache = PrefixCache(64 << 20)
    for turn in every_turn(AGENT):
        full_and_cached(artifacts, cache, chat(turn))
    assert sample("lookups_total", result="hit") - hits == cache.stats.hits
    assert sample("lookups_total", result="miss") - misses == 1
    assert sample("prompt_tokens_total", source="reused") - reused == cache.stats.reused_tokens > 0
    assert sample("bytes") >= cache.size_bytes > 0
