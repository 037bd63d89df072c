"""Where a store key lives in Redis: ``<prefix>{<slot group>}<kind><key>``, one layout on every topology.

The hash tag is the key's slot group (proxy/store/keys.py), so every key an operation
mixes (a key's blob, counter and log; a counted group's bookkeeping and blobs; a session's
logs) hashes to one slot and a Redis Cluster runs the operation on one node. A key with no
group gets an empty tag, `{}`, which Redis ignores: the whole name is hashed and such keys
spread over the cluster. The whole store key follows the tag unchanged, so a stored name
reads back to its key exactly; a `}` inside a group is dropped from the tag (only the
first `}` may close it), which only puts two groups in one slot, never two keys in one name.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from redis.crc import key_slot

from .keys import slot_group

# Characters special in a SCAN MATCH pattern, escaped so a prefix matches literally.
GLOB_SPECIALS = "\\*?[]"
TAG_OPEN, TAG_CLOSE = "{", "}"


def glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in GLOB_SPECIALS else ch for ch in text)


class KeyLayout:
    """The stored names of one store (its prefix), and the way back from a name to its key."""

    def __init__(self, prefix: str) -> None:
        if TAG_OPEN in prefix or TAG_CLOSE in prefix:
            raise ValueError("the redis store prefix must not contain '{' or '}': they would move the hash tag")
        self.prefix = prefix

    def name(self, kind: str, key: str, group: str | None = None) -> bytes:
        """The stored name of ``key``, tagged by ``group``'s slot group instead when given (a key that goes with it)."""
        tag = slot_group(key if group is None else group).replace(TAG_CLOSE, "")
        return f"{self.prefix}{TAG_OPEN}{tag}{TAG_CLOSE}{kind}{key}".encode()

    def pattern(self, kind: str, key_prefix: str) -> bytes:
        """A SCAN MATCH for names of ``kind`` whose key may start with ``key_prefix``; `key_of` decides."""
        return (glob_escape(self.prefix + TAG_OPEN) + "*" + glob_escape(TAG_CLOSE + kind + key_prefix) + "*").encode()

    def key_of(self, kind: str, name: bytes, key_prefix: str = "") -> str | None:
        """The key a stored name holds, if it is of ``kind`` and starts with ``key_prefix``; else None."""
        text = name.decode()
        head = self.prefix + TAG_OPEN
        if not text.startswith(head):
            return None
        close = text.find(TAG_CLOSE, len(head))
        rest = text[close + 1:] if close >= 0 else ""
        if close < 0 or not rest.startswith(kind):
            return None
        key = rest[len(kind):]
        return key if key.startswith(key_prefix) and self.name(kind, key) == name else None


def by_slot(names: Iterable[bytes]) -> dict[int, list[int]]:
    """Positions of ``names`` grouped by cluster slot, in order: one multi-key command per group."""
    out: dict[int, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        out[key_slot(name)].append(i)
    return dict(out)
