"""Typed readers for JSON request fields that raise a 400 naming the field.

Every number a client sends ends up in a proto field, and protobuf refuses a value its field's type
cannot hold with a ValueError (a 500 by the time it surfaces). So each integer reader names the
proto type it feeds (``UINT32``, ``INT32``, ``UINT64``, ...) and the value is checked against that
type's range as well as the field's own bounds; floats must be finite and fit a proto ``float``.
Booleans are never numbers (Python's ``bool`` is an ``int``), and a float with a fractional part is
not an integer. An integral float (``16.0``; ``1e23``, which is how orjson reads integer literals
beyond 64 bits) is read as the integer it is and range-checked, as pydantic (vLLM) does, but only up
to 2**53, where floats stop being exact.

``token_ids`` is the one check of a pre-tokenized prompt, shared by the OpenAI and KServe paths.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Self

from services.common.errors import InvalidRequest

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class IntType:
    """The range of a proto integer type."""

    name: str
    lo: int
    hi: int


INT32 = IntType("int32", -(2**31), 2**31 - 1)
UINT32 = IntType("uint32", 0, 2**32 - 1)
INT64 = IntType("int64", -(2**63), 2**63 - 1)
UINT64 = IntType("uint64", 0, 2**64 - 1)
# The largest finite proto ``float`` (IEEE single precision).
FLOAT32_MAX = 3.4028234663852886e38
# Integers above this are not all exact as floats.
_EXACT_FLOAT_INT = 2**53
# Token ids travel as ``repeated uint32`` (TokenIds.ids).
TOKEN_ID = UINT32


def _type_name(v: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(v), type(v).__name__)


def as_int(v: Any) -> int | None:
    """``v`` as an integer (an int, or a float without a fractional part), else None; never a bool."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():  # False for NaN and the infinities
        return int(v)
    return None


