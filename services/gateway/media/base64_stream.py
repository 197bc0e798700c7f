"""Base64 of a byte stream, one chunk at a time, for answers too large to encode whole (a b64_json video).

Each piece is the encoding of whole 3-byte groups, so the pieces concatenate to the encoding of the
whole; the 0-2 bytes that do not fill a group wait for the next chunk. The chunk is encoded through a
memoryview, so a 1 MiB chunk is not copied before it is encoded (only when a carry has to lead it).
"""

from __future__ import annotations

import base64


class Base64Stream:
    def __init__(self) -> None:
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        if self._carry:
            data = self._carry + data
        cut = len(data) - len(data) % 3
        self._carry = data[cut:]
        return base64.b64encode(memoryview(data)[:cut])

    def end(self) -> bytes:
        out, self._carry = base64.b64encode(self._carry), b""
        return out
