"""Small constructors for the OpenAPI 3.0 schema objects of the HTTP API (JSON-ready dicts).

OpenAPI 3.0 rather than 3.1 because the Swagger UI we ship (swagger-ui-bundle 1.1.0, Swagger UI
4.15) renders 3.0 fully; so ``nullable`` instead of type arrays.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def string(description: str = "", *, enum: tuple[str, ...] = (), nullable: bool = False, **kw: Any) -> Schema:
    out: Schema = {"type": "string", **kw}
    if enum:
        out["enum"] = list(enum)
    return _finish(out, description, nullable)


def integer(description: str = "", *, minimum: int | None = None, maximum: int | None = None,
            nullable: bool = False, **kw: Any) -> Schema:
    out: Schema = {"type": "integer", **kw}
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return _finish(out, description, nullable)


def number(description: str = "", *, minimum: float | None = None, maximum: float | None = None,
           nullable: bool = False, **kw: Any) -> Schema:
    out: Schema = {"type": "number", **kw}
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return _finish(out, description, nullable)


def boolean(description: str = "", *, nullable: bool = False, **kw: Any) -> Schema:
    return _finish({"type": "boolean", **kw}, description, nullable)


def array(items: Schema, description: str = "", *, nullable: bool = False, **kw: Any) -> Schema:
    return _finish({"type": "array", "items": items, **kw}, description, nullable)


def obj(properties: dict[str, Schema], description: str = "", *, required: tuple[str, ...] = (),
        extra: bool | Schema = False, nullable: bool = False) -> Schema:
    """An object; ``extra=False`` (the default) because unknown fields are a 400 everywhere."""
    missing = [r for r in required if r not in properties]
    if missing:
        raise ValueError(f"required fields without a schema: {missing}")
    out: Schema = {"type": "object", "properties": properties, "additionalProperties": extra}
    if required:
        out["required"] = list(required)
    return _finish(out, description, nullable)


def map_of(values: Schema, description: str = "") -> Schema:
    """A free-form object whose values follow ``values`` (``{}``: anything)."""
    return _finish({"type": "object", "additionalProperties": values}, description, False)


def one_of(*choices: Schema, description: str = "", nullable: bool = False) -> Schema:
    return _finish({"oneOf": list(choices)}, description, nullable)


def _finish(out: Schema, description: str, nullable: bool) -> Schema:
    if description:
        out["description"] = description
    if nullable:
        out["nullable"] = True
    return out
