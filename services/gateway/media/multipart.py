"""multipart/form-data bodies (image edits, OpenAI's video create), every malformed one a 400.

No multipart library is pinned, so this is the stdlib's: ``email`` reads the Content-Type's boundary
and each part's headers (Content-Disposition's ``name`` and ``filename``, RFC 2231 forms included).
The parts themselves are cut out with ``bytes.find`` on the boundary rather than by ``email``'s whole-body
parser, which walks binary data line by line and copies it several times: an upload is one slice.

Bounded: at most ``max_parts`` parts, a text field at most ``MAX_TEXT`` bytes (a file is bounded by the
body limit at the edge). A field a caller reads as text must not be a file and must not repeat.
"""

from __future__ import annotations

import dataclasses
import email.message
import email.parser
import email.policy

from services.common.errors import InvalidRequest

MAX_PARTS = 64
MAX_TEXT = 1 << 20
_HEADERS = email.parser.BytesHeaderParser(policy=email.policy.HTTP)


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    data: bytes
    filename: str | None = None  # set for a file part
    content_type: str = ""


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
        part = found[0]
        if part.filename is not None:
            raise InvalidRequest(f"'{name}' must be a text field, not a file", param=name)
        if len(part.data) > MAX_TEXT:
            raise InvalidRequest(f"'{name}' is longer than {MAX_TEXT} bytes", param=name)
        try:
            return part.data.decode()
        except UnicodeDecodeError:
            raise InvalidRequest(f"'{name}' is not valid UTF-8", param=name) from None


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
