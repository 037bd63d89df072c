"""The hidden read-back rounds, written once for every API: answering `context_read` without the client seeing it.

When the model's answer calls the proxy's read tool and no tool the client
must run, the proxy answers the calls from the store, continues the
conversation with them and asks the provider again, up to `max_rounds`
(httpx's redirect loop is the model: one place counts the rounds, applies the
failure policy, sums usage and handles cut streams and provider errors). The
client gets one answer: non-streamed, the last round's with the proxy's calls
removed and usage covering every round; streamed, one valid event stream in
its API's shape. Each API supplies only its shapes (proxy/wire/read_shape.py).

The failure policy, the same for every API:
- a first answer the loop cannot read reaches the client as it came (a
  stream from the first unreadable event on, untouched), unless the proxy
  already hid some of it (its own call's events): it then cannot be relayed
  as it came, and the stream ends with one error in the client's API shape
  (what was relayed after that point would show the proxy's call);
- a value nested deeper than orjson writes safely (jsonio.SAFE_DEPTH) does
  not make a first answer unreadable: it is read like any other, so the
  proxy's call in it or beside it is answered or removed, never relayed;
  what of it the proxy rewrites is written by jsonio.dumps_any, never by
  orjson, and an answer nested past what any writer takes, which would have
  to be rewritten to remove the proxy's call, is one error in the client's
  API shape;
- a provider's error (status or stream event) in the first round is the
  client's, as sent, and ends the stream without a second error;
- an unusable answer to a hidden round (error status, not the API's shape,
  an error event, a transport failure) raises `HiddenRoundFailed`: one error
  in the client's API shape, none of the provider's bytes;
- a stream that ends before its terminal event raises `StreamCutShort`;
- a round the proxy cannot continue (its answer cannot be encoded back)
  ends the loop as the last round does: the client gets the answer with the
  proxy's calls removed.

The proxy's own call never reaches the client: what the loop relays untouched
holds none the loop could have answered, and what it rewrites is written
without them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson

from proxy import offloop
from proxy.request import Conversation, ReadTool
from proxy.rewrite.context_read.tool import answer
from proxy.store.archive import Archive
from proxy.upstream.client import iter_raw, read_answer
from proxy.wire import jsonio
from proxy.wire.codec import Item
from proxy.wire.read_shape import (
    HiddenRoundFailed,
    IllFormed,
    ReadShape,
    Reply,
    StreamRound,
    hidden_failure,
    is_error_body,
)
from proxy.wire.sse import DONE, StreamCutShort, event_data, event_payload, split_events
from proxy.wire.usage import Usage, parse_usage, summed

Send = Callable[[bytes], Awaitable[httpx.Response]]
SSE = "text/event-stream"


def unpassable(why: str) -> HiddenRoundFailed:
    """The error for a first answer that calls the proxy's tool and cannot be passed on without that call."""
    return HiddenRoundFailed(f"the provider's answer called the proxy's context_read tool and then could not be "
                             f"read or rewritten without that call ({why}); the rest of it was not passed on")


