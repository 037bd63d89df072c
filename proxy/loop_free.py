"""The whole-body steps of a request (parse, the per-item checks, render and dump) off the event loop when big.

Each of them walks every item of the body: 100,000 items of 150 characters
are a second of Python in `check_items` or a render, however small each item
is. A big body (by its size in bytes, or its items' total: offloop.is_light)
has them run on the pool (proxy/offloop.py), where pure Python gives the GIL
back to the loop every switch interval; C calls that hold the GIL stay bounded
(proxy/wire/jsonio.py writes a long list element by element). The results are
the same objects and bytes as inline: only where the work runs changes.
"""

from __future__ import annotations

from proxy import offloop
from proxy.request import Conversation
from proxy.wire.codec import Codec


def _parsed(raw: bytes, wire: Codec) -> Conversation:
    conv = Conversation.parse(raw, wire)
    _ = conv.style  # sniffed here too: a scan of the whole body
    return conv


async def parse(raw: bytes, wire: Codec) -> Conversation:
    """Conversation.parse (a 400 for anything malformed), on the pool when the body is big."""
    if offloop.body_is_light(len(raw)):
        return _parsed(raw, wire)
    return await offloop.run(_parsed, raw, wire)


async def check(conv: Conversation, start: int = 0) -> None:
    """conv.check_messages(start): the items the session's memo does not know, on the pool unless light."""
    new = conv.messages[start:] if len(conv.raw) >= offloop.INLINE_CHARS else ()
    await offloop.run_unless_light(new, conv.check_messages, start)


async def to_bytes(conv: Conversation) -> bytes:
    """What is sent upstream (conv.to_bytes()): rendered and dumped on the pool when the body is big."""
    if not conv.changed:
        return conv.raw
    if offloop.body_is_light(len(conv.raw), len(conv.messages)):
        return conv.to_bytes()
    return await offloop.run(conv.to_bytes)
