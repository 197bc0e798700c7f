"""The preprocessor as a transport-free service: ``PreprocessRequest`` in, ``PreprocessResponse`` out.

The gRPC servicer (server.py) and the gateway's in-process client both call ``Preprocessor``.
Domain errors (``services.common.errors``) are raised, never returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2

from services.common import debug_perf, tracing
from services.common.discovery import LoraAdapter, ModelCard
from services.common.errors import Internal, InvalidRequest, ModelNotFound, StageUnavailable
from services.common.hashing import block_hashes, media_block_infos
from services.common.model_files import ModelFilesResolver, ModelFilesUnavailable
from services.preprocessor.core import embeddings as embed_inputs
from services.preprocessor.core import messages as msgs
from services.preprocessor.core import prompt as core
from services.preprocessor.core import tool_guidance
from services.preprocessor.core.artifacts import ArtifactCache, ArtifactError, ModelArtifacts
from services.preprocessor.core.renderers import ChatRenderer, OursChatRenderer
from services.preprocessor.core.thinking import apply_default_thinking_mode, forces_reasoning, thinking_off
from services.preprocessor.media import placement
from services.preprocessor.media.limits import MediaLimits
from services.preprocessor.media.resolve import MediaResolver, Resolved

log = logging.getLogger(__name__)


def thinking_decision(reasoning_parser: str, kwargs_json: str) -> tuple[bool, bool]:
    """(thinking off, output forced to start in reasoning) by the model family's rule (core/thinking.py)."""
    kwargs = orjson.loads(kwargs_json) if kwargs_json else {}
    if not isinstance(kwargs, dict):
        kwargs = {}
    return thinking_off(reasoning_parser, kwargs), forces_reasoning(reasoning_parser, kwargs)

ModelLookup = Callable[[str], ModelCard | None]

_CHOICES = {common_pb2.TOOL_CHOICE_MODE_UNSPECIFIED: "auto", common_pb2.TOOL_CHOICE_MODE_AUTO: "auto",
            common_pb2.TOOL_CHOICE_MODE_NONE: "none", common_pb2.TOOL_CHOICE_MODE_REQUIRED: "required",
            common_pb2.TOOL_CHOICE_MODE_NAMED: "named"}


def guide_tools(req: preprocessor_pb2.PreprocessRequest, card: ModelCard, prompt_opens_reasoning: bool,
                response: preprocessor_pb2.PreprocessResponse) -> None:
    """Kimi's history count and, where the card turns them on, the structural tag (core/tool_guidance.py)."""
    post, sampling = response.postprocess, response.request.sampling
    post.history_tool_calls = tool_guidance.history_tool_calls(req.messages_json)
    choice = _CHOICES[req.tool_choice.mode]
    tools = tool_guidance.ToolRequest(
        req.tools_json, choice, req.tool_choice.function_name, single_call=req.single_call,
        client_constraint=sampling.HasField("guided_decoding"),
        reasoning_open=prompt_opens_reasoning and not post.thinking_disabled)
    tag = tool_guidance.structural_tag_json(card.tool_call_parser, card.structural_tag_mode,
                                            card.structural_tag_scope, card.structural_tag_schema, tools)
    if tag is not None:  # replaces a forced choice's generic JSON form (AUTO had no guidance of its own)
        sampling.guided_decoding.CopyFrom(common_pb2.GuidedDecoding(structural_tag=tag))
        post.tool_calls_in_model_format = choice != "auto"


def lora_adapter(card: ModelCard, name: str) -> LoraAdapter | None:
    """The adapter a request names when ``name`` is not ``card``'s base model but one of its LoRA adapters."""
    if name == card.name:
        return None
    return next((a for a in card.lora_adapters if a.name == name), None)


def check_media(card: ModelCard, media) -> None:
    """Images and audio only go to models whose workers declare the modality (card input_modalities)."""
    for modality in dict.fromkeys(m.modality for m in media):
        if modality not in card.input_modalities:
            accepted = ", ".join(card.input_modalities) or "text only"
            raise InvalidRequest(f"The model `{card.name}` does not accept {modality} input (it accepts: "
                                 f"{accepted}).", param="messages", code="unsupported_modality")

# A thread hop costs more than rendering and encoding a few hundred tokens, so only prompts
# larger than this (in characters or token ids) are prepared off the event loop.
DEFAULT_OFFLOAD_THRESHOLD = 16_384