def _bounds(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    return f">= {lo}" if lo is not None else f"<= {hi}"


def check_int(v: Any, param: str, kind: IntType, lo: int | None = None, hi: int | None = None,
              *, what: str | None = None) -> int:
    """``v`` as an integer that fits ``kind`` and ``[lo, hi]``, or a 400 naming ``param``.

    ``what`` names the value in the message when it is not the whole parameter (``'prompt[3]'``).
    """
    name = what or f"'{param}'"
    n = as_int(v)
    if n is None:
        raise InvalidRequest(f"{name} must be an integer, got {_type_name(v)}"
                             + (f" {v!r}" if isinstance(v, float) else ""), param=param)
    lo = kind.lo if lo is None else max(lo, kind.lo)
    hi = kind.hi if hi is None else min(hi, kind.hi)
    if not lo <= n <= hi:
        raise InvalidRequest(f"{name} must be {_bounds(lo, hi)}; got {v!r}", param=param)
    if isinstance(v, float) and abs(n) > _EXACT_FLOAT_INT:
        # Past 2**53 a float is not the integer the client wrote (orjson reads integers beyond
        # 64 bits as floats: -9223372036854775809 would land in range as -2**63).
        raise InvalidRequest(f"{name} must be an integer; got {v!r}, a float, which is not exact beyond 2**53",
                             param=param)
    return n


def check_float(v: Any, param: str, lo: float | None = None, hi: float | None = None) -> float:
    """``v`` as a finite number that fits a proto ``float`` and ``[lo, hi]``, or a 400 naming ``param``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidRequest(f"'{param}' must be a number, got {_type_name(v)}", param=param)
    if isinstance(v, float) and not math.isfinite(v):
        raise InvalidRequest(f"'{param}' must be a finite number; got {v}", param=param)
    lo = -FLOAT32_MAX if lo is None else max(lo, -FLOAT32_MAX)
    hi = FLOAT32_MAX if hi is None else min(hi, FLOAT32_MAX)
    if not lo <= v <= hi:
        raise InvalidRequest(f"'{param}' must be {_bounds(lo, hi)}; got {v}", param=param)
    return float(v)


def token_ids(values: Sequence[Any], param: str, where: str | None = None) -> list[int]:
    """A pre-tokenized prompt, from either API: a non-empty list of integers that fit a token id.

    ``param`` is the parameter a 400 names, ``where`` the list's place in it (``prompt[2]`` in a
    batch). Only the mesh's type (uint32) is checked here; an id beyond the model's vocabulary is
    the preprocessor's 400, since only it knows the tokenizer.
    """
    where = where or param
    if not values:
        raise InvalidRequest(f"'{where}' must not be an empty list of token ids", param=param)
    return [check_int(v, param, TOKEN_ID, what=f"token id '{where}[{i}]'") for i, v in enumerate(values)]


class Fields:
    """Reads fields out of one JSON object, remembering which were consumed."""

    def __init__(self, body: dict[str, Any], prefix: str = ""):
        self.body = body
        self.prefix = prefix
        self.seen: set[str] = set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def raw(self, key: str) -> Any:
        self.seen.add(key)
        v = self.body.get(key, _MISSING)
        return None if v is _MISSING else v

    def bool(self, key: str, default: bool = False) -> bool:
        v = self.raw(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise InvalidRequest(f"'{self._name(key)}' must be a boolean, got {_type_name(v)}", param=self._name(key))
        return v

    def int(self, key: str, kind: IntType, lo: int | None = None, hi: int | None = None) -> int | None:
        """An integer for a proto field of type ``kind``, within ``[lo, hi]`` as well; None if absent."""
        v = self.raw(key)
        return None if v is None else check_int(v, self._name(key), kind, lo, hi)

    def float(self, key: str, lo: float | None = None, hi: float | None = None) -> float | None:
        """A finite number for a proto ``float`` field, within ``[lo, hi]`` as well; None if absent."""
        v = self.raw(key)
        return None if v is None else check_float(v, self._name(key), lo, hi)

    def str(self, key: builtins.str, *, required: builtins.bool = False,
            allowed: tuple[builtins.str, ...] | None = None) -> builtins.str | None:
        v = self.raw(key)
        if v is None:
            if required:
                raise InvalidRequest(f"'{self._name(key)}' is required", param=self._name(key))
            return None
        if not isinstance(v, str):
            raise InvalidRequest(f"'{self._name(key)}' must be a string, got {_type_name(v)}", param=self._name(key))
        if required and not v.strip():
            raise InvalidRequest(f"'{self._name(key)}' must not be empty", param=self._name(key))
        if allowed is not None and v not in allowed:
            raise InvalidRequest(f"'{self._name(key)}' must be one of {', '.join(allowed)}; got {v!r}",
                                 param=self._name(key))
        return v

    def required_str(self, key: builtins.str) -> builtins.str:
        """A non-empty string that must be present."""
        v = self.str(key, required=True)
        assert v is not None  # str(required=True) raises instead of returning None
        return v

    def obj(self, key: builtins.str) -> dict[builtins.str, Any] | None:
        v = self.raw(key)
        if v is not None and not isinstance(v, dict):
            raise InvalidRequest(f"'{self._name(key)}' must be an object, got {_type_name(v)}", param=self._name(key))
        return v

    def nested(self, key: builtins.str) -> Self | None:
        """The object at ``key`` as a reader of this one's kind (its 400s name ``key.field``); None if absent."""
        v = self.obj(key)
        return None if v is None else type(self)(v, f"{self._name(key)}.")

    def list(self, key: builtins.str) -> list[Any] | None:
        v = self.raw(key)
        if v is not None and not isinstance(v, list):
            raise InvalidRequest(f"'{self._name(key)}' must be an array, got {_type_name(v)}", param=self._name(key))
        return v

    def reject_unknown(self) -> None:
        """Nothing a client sent is silently dropped: unread fields are a 400."""
        unknown = sorted(k for k in self.body if k not in self.seen)
        if unknown:
            names = ", ".join(f"'{self._name(k)}'" for k in unknown)
            raise InvalidRequest(f"Unsupported parameter(s): {names}", param=self._name(unknown[0]))
