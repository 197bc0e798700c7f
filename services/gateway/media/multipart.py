"""multipart/form-data bodies (image edits, OpenAI's video create), every malformed one a 400.

No multipart library is pinned, so this is the stdlib's: ``email`` reads the Content-Type's boundary
and each part's headers (Content-Disposition's ``name`` and ``filename``, RFC 2231 forms included).
The parts themselves are cut out with ``bytes.find`` on the boundary rather than by ``email``'s whole-body
parser, which walks binary data line by line and copies it several times: an upload is one slice.

Bounded: at most ``max_parts`` parts, a text field at most ``MAX_TEXT`` bytes (a file is bounded by the
body limit at the edge). A field a caller reads as text must not be a file and must not repeat.

Nested fields: a form has no objects, so form encoders flatten them into bracketed names. The ``openai``
SDK sends ``extra_body={"nvext": {"fps": 8}}`` as the field ``nvext[fps]`` (``a[b][c]`` deeper) and a list
as ``a[]`` once per item (its ``_qs.Querystring``, ``array_format="brackets"``). ``text_object`` reads
them back as the object they were, and ``FormFields`` reads a number or a boolean from its text as JSON
would, so a form is checked by the same readers as a JSON body and its 400s name fields the same way
(``nvext.fps``). A list of objects (``a[][b]``) cannot be told apart item by item, so it is a 400.
"""

from __future__ import annotations

import dataclasses
import email.message
import email.parser
import email.policy
import re
from collections.abc import Iterable
from typing import Any

import orjson

from services.common.errors import InvalidRequest
from services.gateway.core.fields import Fields, IntType, check_float, check_int

MAX_PARTS = 64
MAX_TEXT = 1 << 20
_HEADERS = email.parser.BytesHeaderParser(policy=email.policy.HTTP)
# A field's name: a key, then any number of bracketed keys (``nvext[fps]``, ``a[b][c]``, ``a[]``).
_FIELD_NAME = re.compile(r"([^\[\]]+)((?:\[[^\[\]]*\])*)")
_BRACKETED = re.compile(r"\[([^\[\]]*)\]")


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    data: bytes
    filename: str | None = None  # set for a file part
    content_type: str = ""

    def text(self) -> str:
        """The value of a text field; a file, an oversized value or one that is not UTF-8 is a 400."""
        if self.filename is not None:
            raise InvalidRequest(f"'{self.name}' must be a text field, not a file", param=self.name)
        if len(self.data) > MAX_TEXT:
            raise InvalidRequest(f"'{self.name}' is longer than {MAX_TEXT} bytes", param=self.name)
        try:
            return self.data.decode()
        except UnicodeDecodeError:
            raise InvalidRequest(f"'{self.name}' is not valid UTF-8", param=self.name) from None


@dataclasses.dataclass(frozen=True)
class Form:
    parts: tuple[Part, ...]

    def names(self) -> set[str]:
        return {p.name for p in self.parts}

    def all(self, *names: str) -> list[Part]:
        return [p for p in self.parts if p.name in names]

    def text(self, name: str) -> str | None:
        """A text field's value; None when absent. A file or a repeated field is a 400."""
        found = self.all(name)
        if not found:
            return None
        if len(found) > 1:
            raise InvalidRequest(f"'{name}' was given {len(found)} times; give it once", param=name)
        return found[0].text()


def boundary_of(content_type: str) -> str:
    """The boundary of a multipart/form-data Content-Type, or a 400."""
    msg = email.message.Message()
    msg["content-type"] = content_type
    if msg.get_content_type() != "multipart/form-data":
        raise InvalidRequest(f"the body must be multipart/form-data; got Content-Type {content_type or 'none'!r}")
    boundary = msg.get_param("boundary")
    if not isinstance(boundary, str) or not 1 <= len(boundary) <= 70:
        raise InvalidRequest("the multipart/form-data Content-Type has no valid boundary")
    return boundary


def _part(raw: bytes, index: int) -> Part:
    head, sep, data = raw.partition(b"\r\n\r\n")
    if not sep:
        if not raw.endswith(b"\r\n"):
            raise InvalidRequest(f"multipart part {index} has no blank line after its headers")
        head, data = raw[:-2], b""  # headers and an empty body
    headers = _HEADERS.parsebytes(head + b"\r\n\r\n")
    if headers.get_content_disposition() != "form-data":
        raise InvalidRequest(f"multipart part {index} has no 'Content-Disposition: form-data' header")
    name = headers.get_param("name", header="content-disposition")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"multipart part {index} has no field name")
    filename = headers.get_filename()
    content_type = headers.get_content_type() if headers.get("content-type") else ""
    return Part(name=name, data=data, filename=filename, content_type=content_type)