class Preprocessor:
    """Renders, tokenizes, validates and hashes requests for the models ``models`` knows.

    Args:
        models: model name -> card (from the worker registry), or None when no worker serves it.
        cache: loaded model artifacts, shared if several preprocessors run in one process.
        offload_threshold: prompt size above which work moves to a thread.
        chat_renderer: who renders and tokenizes chats (--chat-processor; default: ours).
    """

    def __init__(self, models: ModelLookup, cache: ArtifactCache | None = None,
                 offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD, *,
                 default_template_kwargs: dict[str, Any] | None = None, hide_tools_for_choice_none: bool = True,
                 chat_template: str = "", media: MediaResolver | None = None,
                 model_files: ModelFilesResolver | None = None, chat_renderer: ChatRenderer | None = None):
        self._models = models
        # Cards' model files from NATS (services/common/model_files.py); None: read each card's model_dir.
        self._files = model_files
        self._cache = cache or ArtifactCache()
        self._offload_threshold = offload_threshold
        # Per-deployment defaults (e.g. {"enable_thinking": false}); a request's own kwargs win.
        self._default_kwargs = dict(default_template_kwargs or {})
        self._hide_tools_for_none = hide_tools_for_choice_none
        # --chat-template: replaces every model directory's template (checked at start).
        self._chat_template = chat_template
        # Fetches and decodes each request's media once (--media-* bounds).
        self.media = media or MediaResolver(MediaLimits())
        self._vision_specs: dict[str, placement.VisionSpec] = {}
        self._chat_renderer = chat_renderer or OursChatRenderer()
        # Model directory -> its artifacts, once they and the chat renderer are loaded for it.
        self._ready: dict[str, ModelArtifacts] = {}

    async def preprocess(self, req: preprocessor_pb2.PreprocessRequest) -> preprocessor_pb2.PreprocessResponse:
        if debug_perf.ENABLED:  # its line: the render+tokenize and hash times that _run adds
            with debug_perf.request("preprocess", req.request.request_id):
                return await self._traced(req)
        return await self._traced(req)

    async def _traced(self, req: preprocessor_pb2.PreprocessRequest) -> preprocessor_pb2.PreprocessResponse:
        if not tracing.ENABLED:
            return (await self._preprocess(req))[0]
        with tracing.span("preprocess", {"meshfront.model": req.request.model}) as span:
            started = time.time_ns()
            response, prepared, prepared_ns = await self._preprocess(req)
            if prepared.rendered_ns:  # a chat prompt: its template, then its tokenization
                tracing.record_span("preprocess.template", span, started, prepared.rendered_ns)
                tracing.record_span("preprocess.tokenize", span, prepared.rendered_ns, prepared_ns)
            else:
                tracing.record_span("preprocess.tokenize", span, started, prepared_ns)
            span.set_attribute("meshfront.prompt_tokens", len(response.request.token_ids))
            return response

    async def _preprocess(self, req: preprocessor_pb2.PreprocessRequest
                          ) -> tuple[preprocessor_pb2.PreprocessResponse, core.PreparedPrompt, int]:
        """The response, the prompt it was prepared from and when that was done (time.time_ns(), 0 when
        tracing is off: the spans of ``preprocess`` need it)."""
        name = req.request.model
        card = self._models(name)
        if card is None:
            raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
        if card.is_embedding:
            raise InvalidRequest(f"The model `{name}` is an embedding model; use /v1/embeddings with it",
                                 param="model")
        core.check_stop_strings(req.request.stop.stop)
        check_media(card, req.request.media)
        artifacts = await self._artifacts(card)
        # Fetched and decoded here, once: the image's size decides its token count, which the prompt, the
        # block hashes and the context check all need (docs/architecture.md, "Image input").
        resolved = await self.media.resolve(req.request.media) if req.request.media else []
        spec = self._vision_spec(artifacts) if resolved else None
        stop = req.request.stop
        context_length = artifacts.effective_context_length(card.context_length)
        max_tokens = stop.max_tokens if stop.HasField("max_tokens") else None
        kind = req.WhichOneof("prompt")
        if kind == "messages_json":
            choice_none = req.tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_NONE
            chat = core.ChatInput(req.messages_json, req.tools_json, choice_none,
                                  self._template_kwargs_json(req.chat_template_kwargs_json,
                                                             card.default_thinking_mode),
                                  tool_choice_name=(req.tool_choice.function_name if req.tool_choice.mode
                                                    == common_pb2.TOOL_CHOICE_MODE_NAMED else ""),
                                  hide_tools_for_choice_none=self._hide_tools_for_none,
                                  template_override=self._chat_template,
                                  media_markers=spec.markers() if spec else {})
            prepared = await self._run(chat.size(), self._chat_renderer.prepare_chat, artifacts, chat, context_length,
                                       max_tokens)
            param = "messages"
        elif kind == "text":
            prepared = await self._run(len(req.text), core.prepare_text, artifacts, req.text, context_length,
                                       max_tokens)
            param = "prompt"
        elif kind == "tokens":
            prepared = core.prepare_tokens(artifacts, req.tokens.ids)
            param = "prompt"
        else:
            raise InvalidRequest("the request has no prompt", param="messages")
        placed: list[placement.Placed] = []
        if spec is not None:
            prepared, placed = self._place(prepared, resolved, spec)
        prepared_ns = time.time_ns() if tracing.ENABLED else 0
        core.check_context(len(prepared.token_ids), context_length, max_tokens, param)
        infos = media_block_infos([(p.offset, p.count, r.content_hash) for p, r in zip(placed, resolved, strict=True)
                                   if p.count], card.block_size) if placed else None
        # A LoRA adapter is served under its own name by workers of its base model (whose card this is):
        # its KV blocks are not the base's, so its hashes are salted with its name (as the engine's are).
        adapter = lora_adapter(card, name)
        lora_name = adapter.name if adapter is not None else None
        hashes = await self._run(len(prepared.token_ids), functools.partial(block_hashes, block_mm_infos=infos,
                                                                            lora_name=lora_name),
                                 prepared.token_ids, card.block_size, section="hash")
        response = self._response(req, card, artifacts, prepared, hashes)
        self._fill_media(response.request.media, resolved, placed)
        if adapter is not None:
            response.request.lora.name, response.request.lora.path = adapter.name, adapter.path
        if kind == "messages_json" and card.reasoning_parser:
            off, forced = thinking_decision(card.reasoning_parser, chat.chat_template_kwargs_json)
            response.postprocess.thinking_disabled = off
            response.postprocess.prompt_opens_reasoning |= forced
        if kind == "messages_json" and card.tool_call_parser:
            guide_tools(req, card, prepared.prompt_opens_reasoning, response)
        if req.return_formatted_prompt:
            response.formatted_prompt = prepared.text
        return response, prepared, prepared_ns

    async def preprocess_embeddings(self, req: preprocessor_pb2.PreprocessEmbeddingsRequest
                                    ) -> preprocessor_pb2.PreprocessEmbeddingsResponse:
        """Tokenizes an embeddings request's inputs with the embedding model's tokenizer."""
        card = self._models(req.model)
        if card is None:
            raise ModelNotFound(f"The model `{req.model}` does not exist.", param="model")
        if not card.is_embedding:
            raise InvalidRequest(f"The model `{req.model}` is not an embedding model; use /v1/chat/completions or "
                                 "/v1/completions with it", param="model")
        artifacts = await self._artifacts(card)
        inputs: list[embed_inputs.EmbeddingInput] = [
            x.text if x.WhichOneof("input") == "text" else list(x.tokens.ids) for x in req.inputs]
        ids = await self._run(embed_inputs.input_size(inputs), embed_inputs.prepare_inputs, artifacts, inputs,
                              artifacts.effective_context_length(card.context_length))
        return preprocessor_pb2.PreprocessEmbeddingsResponse(inputs=[preprocessor_pb2.TokenIds(ids=i) for i in ids])

    def _template_kwargs_json(self, raw: str, default_thinking_mode: str) -> str:
        """The request's chat_template_kwargs over the deployment's defaults: the preprocessor's
        --default-chat-template-kwargs, then the model card's default thinking mode (unless the request says
        something about thinking: core/thinking.py)."""
        if not self._default_kwargs and not default_thinking_mode:
            return raw
        own = msgs.parse_json(raw, "chat_template_kwargs", "chat_template_kwargs") if raw else {}
        if not isinstance(own, dict):
            raise InvalidRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
        kwargs = apply_default_thinking_mode({**self._default_kwargs, **own}, default_thinking_mode)
        return orjson.dumps(kwargs).decode()

    def _vision_spec(self, artifacts: ModelArtifacts) -> placement.VisionSpec:
        spec = self._vision_specs.get(artifacts.model_dir)
        if spec is None:
            spec = self._vision_specs[artifacts.model_dir] = placement.load_spec(artifacts.model_dir,
                                                                                 artifacts.tokenizer)
        return spec

    @staticmethod
    def _place(prepared: core.PreparedPrompt, resolved: list[Resolved], spec: placement.VisionSpec
               ) -> tuple[core.PreparedPrompt, list[placement.Placed]]:
        """The prompt with each item's placeholder expanded to its token count (placement.py)."""
        counts = [(r.modality, placement.item_tokens(r.modality, r.info.width, r.info.height, r.info.frames,
                                                     r.info.duration_s, spec, samples=r.info.samples))
                  for r in resolved]
        ids, placed = placement.expand(prepared.token_ids, counts, spec)
        return dataclasses.replace(prepared, token_ids=ids), placed

    @staticmethod
    def _fill_media(items, resolved: list[Resolved], placed: list[placement.Placed]) -> None:
        """What a worker receives per item (common.proto MediaItem): the bytes, never a URL to fetch."""
        for item, r, p in zip(items, resolved, placed, strict=True):
            item.content = r.content
            item.mime_type = r.info.mime_type
            item.content_hash = r.content_hash
            item.width, item.height = r.info.width, r.info.height
            item.token_offset, item.token_count = p.offset, p.count
            item.data = ""  # audio's base64, now in content
            if item.url.startswith("data:"):
                item.url = ""  # the same bytes again, base64

    async def warm(self, card: ModelCard) -> None:
        """Loads a model's artifacts ahead of its first request; failures are logged, not raised."""
        with contextlib.suppress(Internal):  # already logged by _artifacts; the first request reports it
            await self._artifacts(card)

    async def _artifacts(self, card: ModelCard) -> ModelArtifacts:
        model_dir = card.model_dir
        if self._files is not None:
            model_dir = self._files.peek(card.model_dir, card.model_files) or await self._fetch_files(card)
        ready = self._ready.get(model_dir)
        if ready is not None:
            return ready
        try:
            return await asyncio.to_thread(self._load, model_dir)
        except (ArtifactError, OSError) as e:
            log.error("cannot load model %s from %s: %s", card.name, model_dir, e)
            raise Internal(f"The model `{card.name}` cannot be loaded by the preprocessor.") from e

    async def _fetch_files(self, card: ModelCard) -> str:
        assert self._files is not None
        try:
            return await self._files.local_dir(card.model_dir, card.model_files)
        except ModelFilesUnavailable as e:
            log.error("model %s: %s", card.name, e)  # NATS or the worker's upload: both come back by themselves
            raise StageUnavailable(f"The files of model `{card.name}` are not available yet.") from None

    def _load(self, model_dir: str) -> ModelArtifacts:
        """The directory's artifacts, and the chat renderer ready for it (an engine's reads the model too:
        seconds for vLLM's), before a request uses them."""
        artifacts = self._cache.get(model_dir)
        artifacts.read_length_floor()
        self._chat_renderer.warm(artifacts)
        self._ready[model_dir] = artifacts
        return artifacts

    async def _run(self, size: int, fn, *args, section: str = "render_tokenize"):
        if debug_perf.ENABLED:
            fn = debug_perf.timed(section, fn)
        if size > self._offload_threshold:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    @staticmethod
    def _response(req: preprocessor_pb2.PreprocessRequest, card: ModelCard, artifacts: ModelArtifacts,
                  prepared: core.PreparedPrompt, hashes: list[int]) -> preprocessor_pb2.PreprocessResponse:
        out = preprocessor_pb2.PreprocessResponse()
        request = out.request
        request.CopyFrom(req.request)
        del request.token_ids[:]
        request.token_ids.extend(prepared.token_ids)
        stop = request.stop
        hidden = core.hidden_stop_ids(stop.stop_token_ids_hidden, artifacts.eos_token_ids, stop.ignore_eos)
        del stop.stop_token_ids_hidden[:]
        stop.stop_token_ids_hidden.extend(hidden)
        del request.eos_token_ids[:]
        if not stop.ignore_eos:
            request.eos_token_ids.extend(artifacts.eos_token_ids)
        out.block_hashes.extend(hashes)
        post = out.postprocess
        post.model_dir = card.model_dir
        post.model_files = card.model_files
        post.tool_call_parser = card.tool_call_parser
        post.reasoning_parser = card.reasoning_parser
        post.prompt_opens_reasoning = prepared.prompt_opens_reasoning
        return out
