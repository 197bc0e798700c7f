"""The current OpenAI Chat Completions fields that are not sampling knobs, checked against their valid values.

What each one does here (docs/openai-extensions.md has the table):

- honoured: ``reasoning_effort`` and ``verbosity`` reach the chat template as variables (a template
  that reads them, e.g. gpt-oss's, uses them); ``reasoning_effort: "none"`` also turns thinking off
  (``enable_thinking: false``, what Qwen3-style templates read). ``prompt_cache_key`` is a sticky
  routing key, which is what it means at OpenAI: requests sharing it go to the worker holding
  their prefix. ``modalities: ["text"]`` is what every model here produces.
- accepted and ignored, because they mean nothing for a self-hosted model: ``store``,
  ``metadata``, ``service_tier``, ``safety_identifier``, ``prompt_cache_retention``,
  ``prompt_cache_options`` (cache lifetimes are the engine's), ``prediction`` (a latency hint for
  predicted outputs; output is the same without it), ``audio`` without audio output.
- refused (400 naming the field): output audio (``modalities`` with ``"audio"``), and the hosted
  tools ``web_search_options`` and ``moderation``, which need services a self-hosted model does not
  have; ignoring them would hand back an answer the client believes was searched or moderated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.core.fields import Fields

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
VERBOSITIES = ("low", "medium", "high")
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
CACHE_RETENTIONS = ("in_memory", "24h")
AUDIO_FORMATS = ("wav", "aac", "mp3", "flac", "opus", "pcm16")
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
# Hosted tools: no self-hosted equivalent, so a 400 rather than a silent no-op.
UNSUPPORTED_HOSTED = {"web_search_options": "web search", "moderation": "hosted moderation"}


@dataclasses.dataclass
class OpenAIOptions:
    """What the mesh does with the non-sampling OpenAI fields."""

    prompt_cache_key: str = ""
    # Variables for the chat template (reasoning_effort, verbosity, enable_thinking).
    template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def _metadata(f: Fields) -> None:
    md = f.obj("metadata")
    if md is None:
        return
    if len(md) > MAX_METADATA_PAIRS:
        raise InvalidRequest(f"'metadata' may hold at most {MAX_METADATA_PAIRS} pairs; got {len(md)}",
                             param="metadata")
    for k, v in md.items():
        if len(k) > MAX_METADATA_KEY:
            raise InvalidRequest(f"'metadata' keys are at most {MAX_METADATA_KEY} characters", param="metadata")
        if not isinstance(v, str) or len(v) > MAX_METADATA_VALUE:
            raise InvalidRequest(f"'metadata.{k}' must be a string of at most {MAX_METADATA_VALUE} characters",
                                 param=f"metadata.{k}")


def _modalities(f: Fields) -> bool:
    """Checks ``modalities`` and returns whether audio output was asked for (refused by the caller)."""
    mods = f.list("modalities")
    if mods is None:
        return False
    for m in mods:
        if m not in ("text", "audio"):
            raise InvalidRequest(f"'modalities' entries must be 'text' or 'audio'; got {m!r}", param="modalities")
    return "audio" in mods


def _audio(f: Fields) -> None:
    audio = f.obj("audio")
    if audio is None:
        return
    a = Fields(audio, "audio.")
    a.str("format", required=True, allowed=AUDIO_FORMATS)
    voice = a.raw("voice")
    if isinstance(voice, dict):
        vf = Fields(voice, "audio.voice.")
        vf.str("id", required=True)
        vf.reject_unknown()
    elif not isinstance(voice, str) or not voice:
        raise InvalidRequest("'audio.voice' must be a voice name or an object with an id", param="audio.voice")
    a.reject_unknown()


def _prediction(f: Fields) -> None:
    pred = f.obj("prediction")
    if pred is None:
        return
    p = Fields(pred, "prediction.")
    p.str("type", required=True, allowed=("content",))
    content = p.raw("content")
    if isinstance(content, list):
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                    and set(part) <= {"type", "text"}):
                raise InvalidRequest(f"'prediction.content[{i}]' must be a text part", param="prediction.content")
    elif not isinstance(content, str):
        raise InvalidRequest("'prediction.content' must be a string or an array of text parts",
                             param="prediction.content")
    p.reject_unknown()


def _prompt_cache_options(f: Fields) -> None:
    opts = f.obj("prompt_cache_options")
    if opts is None:
        return
    o = Fields(opts, "prompt_cache_options.")
    o.str("mode", allowed=("implicit", "explicit"))
    o.str("ttl", allowed=("30m",))
    o.reject_unknown()


def parse_openai_options(f: Fields) -> OpenAIOptions:
    """Reads every non-sampling OpenAI chat field; raises a 400 naming a bad or unsupported one."""
    for name, what in UNSUPPORTED_HOSTED.items():
        if f.raw(name) is not None:
            raise InvalidRequest(f"'{name}' is not supported: this server has no {what}", param=name)
    if _modalities(f):
        raise InvalidRequest("audio output is not supported: 'modalities' may only hold 'text'", param="modalities")
    _audio(f)
    _metadata(f)
    _prediction(f)
    _prompt_cache_options(f)
    f.bool("store")
    f.str("service_tier", allowed=SERVICE_TIERS)
    f.str("prompt_cache_retention", allowed=CACHE_RETENTIONS)
    f.str("safety_identifier")
    f.str("user")
    out = OpenAIOptions(prompt_cache_key=f.str("prompt_cache_key") or "")
    effort = f.str("reasoning_effort", allowed=REASONING_EFFORTS)
    if effort == "none":
        out.template_kwargs["enable_thinking"] = False
    elif effort is not None:
        out.template_kwargs["reasoning_effort"] = effort
    verbosity = f.str("verbosity", allowed=VERBOSITIES)
    if verbosity is not None:
        out.template_kwargs["verbosity"] = verbosity
    return out
