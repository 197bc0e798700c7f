"""Tiny random diffusers pipelines for the tests, CI and the bench, built in code, saved as normal model dirs.

Nothing here touches the network: every component is made from a config written below, with weights
from a fixed torch seed, and the CLIP tokenizer is made in code with the ``tokenizers`` library (a
byte-level BPE with no merges: every byte is a token, which is all a random text encoder needs). Each
pipeline is written with ``save_pretrained``, so ``meshfront diffusers`` loads it exactly as it loads a
real model (``DiffusionPipeline.from_pretrained``, local files only).

Three directories, one per task, sharing the Stable Diffusion components (64x64 images, 2 steps in CI):

- ``text-to-image``: ``StableDiffusionPipeline`` (UNet2DConditionModel, AutoencoderKL, CLIPTextModel);
  the worker derives image-to-image and inpainting from the same components;
- ``image-to-image``: ``StableDiffusionImg2ImgPipeline`` over the same weights (its model_index names the
  class, so ``--task auto`` reads it as image-to-image);
- ``text-to-video``: ``AnimateDiffPipeline``, the same components plus a tiny ``MotionAdapter`` (the UNet
  becomes a UNetMotionModel). AnimateDiff, not the deprecated TextToVideoSDPipeline, because it takes
  ``callback_on_step_end`` (progress, previews and cancelling between steps) and runs on a CPU.

A marker records a hash of the inputs (builder version, diffusers and transformers versions), so a second
build with the same inputs returns at once; an flock makes concurrent builders wait for one build.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from services.models.build import REPO_ROOT, _locked, _read_marker, _write_json_atomic

log = logging.getLogger(__name__)

BUILD_VERSION = 1
MARKER = ".meshfront-build.json"
TASK_DIRS = ("text-to-image", "image-to-image", "text-to-video")
SEED = 0
IMAGE_SIZE = 64  # pixels: UNet sample_size 32 x VAE scale factor 2
VIDEO_MAX_FRAMES = 8  # the motion adapter's positional table (motion_max_seq_length)

# CLIP's byte-level alphabet: GPT-2's bytes_to_unicode, as CLIP's BPE uses it.
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]


def default_diffusion_model_dir() -> Path:
    """``<repo>/build/models/tiny-diffusion``, built on first use (``MESHFRONT_DIFFUSION_MODEL_DIR`` overrides)."""
    out = Path(os.environ.get("MESHFRONT_DIFFUSION_MODEL_DIR") or REPO_ROOT / "build" / "models" / "tiny-diffusion")
    return build_tiny_diffusion(out)


def build_tiny_diffusion(out_dir: str | Path) -> Path:
    """Builds (or reuses) ``out_dir/{text-to-image,image-to-image,text-to-video}`` and returns ``out_dir``."""
    out = Path(out_dir).resolve()
    inputs = _inputs_hash()
    if _read_marker(out).get("inputs") == inputs:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{out.name}.lock"):
        if _read_marker(out).get("inputs") == inputs:  # another process built it while we waited
            return out
        log.info("building tiny diffusion pipelines into %s", out)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
        try:
            _save_pipelines(staging)
            _write_json_atomic(staging / MARKER, {"inputs": inputs})
            shutil.rmtree(out, ignore_errors=True)
            os.replace(staging, out)
            out.chmod(0o755)  # mkdtemp makes 0700; the build is shared between users and services
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return out


def _inputs_hash() -> str:
    h = hashlib.sha256()
    versions = [importlib.metadata.version(package) for package in ("diffusers", "transformers", "torch")]
    for part in (str(BUILD_VERSION), *versions):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def clip_tokenizer() -> Any:
    """A CLIP tokenizer whose vocabulary is the 256 byte symbols (bare and word-final) and the two specials."""
    from transformers import CLIPTokenizer

    symbols = [chr(b) for b in _PRINTABLE]
    n = 0
    for b in range(256):  # the bytes GPT-2 maps above 255, in its order
        if b not in _PRINTABLE:
            symbols.append(chr(256 + n))
            n += 1
    vocab: dict[str, int] = {}
    for s in symbols:
        vocab[s] = len(vocab)
    for s in symbols:
        vocab[s + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def _components() -> dict[str, Any]:
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = clip_tokenizer()
    torch.manual_seed(SEED)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=IMAGE_SIZE // 2, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, norm_num_groups=4, attention_head_dim=4)
    vae = AutoencoderKL(
        block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), sample_size=IMAGE_SIZE)
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=77, projection_dim=32, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    text_encoder = CLIPTextModel(text_config)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    return {"unet": unet, "vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer, "scheduler": scheduler}


def _save_pipelines(root: Path) -> None:
    import torch
    from diffusers import AnimateDiffPipeline, MotionAdapter, StableDiffusionImg2ImgPipeline, StableDiffusionPipeline

    parts = _components()
    common = {**parts, "safety_checker": None, "feature_extractor": None, "requires_safety_checker": False}
    torch.manual_seed(SEED + 1)
    adapter = MotionAdapter(block_out_channels=(8, 16), motion_layers_per_block=1, motion_num_attention_heads=2,
                            motion_norm_num_groups=4, motion_max_seq_length=VIDEO_MAX_FRAMES)
    pipelines: dict[str, Any] = {  # Any: diffusers' pipeline classes confuse mypy
        "text-to-image": StableDiffusionPipeline(**common),
        "image-to-image": StableDiffusionImg2ImgPipeline(**common),
        "text-to-video": AnimateDiffPipeline(**parts, motion_adapter=adapter),
    }
    for task, pipeline in pipelines.items():
        pipeline.save_pretrained(root / task)
