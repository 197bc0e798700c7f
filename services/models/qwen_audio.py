"""The demo audio model, ``meshfront/demo-qwen-audio``: a tiny random Qwen2-Audio built in code.

It shares the text demo's tokenizer (services/models/qwen.py) with Qwen2-Audio's three special tokens
added after Qwen3's (``<|audio_bos|>``, ``<|AUDIO|>``, ``<|audio_eos|>``: new ids, as the packaged vocabulary
has Qwen3's tokens where Qwen2-Audio's sit), and the Hermes template, which renders string content: the
preprocessor puts ``<|audio_bos|><|AUDIO|><|audio_eos|>`` where each audio part was (media/placement.py), as
Qwen2-Audio's template does without its "Audio N: " label. The network is Qwen2-Audio's: a one-layer
Whisper-style audio encoder (128 mel bins, two convolutions, a 2x pooling) projected into a two-layer Qwen2
text model; text heads are 64 wide, as vLLM's CPU attention needs.

``preprocessor_config.json`` is Qwen2-Audio's WhisperFeatureExtractor: 128 mel bins at 16 kHz, a 10 ms hop,
a 30 s window (vLLM's Qwen2-Audio expects exactly 3000 mel frames, so the window cannot be shorter; the encoder
runs on the whole padded window whatever the clip's length). A second of audio takes 25 prompt tokens, the
full 30 s 750. The preprocessor counts tokens from this same file (media/audio.py), and refuses a clip longer
than the window, which the model's processor would cut.

Built once under ``build/models/demo-qwen-audio`` (qwen_vl.py's builder) and reused while the marker names
the same inputs; weights are added on request (the mocker needs none).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from services.models import qwen, qwen_vl
from services.models.build import REPO_ROOT

NAME = "meshfront/demo-qwen-audio"
BUILD_VERSION = 1
CONTEXT_LENGTH = 4096
HIDDEN_SIZE = 128
SAMPLING_RATE = 16000
HOP_LENGTH = 160
CHUNK_LENGTH_S = 30
MEL_BINS = 128
# Qwen2-Audio's tokens, after Qwen3's added tokens (qwen.ADDED_TOKENS).
AUDIO_TOKENS = ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")
AUDIO_TOKEN_IDS = {tok: qwen.VOCAB_SIZE + i for i, tok in enumerate(AUDIO_TOKENS)}
VOCAB_SIZE = qwen.VOCAB_SIZE + len(AUDIO_TOKENS)


def default_audio_model_dir(with_weights: bool = False) -> Path:
    """``<repo>/build/models/demo-qwen-audio``, built on first use (``MESHFRONT_AUDIO_MODEL_DIR`` overrides)."""
    out = Path(os.environ.get("MESHFRONT_AUDIO_MODEL_DIR")
               or REPO_ROOT / "build" / "models" / "demo-qwen-audio")
    return build_audio_model(out, with_weights=with_weights)


def build_audio_model(out_dir: str | Path, *, with_weights: bool = False) -> Path:
    """Builds (or reuses) the demo audio model directory at ``out_dir`` and returns its path."""
    inputs = qwen_vl.inputs_hash(BUILD_VERSION, json.dumps(model_config(), sort_keys=True),
                                 json.dumps(preprocessor_config(), sort_keys=True))
    return qwen_vl.build_model_dir(out_dir, inputs, _write_files, save_random_weights, with_weights=with_weights)


def build_tokenizer():
    """The demo tokenizer with Qwen2-Audio's special tokens at ``AUDIO_TOKEN_IDS``."""
    from tokenizers import AddedToken

    tok = qwen.build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False,
                                       single_word=False) for t in AUDIO_TOKENS])
    got = {t: tok.token_to_id(t) for t in AUDIO_TOKENS}
    if got != AUDIO_TOKEN_IDS:
        raise RuntimeError(f"the audio tokens landed on unexpected ids: {got}")
    return tok


def tokenizer_config() -> dict:
    cfg = qwen.tokenizer_config(CONTEXT_LENGTH, qwen.chat_template())
    for tok, i in AUDIO_TOKEN_IDS.items():
        cfg["added_tokens_decoder"][str(i)] = {"content": tok, "lstrip": False, "normalized": False,
                                               "rstrip": False, "single_word": False, "special": True}
    cfg["processor_class"] = "Qwen2AudioProcessor"
    return cfg


def _write_files(out: Path) -> None:
    qwen_vl.write_model_files(out, build_tokenizer(), tokenizer_config(), model_config(), preprocessor_config())


def model_config() -> dict:
    """config.json: Qwen2-Audio's shape (transformers 5 layout, read by vLLM 0.32's transformers too)."""
    head_dim = 64
    return {
        "architectures": ["Qwen2AudioForConditionalGeneration"],
        "model_type": "qwen2_audio",
        "_name_or_path": NAME,
        "audio_token_index": AUDIO_TOKEN_IDS["<|AUDIO|>"],
        "tie_word_embeddings": True,
        "dtype": "float32",
        "audio_config": {
            "model_type": "qwen2_audio_encoder",
            "num_mel_bins": MEL_BINS,
            "encoder_layers": 1,
            "encoder_attention_heads": 1,
            "encoder_ffn_dim": 128,
            "d_model": 64,
            "activation_function": "gelu",
            # Mel frames after the stride-2 convolution: the window's frames / 2 (the encoder checks it).
            "max_source_positions": CHUNK_LENGTH_S * SAMPLING_RATE // HOP_LENGTH // 2,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "activation_dropout": 0.0,
            "scale_embedding": False,
            "initializer_range": 0.02,
        },
        "text_config": qwen_vl.text_config("qwen2", VOCAB_SIZE, HIDDEN_SIZE, CONTEXT_LENGTH, head_dim,
                                           {"rope_type": "default", "rope_theta": 1000000.0}),
    }


def preprocessor_config() -> dict:
    """preprocessor_config.json: Qwen2-Audio's WhisperFeatureExtractor (see the module doc)."""
    n_samples = CHUNK_LENGTH_S * SAMPLING_RATE
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "processor_class": "Qwen2AudioProcessor",
        "feature_size": MEL_BINS,
        "sampling_rate": SAMPLING_RATE,
        "hop_length": HOP_LENGTH,
        "chunk_length": CHUNK_LENGTH_S,
        "n_fft": 400,
        "n_samples": n_samples,
        "nb_max_frames": n_samples // HOP_LENGTH,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
    }


def save_random_weights(out_dir: Path, seed: int = 0) -> None:
    """Saves a seeded random-init Qwen2AudioForConditionalGeneration next to config.json (needs torch)."""
    # transformers 5 saves the language model one "model." deeper than Qwen2-Audio's checkpoints, which vLLM reads.
    qwen_vl.save_random_model(out_dir, "Qwen2AudioForConditionalGeneration", seed,
                              renames={"language_model.model.model.": "language_model.model."})
