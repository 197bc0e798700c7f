"""KServe v2 tensors <-> plain Python lists (pure: protobuf messages, no grpc).

Clients send elements either typed (``contents``) or as ``raw_input_contents``
(tritonclient always does the latter): little-endian arrays, BYTES elements
each behind a 4-byte little-endian length.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.core import fields

# KServe datatype -> (InferTensorContents field, struct code for raw data)
_LAYOUT = {
    "BOOL": ("bool_contents", "?"),
    "INT8": ("int_contents", "b"),
    "INT16": ("int_contents", "h"),
    "INT32": ("int_contents", "i"),
    "INT64": ("int64_contents", "q"),
    "UINT8": ("uint_contents", "B"),
    "UINT16": ("uint_contents", "H"),
    "UINT32": ("uint_contents", "I"),
    "UINT64": ("uint64_contents", "Q"),
    "FP32": ("fp32_contents", "f"),
    "FP64": ("fp64_contents", "d"),
    "BYTES": ("bytes_contents", ""),
}


@dataclasses.dataclass
class Tensor:
    """One decoded input: its datatype, shape and flattened elements."""

    name: str
    datatype: str
    shape: list[int]
    values: list[Any]


def _split_bytes(name: str, raw: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise InvalidRequest(f"input '{name}': truncated BYTES length prefix in raw_input_contents", param=name)
        (size,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + size > len(raw):
            raise InvalidRequest(f"input '{name}': a BYTES element runs past the end of raw_input_contents",
                                 param=name)
        out.append(raw[pos:pos + size])
        pos += size
    return out


def _from_raw(name: str, datatype: str, raw: bytes) -> list[Any]:
    code = _LAYOUT[datatype][1]
    if not code:
        return _split_bytes(name, raw)
    size = struct.calcsize(code)
    if len(raw) % size:
        raise InvalidRequest(f"input '{name}': {len(raw)} raw bytes is not a whole number of {datatype} elements",
                             param=name)
    return list(struct.unpack(f"<{len(raw) // size}{code}", raw))


def read_inputs(request) -> dict[str, Tensor]:
    """Decodes every input tensor of a ModelInferRequest, checking element counts against shapes."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
                             "it must hold one per input")
    out: dict[str, Tensor] = {}
    for i, t in enumerate(request.inputs):
        if t.datatype not in _LAYOUT:
            raise InvalidRequest(f"input '{t.name}': unsupported datatype {t.datatype!r}", param=t.name)
        if t.name in out:
            raise InvalidRequest(f"input '{t.name}' is given twice", param=t.name)
        if raw and t.HasField("contents"):
            # The protocol: with raw_input_contents, no input may carry typed contents (which data counts would
            # be a guess; the raw data used to win silently).
            raise InvalidRequest(f"input '{t.name}' has typed 'contents' while the request carries "
                                 "'raw_input_contents'; send each input's data one way", param=t.name)
        values = _from_raw(t.name, t.datatype, raw[i]) if raw else list(getattr(t.contents, _LAYOUT[t.datatype][0]))
        shape = list(t.shape)
        if shape and any(d < 0 for d in shape):
            raise InvalidRequest(f"input '{t.name}': negative dimension in shape {shape}", param=t.name)
        if shape and math.prod(shape) != len(values):
            raise InvalidRequest(f"input '{t.name}': shape {shape} needs {math.prod(shape)} elements; "
                                 f"got {len(values)}", param=t.name)
        out[t.name] = Tensor(t.name, t.datatype, shape, values)
    return out


def one_string(t: Tensor) -> str:
    """The single UTF-8 string a BYTES input of shape [1] (or [1, 1]) carries."""
    if t.datatype != "BYTES" or len(t.values) != 1:
        raise InvalidRequest(f"input '{t.name}' must be BYTES with exactly one element (shape [1]); "
                             f"got {t.datatype} with {len(t.values)}", param=t.name)
    try:
        return t.values[0].decode()
    except UnicodeDecodeError:
        raise InvalidRequest(f"input '{t.name}' is not valid UTF-8", param=t.name) from None


def one_bool(t: Tensor) -> bool:
    if t.datatype != "BOOL" or len(t.values) != 1:
        raise InvalidRequest(f"input '{t.name}' must be BOOL with exactly one element (shape [1])", param=t.name)
    return bool(t.values[0])


def token_ids(t: Tensor) -> list[int]:
    """A pre-tokenized prompt: INT32/INT64 (or unsigned) of shape [n] or [1, n], each id within uint32."""
    if t.datatype not in ("INT32", "INT64", "UINT32", "UINT64"):
        raise InvalidRequest(f"input '{t.name}' must be INT32 or INT64; got {t.datatype}", param=t.name)
    if len(t.shape) > 2 or (len(t.shape) == 2 and t.shape[0] != 1):
        raise InvalidRequest(f"input '{t.name}' must have shape [n] or [1, n]; got {t.shape}", param=t.name)
    if not t.values:
        raise InvalidRequest(f"input '{t.name}' must not be empty", param=t.name)
    return fields.token_ids(t.values, t.name)  # the same check as an OpenAI token-id prompt


def bytes_output(response, name: str, values: list[bytes]) -> None:
    """Adds a BYTES vector output to a ModelInferResponse.

    The elements travel in ``raw_output_contents`` (length-prefixed), as Triton
    sends them: tritonclient 2.73 cannot read typed ``bytes_contents`` under
    numpy 2 (it calls ``np.array(..., copy=False)``).
    """
    response.outputs.add(name=name, datatype="BYTES", shape=[len(values)])
    response.raw_output_contents.append(b"".join(struct.pack("<I", len(v)) + v for v in values))
