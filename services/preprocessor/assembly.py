"""Builds the preprocessor from its config, warming each newly served model's tokenizer.

Used by the preprocessor's own process (server.py) and by the all-in-one process (services/allinone),
so both shapes honour every preprocessor flag.
"""

from __future__ import annotations

import dataclasses

from services.common.assembly import Built
from services.common.discovery import ModelCard, WorkerRegistry
from services.common.model_files import ModelFilesResolver
from services.common.namespace import Namespace
from services.common.warmup import warm_each_new_model
from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.core.artifacts import ArtifactCache
from services.preprocessor.core.renderers import load_chat_renderer
from services.preprocessor.media.resolve import MediaResolver
from services.preprocessor.media.uuid_store import SharedUuids
from services.preprocessor.service import Preprocessor


def build(cfg: PreprocessorConfig, registry: WorkerRegistry) -> Built[Preprocessor]:
    """The preprocessor over ``registry``'s model cards (subscribed to it; the caller starts it after building).

    Raises ``ChatRendererUnavailable`` when ``--chat-processor`` names an engine that is not installed.
    """
    def model_card(name: str) -> ModelCard | None:
        """The model's card, accepting the media every one of its workers declares."""
        cards = registry.workers_for(name)
        if not cards:
            return None
        card = cards[0].model
        common = set(card.input_modalities).intersection(*(c.model.input_modalities for c in cards[1:]))
        if len(common) == len(card.input_modalities):
            return card
        return dataclasses.replace(card, input_modalities=tuple(m for m in card.input_modalities if m in common))

    model_files = ModelFilesResolver(cfg.nats_url)  # tokenizer and template from NATS: no model volume needed
    shared_uuids = (SharedUuids(cfg.nats_url, cfg.media.uuid_ttl_s, cfg.media.uuid_store_bytes,
                                namespace=Namespace.of(cfg.namespace))
                    if cfg.media.uuid_store_bytes else None)
    preprocessor = Preprocessor(model_card, ArtifactCache(cfg.tokenizer), offload_threshold=cfg.offload_threshold,
                                default_template_kwargs=cfg.default_chat_template_kwargs,
                                hide_tools_for_choice_none=cfg.hide_tools_for_tool_choice_none,
                                chat_template=cfg.chat_template, media=MediaResolver(cfg.media, shared=shared_uuids),
                                model_files=model_files,
                                # vllm: seconds to import
                                chat_renderer=load_chat_renderer(cfg.chat_processor, cfg.tokenizer_prefix_cache_bytes))
    # A newly served model's tokenizer and template load now, not on its first request.
    return Built(preprocessor, closers=[warm_each_new_model(registry, preprocessor.warm), preprocessor.media.close,
                                        model_files.close])