class ReadLoop:
    """The hidden rounds of one client request: how many, the items as they grew, what each was billed.

    Accounting reads `done`, `messages`, `usages` and `sent` (proxy/accounting/ledger.py).
    """

    def __init__(self, conv: Conversation, shape: ReadShape, tool: ReadTool, archive: Archive, send: Send,
                 url: str) -> None:
        self.conv, self.shape, self.tool, self.archive, self.send, self.url = conv, shape, tool, archive, send, url
        self.messages: list[Item] = list(conv.messages)
        self.done = 0
        self.usages: list[Usage] = []
        self.sent: list[int] = []  # items each hidden call sent: a prefix of `messages` (accounting's cacheable)

    @property
    def last(self) -> bool:
        return self.done >= self.tool.max_rounds

    def _takes_another(self, reply: Reply) -> bool:
        return bool(reply.ours) and not reply.others and reply.done and not self.last

    async def _next(self, reply: Reply) -> bytes | None:
        """The next request's bytes: the round's output, then the proxy's answers; None if it cannot be written."""
        results = [self.conv.wire.result(c.id, await answer(self.archive, c.arguments, self.tool.max_chars),
                                         self.tool.name) for c in reply.ours]
        new = [*reply.items, *results]
        if jsonio.deeper_than(new):  # a streamed call's input, joined, may nest past what can be written safely
            return None
        try:  # the whole conversation again: written on the pool when it is big (proxy/offloop.py)
            payload = await offloop.run_if(len(self.conv.raw), self._encode, new, reply)
        except (TypeError, ValueError, RecursionError):  # e.g. a call's input nested past what JSON writers take
            return None
        usage = parse_usage(reply.usage)
        if usage is not None:
            self.usages.append(usage)
        self.messages += new
        self.sent.append(len(self.messages))
        self.done += 1
        return payload

    def _encode(self, new: list[Item], reply: Reply) -> bytes:
        return self.conv.style.dumps(self.shape.continued(dict(self.conv.body), [*self.messages, *new], new, reply))

    def _summed(self, final: Any) -> Any:
        """The final answer's usage with every hidden round's added, in the provider's own spelling."""
        raw = [u.raw for u in self.usages if u.raw is not None]
        return summed([*raw, final]) if raw and isinstance(final, dict) else final

    # ---- non-streamed
    async def complete(self, first: httpx.Response) -> tuple[httpx.Response, bytes]:
        """The final response and its body."""
        resp = first
        while True:
            hidden = self.done > 0
            content = await read_answer(resp, self.url)
            ctype = resp.headers.get("content-type", "")
            if resp.status_code != 200:
                if hidden and not is_error_body(content):
                    raise hidden_failure(resp.status_code, content, ctype, "an error status without an error body")
                return resp, content
            try:
                reply = self.shape.reply(content)
                if hidden and jsonio.deeper_than(reply.data):  # orjson cannot write it back safely (jsonio.py)
                    raise IllFormed("nested too deep")
            except IllFormed as bad:
                if hidden:
                    raise hidden_failure(resp.status_code, content, ctype, str(bad)) from None
                return resp, content
            if not reply.ours and not hidden:
                return resp, content  # nothing of the proxy's: as it came, however deep it nests
            if self._takes_another(reply):
                payload = await self._next(reply)
                if payload is not None:
                    resp = await self.send(payload)
                    continue
            data = self.shape.without_ours(reply) if reply.ours else reply.data
            field = self.shape.usage_field
            if self.usages and isinstance(data.get(field), dict):
                data[field] = self._summed(data[field])
            try:  # a first answer may nest past what orjson writes safely; usage summed may pass 64 bits
                return resp, jsonio.dumps_any(data)
            except jsonio.TooDeep:
                raise unpassable("nested too deep") from None

    # ---- streamed
    async def stream(self, first: httpx.Response) -> AsyncIterator[bytes]:
        """Events pass through as they arrive, renumbered; the proxy's calls never reach the client."""
        resp, state = first, self.shape.stream_state()
        while True:
            hidden = self.done > 0
            if hidden:
                await self._check_hidden(resp)
            rnd = state.round(hidden)
            buffer = bytearray()
            relay = ended = False  # relay: unreadable first round, passed on untouched; ended: provider's error
            async for raw in iter_raw(resp, self.url):
                buffer += raw.replace(b"\r\n", b"\n") if b"\r" in raw else raw
                out: list[bytes] = []
                for ev in split_events(buffer):
                    if relay or ended:
                        out.append(ev)
                        continue
                    data = event_data(ev)
                    if not isinstance(data, dict) and data != DONE:
                        if hidden and (data is not None or event_payload(ev)):
                            raise hidden_failure(200, b"", SSE, "an event that is not a JSON object")
                        if not hidden:
                            out.append(ev)  # a comment, a keep-alive, or data the API does not define
                        continue
                    if hidden and isinstance(data, dict) and jsonio.deeper_than(data):
                        raise hidden_failure(200, b"", SSE, "an event nested too deep")
                    if isinstance(data, dict) and self.shape.is_error_event(data):
                        if hidden:
                            raise hidden_failure(200, orjson.dumps(data), SSE, "an error event")
                        out += [*rnd.held(), ev]  # the provider's own end of the stream: the client's, as sent
                        ended = True
                        continue
                    try:
                        out.append(rnd.event(data, ev))
                    except jsonio.TooDeep:
                        raise (hidden_failure(200, b"", SSE, "an event nested too deep") if hidden
                               else unpassable("an event nested too deep")) from None
                    except IllFormed as bad:
                        if hidden:
                            raise hidden_failure(200, b"", SSE, str(bad)) from None
                        if rnd.hid:  # the proxy's call was hidden: relayed from here, its end would show it
                            raise unpassable(str(bad)) from None
                        out += [*rnd.held(), ev]
                        relay = True
                if out and (joined := b"".join(out)):
                    yield joined
            if relay or ended:
                if buffer:
                    yield bytes(buffer)
                return
            if not rnd.finished:
                if buffer and not hidden:  # an unterminated last event: the client's to judge, as it came
                    yield b"".join([*rnd.held(), bytes(buffer)])
                raise StreamCutShort(f"the provider closed the stream before {self.shape.ends_with}")
            reply = rnd.reply()
            if self._takes_another(reply):
                payload = await self._next(reply)
                if payload is not None:
                    resp = await self.send(payload)
                    continue
            for ev in self._closing(rnd, reply):
                yield ev
            if buffer and not hidden:  # an unterminated last event after the end: passed on, as SSE leaves it
                yield bytes(buffer)
            return

    def _closing(self, rnd: StreamRound, reply: Reply) -> list[bytes]:
        try:
            return rnd.closing(reply, self._summed(reply.usage) if self.usages else None)
        except jsonio.TooDeep:
            raise unpassable("nested too deep") from None

    async def _check_hidden(self, resp: httpx.Response) -> None:
        """A hidden round's streamed answer must be a 200 event stream; anything else is read and refused."""
        ctype = resp.headers.get("content-type", "")
        if resp.status_code == 200 and ctype.startswith(SSE):
            return
        content = await read_answer(resp, self.url)
        raise hidden_failure(resp.status_code, content, ctype,
                             "not an event stream" if resp.status_code == 200 else "an error status")
