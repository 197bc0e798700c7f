"""From an embeddings request's inputs to validated token ids (pure; ``service.py`` maps protos).

Unlike a completions prompt, an embedding input is tokenized *with* the tokenizer's special tokens
(``[CLS] ... [SEP]`` for BERT-style models): that is how sentence-embedding models were trained and
how sentence-transformers encodes. Token-id inputs are the model's own ids and are used exactly as
given (a client that tokenizes with ``tokenizer.encode(text)`` already has the special tokens).

An input longer than the model's maximum input length is a 400, never a silent truncation, as OpenAI
answers; the model directory's tokenizer must not truncate (services/models/minilm.py makes sure).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.errors import InvalidRequest
from services.preprocessor.core.artifacts import ModelArtifacts

EmbeddingInput = str | Sequence[int]
# Inputs shorter than this encode quickly: no floor on their tokens is looked for (length_floor.py).
_BOUND_FROM_CHARS = 16_384


def _check_length(i: int, count: int, max_input_tokens: int, *, at_least: bool = False) -> None:
    if max_input_tokens > 0 and count > max_input_tokens:
        raise InvalidRequest(f"This model's maximum input length is {max_input_tokens} tokens. However, 'input[{i}]' "
                             f"{'is at least' if at_least else 'resulted in'} {count} tokens. Please reduce the "
                             "length of the input.", param="input", code="context_length_exceeded")


def prepare_inputs(artifacts: ModelArtifacts, inputs: Sequence[EmbeddingInput],
                   max_input_tokens: int) -> list[list[int]]:
    """Token ids per input, in order; a 400 naming ``input`` for the first bad one."""
    if not inputs:
        raise InvalidRequest("'input' must not be empty", param="input")
    texts = {i: x.replace("\0", "") for i, x in enumerate(inputs) if isinstance(x, str)}
    for i, text in texts.items():
        if not text:
            raise InvalidRequest(f"'input[{i}]' must not be an empty string", param="input")
        if max_input_tokens > 0 and len(text) >= _BOUND_FROM_CHARS:
            # Refused before the inputs are encoded when a floor proves it too long (length_floor.py).
            _check_length(i, artifacts.fewest_tokens(text, max_input_tokens), max_input_tokens, at_least=True)
    # One encode_batch call for every text: it releases the GIL and runs on the tokenizer's threads.
    encoded = dict(zip(texts, artifacts.encoder.encode_batch(list(texts.values()), add_special_tokens=True),
                       strict=True))
    out: list[list[int]] = []
    for i, x in enumerate(inputs):
        if isinstance(x, str):
            ids = encoded[i].ids
        else:
            ids = list(x)
            if not ids:
                raise InvalidRequest(f"'input[{i}]' must not be an empty list of token ids", param="input")
            top = max(ids)
            if top >= artifacts.vocab_size:
                raise InvalidRequest(f"token id {top} in 'input[{i}]' is out of range for this model's vocabulary "
                                     f"of {artifacts.vocab_size} tokens", param="input")
        _check_length(i, len(ids), max_input_tokens)
        out.append(ids)
    return out


def input_size(inputs: Sequence[EmbeddingInput]) -> int:
    """Characters or token ids in all inputs: what decides whether preparing them leaves the event loop."""
    return sum(len(x) for x in inputs)
