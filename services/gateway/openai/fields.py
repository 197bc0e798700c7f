"""Typed readers for JSON request fields that raise a 400 naming the field."""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidRequest

_MISSING = object()


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(v), type(v).__name__)


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

    def int(self, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
        v = self.raw(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise InvalidRequest(f"'{self._name(key)}' must be an integer, got {_type_name(v)}", param=self._name(key))
        self._range(key, v, lo, hi)
        return v

    def float(self, key: str, lo: float | None = None, hi: float | None = None) -> float | None:
        v = self.raw(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidRequest(f"'{self._name(key)}' must be a number, got {_type_name(v)}", param=self._name(key))
        self._range(key, v, lo, hi)
        return float(v)

    def str(self, key: str, *, required: bool = False, allowed: tuple[str, ...] | None = None) -> str | None:
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

    def obj(self, key: str) -> dict[str, Any] | None:
        v = self.raw(key)
        if v is not None and not isinstance(v, dict):
            raise InvalidRequest(f"'{self._name(key)}' must be an object, got {_type_name(v)}", param=self._name(key))
        return v

    def list(self, key: str) -> list[Any] | None:
        v = self.raw(key)
        if v is not None and not isinstance(v, list):
            raise InvalidRequest(f"'{self._name(key)}' must be an array, got {_type_name(v)}", param=self._name(key))
        return v

    def _range(self, key: str, v: float, lo: float | None, hi: float | None) -> None:
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            bounds = f"between {lo} and {hi}" if lo is not None and hi is not None else (
                f">= {lo}" if lo is not None else f"<= {hi}")
            raise InvalidRequest(f"'{self._name(key)}' must be {bounds}; got {v}", param=self._name(key))

    def reject_unknown(self) -> None:
        """Nothing a client sent is silently dropped: unread fields are a 400."""
        unknown = sorted(k for k in self.body if k not in self.seen)
        if unknown:
            names = ", ".join(f"'{self._name(k)}'" for k in unknown)
            raise InvalidRequest(f"Unsupported parameter(s): {names}", param=self._name(unknown[0]))
