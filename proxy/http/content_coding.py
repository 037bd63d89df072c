"""Request bodies sent compressed (`Content-Encoding`), decoded as they stream in, one bounded piece at a time.

Codex CLI compresses its request bodies with zstd, and any client may gzip
its own; the proxy must read the JSON to rewrite it. A compressed body of a
few kilobytes can stand for gigabytes (a compression bomb), so nothing is
ever decompressed whole: a decoder turns each chunk received into pieces of
about PIECE bytes, handed out one at a time as the reader asks for them (a
generator). The reader (proxy/http/relay.py) counts the decoded size as it
grows and refuses the body as soon as it passes `server.max_body_bytes`,
having held at most one piece more than that. The decoders' own state is
bounded too: zlib's window is 32 KiB, brotli's 16 MiB at most, and a zstd
frame may not ask for a window over 8 MiB (RFC 9659's limit for zstd in HTTP).

Codings stack (`gzip, br`: gzip applied first) and are undone last first;
`identity` is none. An unknown coding is a 415 naming the ones supported;
bytes that are not what their coding says, or that end inside its stream,
are a 400.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Protocol

import brotli

from proxy.errors import BadRequest, UnsupportedMediaType

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

__all__ = ["IDENTITY", "MAX_CODINGS", "PIECE", "SUPPORTED", "ZSTD_WINDOW_LOG_MAX", "Decoder", "decoder_for"]

# Decoded bytes a decoder hands out per step (brotli may give up to twice as many: it grows its buffer in blocks).
PIECE = 64 * 1024
# 2**23 = 8 MiB: the largest zstd window a frame may ask for (RFC 9659 §3); larger ones are refused, not allocated.
ZSTD_WINDOW_LOG_MAX = 23
# Codings one body may stack; more is refused (each holds a window of its own, and none has a use).
MAX_CODINGS = 4
SUPPORTED = ("zstd", "gzip", "deflate", "br")


class Decoder(Protocol):
    """Undoes one content coding (or a stack of them) incrementally."""

    name: str  # the coding(s), as the client's header named them

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of `data` (the body's next chunk), in pieces of about PIECE bytes, lazily."""
        ...

    def close(self) -> None:
        """After the last chunk: a BadRequest if the body ended inside a compressed stream."""
        ...


def _corrupt(name: str, detail: str) -> BadRequest:
    return BadRequest(f"request body is not valid {name} (Content-Encoding: {name}): {detail}",
                      code="invalid_content_encoding")


def _truncated(name: str) -> BadRequest:
    return _corrupt(name, "it ends before its compressed stream does")