def parse_form(body: bytes, content_type: str, *, max_parts: int = MAX_PARTS) -> Form:
    """The parts of a multipart/form-data ``body`` (RFC 7578), in order."""
    delimiter = b"--" + boundary_of(content_type).encode()
    if body.startswith(delimiter):
        pos = len(delimiter)
    else:  # a preamble before the first boundary is allowed, and ignored
        at = body.find(b"\r\n" + delimiter)
        if at < 0:
            raise InvalidRequest("the multipart body has no part (its boundary never occurs)")
        pos = at + 2 + len(delimiter)
    parts: list[Part] = []
    while True:
        if body.startswith(b"--", pos):
            return Form(tuple(parts))  # the closing boundary; an epilogue after it is ignored
        if not body.startswith(b"\r\n", pos):
            raise InvalidRequest("the multipart body is malformed after a boundary")
        start = pos + 2
        end = body.find(b"\r\n" + delimiter, start)
        if end < 0:
            raise InvalidRequest("the multipart body ends before its closing boundary")
        if len(parts) == max_parts:
            raise InvalidRequest(f"the multipart body has more than {max_parts} parts")
        parts.append(_part(body[start:end], len(parts)))
        pos = end + 2 + len(delimiter)


def field_path(name: str) -> tuple[list[str], bool]:
    """The keys a form field's name is a path of, and whether it is one item of a list: ``nvext[fps]`` is
    (["nvext", "fps"], False), ``a[b][c]`` (["a", "b", "c"], False), ``a[]`` (["a"], True)."""
    m = _FIELD_NAME.fullmatch(name)
    if m is None:
        raise InvalidRequest(f"the form field name {name!r} is malformed: a nested field is named like "
                             f"'nvext[fps]', a list's item like 'a[]'", param=name)
    keys = [m.group(1), *_BRACKETED.findall(m.group(2))]
    is_item = len(keys) > 1 and keys[-1] == ""
    if is_item:
        keys.pop()
    if "" in keys:
        raise InvalidRequest(f"the form field name {name!r} is not supported: only the last brackets may be empty "
                             f"(a list of text values); send a list of objects in a JSON body", param=name)
    return keys, is_item


def _given_twice(keys: list[str]) -> InvalidRequest:
    path = ".".join(keys)
    return InvalidRequest(f"'{path}' is given more than once in the form (as a field of its own, as nested "
                          f"'{keys[0]}[...]' fields, or repeated); give it once", param=path)


def text_object(parts: Iterable[Part]) -> dict[str, Any]:
    """Text fields as the object they flatten: ``nvext[fps]=8`` and ``nvext[seed]=3`` are
    ``{"nvext": {"fps": "8", "seed": "3"}}``, ``a[]`` given twice is ``{"a": ["x", "y"]}``. Values stay text
    (``FormFields`` reads them as what a field needs); a field given twice, or both as a value and as an object,
    is a 400 naming it."""
    body: dict[str, Any] = {}
    for part in parts:
        keys, is_item = field_path(part.name)
        value = part.text()
        node = body
        for depth, key in enumerate(keys[:-1], start=1):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise _given_twice(keys[:depth])
        last = keys[-1]
        if is_item:
            items = node.setdefault(last, [])
            if not isinstance(items, list):
                raise _given_twice(keys)
            items.append(value)
        elif last in node:
            raise _given_twice(keys)
        else:
            node[last] = value
    return body


def _number(v: Any) -> Any:
    """A text read as a JSON number ("9", "8.5", "1e3"); anything else unchanged, for the typed check to name."""
    if not isinstance(v, str):
        return v
    try:
        n = orjson.loads(v)
    except orjson.JSONDecodeError:
        return v
    return n if isinstance(n, (int, float)) and not isinstance(n, bool) else v


class FormFields(Fields):
    """``Fields`` over a form's ``text_object``, where every value is text: a number or boolean is read from
    its text as JSON reads it ("8", "8.5"; "true", "false", as the openai SDK writes booleans). A text that is
    none of these reaches the typed check unchanged, so the 400 names the field and the type it needs."""

    def bool(self, key: str, default: bool = False) -> bool:
        v = self.raw(key)
        if v in ("true", "false"):
            return v == "true"
        return super().bool(key, default)

    def int(self, key: str, kind: IntType, lo: int | None = None, hi: int | None = None) -> int | None:
        v = self.raw(key)
        return None if v is None else check_int(_number(v), self._name(key), kind, lo, hi)

    def float(self, key: str, lo: float | None = None, hi: float | None = None) -> float | None:
        v = self.raw(key)
        return None if v is None else check_float(_number(v), self._name(key), lo, hi)
