"""The demo audio model directory: Qwen2-Audio's config over the demo tokenizer plus its audio tokens, and audio
token counts that the preprocessor and Qwen2-Audio's own processor agree on."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from services.models import qwen
from services.models.qwen_audio import AUDIO_TOKEN_IDS, NAME, VOCAB_SIZE, default_audio_model_dir
from services.preprocessor.media import audio as audio_counts
from services.preprocessor.media.placement import item_tokens, load_spec

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model_dir():
    return default_audio_model_dir()


@pytest.fixture(scope="module")
def processor(model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


def test_the_config_is_qwen2_audio_over_the_demo_tokenizer_and_its_audio_tokens(model_dir, processor):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    assert type(config).__name__ == "Qwen2AudioConfig"
    assert config.architectures == ["Qwen2AudioForConditionalGeneration"]
    assert json.loads((model_dir / "config.json").read_text())["_name_or_path"] == NAME
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB_SIZE == config.text_config.vocab_size
    assert {t: tok.token_to_id(t) for t in AUDIO_TOKEN_IDS} == AUDIO_TOKEN_IDS
    assert tok.token_to_id("<|im_end|>") == qwen.IM_END_ID  # the demo's own ids are where they were
    assert config.audio_token_index == processor.audio_token_id == AUDIO_TOKEN_IDS["<|AUDIO|>"]
    assert type(processor).__name__ == "Qwen2AudioProcessor"
    assert type(processor.feature_extractor).__name__ == "WhisperFeatureExtractor"
    # The encoder takes exactly the extractor's window (max_source_positions after the stride-2 convolution).
    assert config.audio_config.max_source_positions * 2 == processor.feature_extractor.nb_max_frames
    assert config.text_config.hidden_size // config.text_config.num_attention_heads == 64


# Sample counts at 16 kHz: a few ms, odd lengths around the hop and the halvings, whole seconds, the full window.
@pytest.mark.parametrize("samples", [400, 481, 1600, 4799, 16000, 16161, 40000, 123457, 479999, 480000])
def test_the_preprocessors_audio_token_count_is_qwen2_audios_own(model_dir, processor, samples):
    clip = np.random.default_rng(samples).standard_normal(samples).astype(np.float32) * 0.1
    out = processor(text="<|audio_bos|><|AUDIO|><|audio_eos|>", audio=[clip], sampling_rate=16000)
    theirs = out["input_ids"][0].count(processor.audio_token_id)
    spec = load_spec(str(model_dir), Tokenizer.from_file(str(model_dir / "tokenizer.json")))
    assert spec.placeholder_ids["audio"] == AUDIO_TOKEN_IDS["<|AUDIO|>"]
    assert item_tokens("audio", 0, 0, 0, 0.0, spec, samples=samples) == theirs > 0


def test_a_clip_longer_than_the_window_or_too_short_for_a_token_is_refused(model_dir):
    from services.common.errors import InvalidRequest

    spec = load_spec(str(model_dir), Tokenizer.from_file(str(model_dir / "tokenizer.json")))
    with pytest.raises(InvalidRequest, match="30.00 s long; this model hears at most 30 s"):
        item_tokens("audio", 0, 0, 0, 0.0, spec, samples=480001)
    with pytest.raises(InvalidRequest, match="too short"):
        item_tokens("audio", 0, 0, 0, 0.0, spec, samples=160)


def test_only_a_16_khz_whisper_extractor_gives_an_audio_spec():
    whisper = {"feature_extractor_type": "WhisperFeatureExtractor"}
    assert audio_counts.load_audio_spec(whisper) == audio_counts.AudioSpec()
    assert audio_counts.load_audio_spec({**whisper, "sampling_rate": 24000}) is None
    assert audio_counts.load_audio_spec({"image_processor_type": "Qwen2VLImageProcessor"}) is None