class _Identity:
    name = "identity"

    def feed(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data

    def close(self) -> None:
        return None


IDENTITY: Decoder = _Identity()


class _Stream:
    """A decoder whose stream may be left unfinished: `_open` while a stream has begun and not ended."""

    name: str
    _open = False

    def close(self) -> None:
        if self._open:
            raise _truncated(self.name)


class _Zlib(_Stream):
    """gzip (RFC 1952; members may follow one another) and deflate (the zlib format, RFC 9110 §8.4.1.2)."""

    def __init__(self, name: str, wbits: int, members: bool) -> None:
        self.name, self._wbits, self._members = name, wbits, members
        self._d = zlib.decompressobj(wbits)
        self._open = False  # a stream has begun and not ended

    def feed(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        d = self._d
        while True:
            if d.eof and data:
                if not self._members:
                    raise _corrupt(self.name, "data after the end of its stream")
                d = self._d = zlib.decompressobj(self._wbits)
            try:
                out = d.decompress(data, PIECE)
            except zlib.error as e:
                raise _corrupt(self.name, str(e)) from None
            self._open = not d.eof
            if out:
                yield out
            data = d.unused_data if d.eof else d.unconsumed_tail
            if not data and (d.eof or len(out) < PIECE):  # a full piece may leave output pending: ask again
                return


class _Zstd(_Stream):
    """zstd (RFC 8878; frames may follow one another), its window held to ZSTD_WINDOW_LOG_MAX."""

    name = "zstd"

    def __init__(self) -> None:
        self._d = self._new()
        self._open = False

    @staticmethod
    def _new() -> zstd.ZstdDecompressor:
        return zstd.ZstdDecompressor(options={zstd.DecompressionParameter.window_log_max: ZSTD_WINDOW_LOG_MAX})

    def feed(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        d = self._d
        while True:
            if d.eof:
                if not data:
                    return
                d = self._d = self._new()
            try:
                out = d.decompress(data, PIECE)
            except zstd.ZstdError as e:
                raise _corrupt(self.name, str(e)) from None
            self._open = not d.eof
            if out:
                yield out
            if d.eof:
                data = d.unused_data
            elif d.needs_input:
                return
            else:  # output pending
                data = b""


class _Brotli(_Stream):
    """br (RFC 7932)."""

    name = "br"

    def __init__(self) -> None:
        self._d = brotli.Decompressor()
        self._open = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        d = self._d
        if d.is_finished():
            raise _corrupt(self.name, "data after the end of its stream")
        self._open = True
        try:
            out: bytes = d.process(data, output_buffer_limit=PIECE)
            while True:
                if out:
                    yield out
                # brotli asks for no more input while it holds some, and may hold output behind a full piece
                if d.is_finished() or (d.can_accept_more_data() and len(out) < PIECE):
                    return
                out = d.process(b"", output_buffer_limit=PIECE)
        except brotli.error as e:
            raise _corrupt(self.name, str(e)) from None

    def close(self) -> None:
        if self._open and not self._d.is_finished():
            raise _truncated(self.name)


class _Stack:
    """Codings applied in turn, undone in reverse: each decoder's pieces are fed to the next, one at a time."""

    def __init__(self, name: str, decoders: list[Decoder]) -> None:
        self.name, self._decoders = name, decoders  # in the order they are undone

    def feed(self, data: bytes) -> Iterator[bytes]:
        return self._through(0, data)

    def _through(self, i: int, data: bytes) -> Iterator[bytes]:
        if i == len(self._decoders):
            yield data
            return
        for piece in self._decoders[i].feed(data):
            yield from self._through(i + 1, piece)

    def close(self) -> None:
        for d in self._decoders:
            d.close()


_DECODERS: dict[str, Callable[[], Decoder]] = {
    "zstd": _Zstd,
    "gzip": lambda: _Zlib("gzip", 16 + zlib.MAX_WBITS, members=True),
    "x-gzip": lambda: _Zlib("gzip", 16 + zlib.MAX_WBITS, members=True),  # RFC 9110 §8.4.1.3: gzip's alias
    "deflate": lambda: _Zlib("deflate", zlib.MAX_WBITS, members=False),
    "br": _Brotli,
}


def decoder_for(content_encoding: str) -> Decoder:
    """The decoder undoing a body's `Content-Encoding` (the header's value, its codings comma-separated).

    Refused with 415 (before a byte of the body is read) for a coding the proxy cannot undo.
    """
    codings = [c for c in (c.strip().lower() for c in content_encoding.split(",")) if c and c != "identity"]
    unknown = [c for c in codings if c not in _DECODERS]
    if unknown:
        raise UnsupportedMediaType(f"request body Content-Encoding {unknown[0]!r} is not supported; "
                                   f"supported: {', '.join(SUPPORTED)} (or identity)",
                                   code="unsupported_content_encoding")
    if len(codings) > MAX_CODINGS:
        raise UnsupportedMediaType(f"request body Content-Encoding stacks {len(codings)} codings; "
                                   f"at most {MAX_CODINGS} are accepted", code="unsupported_content_encoding")
    decoders = [_DECODERS[c]() for c in reversed(codings)]
    if not decoders:
        return IDENTITY
    return decoders[0] if len(decoders) == 1 else _Stack(", ".join(codings), decoders)
