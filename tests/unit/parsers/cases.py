"""Loads the parser case files (tests/golden/parsers/*.yaml) and runs a parser over a chunked text."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from pathlib import Path

import orjson
import yaml

from services.postprocessor.core.parsers import ParsedDelta, ParserConfig, ToolChoice, build_output_parser

CASES_DIR = Path(__file__).resolve().parents[2] / "golden" / "parsers"
_CONFIG_KEYS = {f.name for f in dataclasses.fields(ParserConfig)}


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    config: ParserConfig
    text: str
    expect: dict
    tools_json: str = ""  # the request's tools (a case file's ``tools``), for schema-typed formats


@dataclasses.dataclass
class Result:
    content: str = ""
    reasoning: str = ""
    calls: list[list[str]] = dataclasses.field(default_factory=list)
    ids: list[str] = dataclasses.field(default_factory=list)


def load_cases() -> list[Case]:
    cases = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for raw in doc["cases"]:
            settings = {**doc.get("defaults", {}), **{k: v for k, v in raw.items() if k in _CONFIG_KEYS}}
            if "tool_choice" in settings:
                settings["tool_choice"] = ToolChoice(settings["tool_choice"])
            tools = raw.get("tools", doc.get("tools"))
            cases.append(Case(raw["id"], ParserConfig(**settings), raw["text"], raw["expect"],
                              orjson.dumps(tools).decode() if tools else ""))
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return cases


def fold(deltas: Iterable[ParsedDelta]) -> Result:
    """Folds streamed deltas as a client would, checking the OpenAI delta shape on the way."""
    out = Result()
    content, reasoning = [], []
    for d in deltas:
        content.append(d.content)
        reasoning.append(d.reasoning)
        for call in d.tool_calls:
            if call.name:
                assert call.id and call.index == len(out.calls), call  # call_N; Kimi's functions.NAME:N
                out.calls.append([call.name, call.arguments])
                out.ids.append(call.id)
            else:
                assert not call.id and call.index == len(out.calls) - 1, call
                out.calls[-1][1] += call.arguments
    out.content, out.reasoning = "".join(content), "".join(reasoning)
    return out


def run(config: ParserConfig, chunks: Iterable[str], tools_json: str = "") -> Result:
    counter = itertools.count()
    parser = build_output_parser(config, new_id=lambda: f"call_{next(counter)}", tools_json=tools_json)
    if parser is None:
        return Result(content="".join(chunks))
    deltas = [parser.feed(chunk) for chunk in chunks]
    deltas.append(parser.finish())
    result = fold(deltas)
    assert parser.tool_calls == len(result.calls)
    return result
