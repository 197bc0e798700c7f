"""The worker's structural-tag settings: Dynamo's flags, carried on the card for the preprocessor.

In Dynamo these are worker settings published in the model card's runtime config (``structural_tag``); the
frontend reads them from there. Here too: the worker registers them on its ``ModelCard``
(``structural_tag_mode`` / ``_scope`` / ``_schema``), and the preprocessor builds each request's tag from them
(services/preprocessor/core/tool_guidance.py). Only workers whose engine enforces a tag take the flags: vLLM and
SGLang (xgrammar), and the mocker, which writes a forced tag's calls out.

- ``--dyn-structural-tag VALUE`` (``DYN_STRUCTURAL_TAG``; also ``--structural-tag-mode``): ``on`` / ``true`` /
  ``1`` / ``yes``, ``off`` / ``false`` / ``0`` / ``no``, or Dynamo's JSON object ``{"scope": "auto"|"always",
  "schema": "auto"|"strict"}`` (which turns it on). Its other keys are refused unless at Dynamo's default.
- ``--dyn-enable-structural-tag`` (``DYN_ENABLE_STRUCTURAL_TAG``): Dynamo's older switch, on.
- ``--dyn-structural-tag-scope`` / ``--dyn-structural-tag-schema`` (``DYN_STRUCTURAL_TAG_SCOPE`` / ``_SCHEMA``;
  also ``--structural-tag-scope`` / ``--structural-tag-schema``): Dynamo's older scope and schema flags; not
  together with a JSON ``--dyn-structural-tag``, as in Dynamo.

Off by default, as issue 37 asks and as Dynamo's frontend reads a card without the setting (Dynamo 1.6.1's
own worker resolves an unset flag to on, scope ``always``: docs/parsers.md says so).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import orjson

from services.common.flags import FlagParser

SCOPES = ("auto", "always")
SCHEMAS = ("auto", "strict")
_ON, _OFF = ("on", "true", "1", "yes"), ("off", "false", "0", "no")
# Dynamo's StructuralTagConfig keys Meshfront has no behaviour for, with the default it accepts for each.
_FIXED_KEYS: dict[str, Any] = {"allow_tool_calls_with_structured_output": False, "exclude_special_tokens": None,
                               "reasoning_boundary": "auto", "tool_arguments_any_order": False}


@dataclasses.dataclass(frozen=True)
class StructuralTagSettings:
    mode: str = "off"  # "on" | "off"
    scope: str = "always"
    schema: str = "auto"


def setting(value: str) -> str:
    """``--dyn-structural-tag``'s value, checked: "on", "off", or the JSON object as given."""
    text = value.strip()
    if text.lower() in _ON or text.lower() in _OFF:
        return "on" if text.lower() in _ON else "off"
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected on, off or a JSON object, got {value!r}") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"expected on, off or a JSON object, got {value!r}")
    unknown = sorted(set(obj) - {"scope", "schema", *_FIXED_KEYS})
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown key(s) {', '.join(unknown)}; known: scope, schema")
    if obj.get("scope", "always") not in SCOPES or obj.get("schema", "auto") not in SCHEMAS:
        raise argparse.ArgumentTypeError(f"scope must be one of {', '.join(SCOPES)} and schema one of "
                                         f"{', '.join(SCHEMAS)}")
    for key, default in _FIXED_KEYS.items():
        if key in obj and obj[key] != default:
            raise argparse.ArgumentTypeError(f"{key}={obj[key]!r} is not supported by Meshfront (only {default!r})")
    return text


def add_flags(p: FlagParser) -> None:
    p.add("--dyn-structural-tag", default="off", type=setting, aliases=("--structural-tag-mode",),
          dynamo_env="DYN_STRUCTURAL_TAG",
          help="constrain tool calls to the model's own call format (an xgrammar structural tag built from each "
               "request's tools and tool_choice): on, off, or Dynamo's JSON {\"scope\": \"auto|always\", "
               "\"schema\": \"auto|strict\"}; registered on the card (docs/parsers.md, 'Structural tags')")
    p.add("--dyn-enable-structural-tag", default=False, type=bool, dynamo_env="DYN_ENABLE_STRUCTURAL_TAG",
          help="Dynamo's older switch for --dyn-structural-tag on")
    p.add("--dyn-structural-tag-scope", default=None, choices=SCOPES, aliases=("--structural-tag-scope",),
          dynamo_env="DYN_STRUCTURAL_TAG_SCOPE",
          help="tool_choice auto gets a tag: always, or (auto) only when a tool is strict or parallel_tool_calls "
               "is false (default: always)")
    p.add("--dyn-structural-tag-schema", default=None, choices=SCHEMAS, aliases=("--structural-tag-schema",),
          dynamo_env="DYN_STRUCTURAL_TAG_SCHEMA",
          help="arguments held to the tool's schema: auto (unless the tool says strict: false) or strict (always)")


def from_args(args: argparse.Namespace) -> tuple[StructuralTagSettings, list[str]]:
    """The settings and the errors of their combination (Dynamo's: JSON and the older flags exclude each other)."""
    value, errors = args.dyn_structural_tag, []
    legacy = {name: getattr(args, f"dyn_structural_tag_{name}") for name in ("scope", "schema")}
    if value not in ("on", "off"):
        given = [f"--dyn-structural-tag-{name}" for name, v in legacy.items() if v is not None]
        if given:
            errors.append(f"--dyn-structural-tag cannot be combined with {', '.join(given)}")
        obj = orjson.loads(value)
        return StructuralTagSettings("on", obj.get("scope", "always"), obj.get("schema", "auto")), errors
    mode = "on" if value == "on" or args.dyn_enable_structural_tag else "off"
    return StructuralTagSettings(mode, legacy["scope"] or "always", legacy["schema"] or "auto"), errors
