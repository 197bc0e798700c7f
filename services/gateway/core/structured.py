"""vLLM's structured-output request fields, as clients migrating from ``vllm serve`` send them.

``structured_outputs: {json | regex | choice | grammar | json_object}`` (vLLM 0.11 and later) and
the older top-level ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``
become the worker's ``GuidedDecoding``. One constraint per request; vLLM's other
``structured_outputs`` options (whitespace handling, backends) are refused by name rather than
ignored. Regexes and grammars are checked by the engine's grammar compiler, whose dialect is its
own: a bad one comes back from the worker as a 400.
"""

from __future__ import annotations

from typing import Any

import orjson

from services.common.errors import InvalidRequest
from services.gateway.core.fields import Fields
from services.gateway.core.tools import check_schema

_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_LEGACY = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def parse_structured_outputs(f: Fields) -> dict[str, Any] | None:
    """The ``GuidedDecoding`` fields (``json_schema``, ``json_object``, ``regex``, ``choice`` or
    ``grammar``) the request asks for, or None."""
    given: dict[str, tuple[str, Any]] = {}  # the client's name for it -> (kind, value)
    nested = f.obj("structured_outputs")
    if nested is not None:
        sf = Fields(nested, "structured_outputs.")
        for kind in _KINDS:
            value = sf.raw(kind)
            if value is not None:
                given[f"structured_outputs.{kind}"] = (kind, value)
        sf.reject_unknown()
    for legacy, kind in _LEGACY.items():
        value = f.raw(legacy)
        if value is not None:
            given[legacy] = (kind, value)
    if not given:
        return None
    if len(given) > 1:
        names = ", ".join(f"'{name}'" for name in given)
        raise InvalidRequest(f"only one structured output constraint per request; got {names}",
                             param=next(iter(given)))
    param, (kind, value) = next(iter(given.items()))
    return _constraint(param, kind, value)


def _constraint(param: str, kind: str, value: Any) -> dict[str, Any]:
    if kind == "json":
        schema = value
        if isinstance(value, str):
            try:
                schema = orjson.loads(value)
            except orjson.JSONDecodeError:
                raise InvalidRequest(f"'{param}' is not valid JSON", param=param) from None
        check_schema(schema, param)
        return {"json_schema": orjson.dumps(schema).decode()}
    if kind == "json_object":
        if value is not True:
            raise InvalidRequest(f"'{param}' must be true", param=param)
        return {"json_object": True}
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequest(f"'{param}' must be a non-empty array of non-empty strings", param=param)
        return {"choice": value}
    if not isinstance(value, str) or not value:  # regex, grammar
        raise InvalidRequest(f"'{param}' must be a non-empty string", param=param)
    return {kind: value}
