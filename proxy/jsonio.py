"""JSON in and out, fast, and written back in the client's own style.

Parse once with orjson. When a transform changes a request it must be
re-serialized; doing so in the client's style (separators, ASCII escaping)
keeps the untouched parts of the body as close as possible to what the client
sent, and - what matters for provider caches - is deterministic: the same
object and style always give the same bytes, on any process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

loads = orjson.loads


@dataclass(frozen=True)
class JsonStyle:
    compact: bool = True  # "," and ":" versus ", " and ": "
    ascii_only: bool = False  # non-ASCII written as \uXXXX escapes

    @classmethod
    def sniff(cls, raw: bytes) -> JsonStyle:
        """Guess the style from the body: the first key separator and the escapes used."""
        head = raw[:4096]
        i = head.find(b'":')
        compact = not (i >= 0 and head[i + 2:i + 3] == b" ")
        ascii_only = raw.isascii() and b"\\u" in raw
        return cls(compact=compact, ascii_only=ascii_only)

    def dumps(self, obj: Any) -> bytes:
        if self.compact and not self.ascii_only:
            return orjson.dumps(obj)
        seps = (",", ":") if self.compact else (", ", ": ")
        return json.dumps(obj, ensure_ascii=self.ascii_only, separators=seps).encode("utf-8")


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)
