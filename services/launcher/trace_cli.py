"""``meshfront trace REQUEST_ID``: one request's span tree, read from the trace viewer's API.

The request id is the ``x-request-id`` the client sent or the edge made up (every response echoes it).
Envoy's edge span and the gateway's span carry it as ``meshfront.request_id``; the command finds that
span in Arize Phoenix (``meshfront run --trace`` starts it), then every span of its trace, and prints
them as a tree with their durations and a few attributes. Spans reach the viewer in batches, so it
waits a little (``--wait-s``) for the trace to appear and to stop growing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from services.common.tracing import REQUEST_ID_ATTRIBUTE

DEFAULT_URL = "http://127.0.0.1:6006"
PAGE = 1000
# Attributes worth a glance in the tree; the viewer shows them all.
SHOWN = ("meshfront.worker_id", "meshfront.prefill_worker_id", "meshfront.prompt_tokens", "meshfront.cached_tokens",
         "meshfront.output_tokens", "meshfront.disaggregation_role", "meshfront.outcome")


@dataclasses.dataclass
class Span:
    span_id: str
    parent_id: str
    name: str
    start: datetime
    end: datetime
    attributes: dict[str, Any]
    children: list[Span] = dataclasses.field(default_factory=list)

    @property
    def duration_ms(self) -> float:
        return (self.end - self.start).total_seconds() * 1000


def _flatten(attributes: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Phoenix nests dotted attribute names ({"meshfront": {"worker_id": ...}}); back to dotted keys."""
    flat: dict[str, Any] = {}
    for key, value in attributes.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def parse_span(raw: dict[str, Any]) -> Span:
    return Span(raw["context"]["span_id"], raw.get("parent_id") or "", raw["name"],
                datetime.fromisoformat(raw["start_time"]), datetime.fromisoformat(raw["end_time"]),
                _flatten(raw.get("attributes") or {}))


def build_tree(spans: Sequence[Span]) -> list[Span]:
    """The roots (spans whose parent is not in the trace), each with its children by start time."""
    by_id = {s.span_id: s for s in spans}
    roots: list[Span] = []
    for s in sorted(spans, key=lambda s: s.start):
        parent = by_id.get(s.parent_id)
        (parent.children if parent is not None else roots).append(s)
    return roots


def render_tree(roots: Sequence[Span]) -> str:
    """One line per span: name, duration, offset from the first span's start, shown attributes."""
    if not roots:
        return ""
    t0 = min(r.start for r in roots)
    lines: list[str] = []

    def walk(span: Span, lead: str, branch: str) -> None:
        extra = " ".join(f"{k.removeprefix('meshfront.')}={span.attributes[k]}" for k in SHOWN
                         if k in span.attributes)
        offset = (span.start - t0).total_seconds() * 1000
        lines.append(f"{lead}{branch}{span.name}  {span.duration_ms:.1f} ms  (+{offset:.1f} ms)"
                     + (f"  {extra}" if extra else ""))
        child_lead = lead + ("   " if branch == "└─ " else "│  " if branch else "")
        for i, child in enumerate(span.children):
            walk(child, child_lead, "└─ " if i == len(span.children) - 1 else "├─ ")

    for root in roots:
        walk(root, "", "")
    return "\n".join(lines)


class Viewer:
    """The Phoenix REST API (``/v1/projects/{project}/spans``)."""

    def __init__(self, url: str, project: str):
        self.base = f"{url.rstrip('/')}/v1/projects/{urllib.parse.quote(project, safe='')}/spans"

    def _get(self, params: list[tuple[str, str]]) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base}?{urllib.parse.urlencode(params)}", timeout=10) as r:  # noqa: S310
            return json.loads(r.read())

    def trace_id_of(self, request_id: str) -> str:
        """The trace of the span tagged with ``request_id``, or "" when none has arrived."""
        # JSON-quoted: Phoenix would read an id of digits as a number.
        found = self._get([("attribute", f"{REQUEST_ID_ATTRIBUTE}:{json.dumps(request_id)}"), ("limit", "1")])
        data = found.get("data") or []
        return data[0]["context"]["trace_id"] if data else ""

    def spans(self, trace_id: str) -> list[Span]:
        out: list[Span] = []
        cursor = ""
        while True:
            params = [("trace_id", trace_id), ("limit", str(PAGE))] + ([("cursor", cursor)] if cursor else [])
            page = self._get(params)
            out.extend(parse_span(s) for s in page.get("data") or [])
            cursor = page.get("next_cursor") or ""
            if not cursor:
                return out


def fetch(viewer: Viewer, request_id: str, wait_s: float, settle_s: float = 1.0) -> tuple[str, list[Span]]:
    """The request's trace id and spans, once the trace exists and has not grown for ``settle_s``."""
    deadline = time.monotonic() + wait_s
    trace_id, seen_at = "", time.monotonic()
    spans: list[Span] = []
    while True:
        if not trace_id:
            trace_id = viewer.trace_id_of(request_id)
        if trace_id:
            latest = viewer.spans(trace_id)
            if len(latest) != len(spans):
                spans, seen_at = latest, time.monotonic()
            elif time.monotonic() - seen_at >= settle_s:
                return trace_id, spans
        if time.monotonic() >= deadline:
            return trace_id, spans
        time.sleep(0.25)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="meshfront trace", description="Print one request's span tree from the trace "
                                "viewer (Arize Phoenix, started by `meshfront run --trace`).")
    p.add_argument("request_id", help="the request's x-request-id (every response carries it)")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the viewer's address (default {DEFAULT_URL})")
    p.add_argument("--project", default="default", help="the viewer's project (default: default)")
    p.add_argument("--wait-s", type=float, default=10.0, help="how long to wait for the trace to arrive (default 10)")
    args = p.parse_args(argv)
    try:
        trace_id, spans = fetch(Viewer(args.url, args.project), args.request_id, args.wait_s)
    except OSError as e:
        print(f"meshfront trace: cannot read traces from {args.url}: {e}", file=sys.stderr)
        return 1
    if not trace_id:
        print(f"meshfront trace: no trace has a span with {REQUEST_ID_ATTRIBUTE}={args.request_id} "
              f"(is the mesh running with --trace?)", file=sys.stderr)
        return 1
    print(f"trace {trace_id}  request {args.request_id}  ({len(spans)} spans)")
    print(render_tree(build_tree(spans)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
