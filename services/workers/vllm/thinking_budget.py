"""The thinking budget on vLLM: vLLM enforces it itself, batched in its sampler (``thinking_token_budget``).

vLLM forces the end of thinking once a request's budget is spent, given a ``ReasoningConfig`` whose
markers it finds in the prompt and output ids; it counts the block from the prompt's last opening marker
or the model's own, as services/workers/thinking_budget.py describes. The worker builds that config from
the markers of its own ``--reasoning-parser`` (the names are ours, shadowing vLLM's flag), only when both
are single tokens of the model's vocabulary: vLLM would otherwise force a marker's first token only. A
``--reasoning-config`` given to vLLM directly is kept as given. The engine then says whether it enforces
budgets (``enforces``); where it does not, a request with one is refused (``sampling.sampling_kwargs``).

Only the ReasoningConfig is set, not vLLM's ``--reasoning-parser``: that one would also delay guided
decoding until thinking ends, a behaviour the worker does not ask for.
"""

from __future__ import annotations

from typing import Any

from services.workers.model_dir import load_tokenizer
from services.workers.thinking_budget import ThinkingMarkers, thinking_markers


def configure(engine_args: Any, reasoning_parser: str, model_dir: str) -> ThinkingMarkers:
    """Gives ``engine_args`` (vLLM's ``AsyncEngineArgs``) the reasoning config of the worker's reasoning
    parser when its markers are single tokens; returns them, or why there are none."""
    from vllm.config.reasoning import ReasoningConfig

    markers = thinking_markers(reasoning_parser, load_tokenizer(model_dir))
    if markers.enforceable and engine_args.reasoning_config is None:
        engine_args.reasoning_config = ReasoningConfig(reasoning_start_str=markers.start_text,
                                                       reasoning_end_str=markers.end_text)
    return markers


def enforces(vllm_config: Any) -> bool:
    """Whether the started engine enforces thinking budgets (its reasoning config found its marker ids)."""
    config = vllm_config.reasoning_config
    return config is not None and config.enabled
