"""The turn engine: one request of an API with a codec, top to bottom, for any transport.

parse → route/session → shape → send (overflow retry) → read-back rounds → answer.
Each step is a call into its own module; `turn` only sequences them, and
answers an `Answer` (proxy/engine/run.py) that a transport frames: the HTTP
handlers as a response (JSON or SSE), the Responses WebSocket as frames. The
request's flow says when it is sent, answered and ended; accounting, tracing
and the log line observe those moments (proxy/request/flow.py).
`count` is a turn that stops before the send: count_tokens answers for exactly
what the turn would send (the route's transforms but the status bar, which is
no part of a count). Traced (proxy/telemetry/), the request is one SERVER span
current while the steps run, ended with the request's log line (a stream's:
when it has ended).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from proxy.engine.run import Answer, Inbound, StreamEnd, context, failed, parse, start, stream_events
from proxy.engine.send import Sent, provider_call, send_upstream
from proxy.errors import ProxyError
from proxy.request.events import Degraded
from proxy.request.flow import Flow
from proxy.rewrite.context_read.loop import ReadLoop
from proxy.rewrite.pipeline import response_loop, shape
from proxy.state import ProxyState
from proxy.upstream.client import iter_raw, read_answer, response_headers, upstream_url
from proxy.wire.codec import Codec
from proxy.wire.usage import Usage

SSE = "text/event-stream"


async def turn(st: ProxyState, inbound: Inbound, wire: Codec) -> Answer:
    """One turn of `wire`'s API: the provider's answer to the request as the route rewrites it."""
    return await _traced(st, inbound, wire, "turn", _turn)


async def count(st: ProxyState, inbound: Inbound, wire: Codec) -> Answer:
    """A token count (Messages' count_tokens, Gemini's countTokens; `wire`: its codec): the provider's count of
    what the turn would send (`count_tokens: raw`: of what the client sent)."""
    return await _traced(st, inbound, wire, "count_tokens", _count)


async def _traced(st: ProxyState, inbound: Inbound, wire: Codec, operation: str,
                  steps: Callable[[ProxyState, Inbound, Codec, Flow], Awaitable[Answer]]) -> Answer:
    kind = "count" if operation == "count_tokens" else "turn"
    if not st.tracing.on:
        return await steps(st, inbound, wire, start(st, inbound, wire, kind))
    trace = st.tracing.request(inbound.method, inbound.path, inbound.headers, wire.dialect.name,
                               transport=inbound.transport, operation=operation)
    with trace.activate():  # the request's span is its stages' parent; it ends with the request (its flow's end)
        return await steps(st, inbound, wire, start(st, inbound, wire, kind, trace))


async def _turn(st: ProxyState, inbound: Inbound, wire: Codec, flow: Flow) -> Answer:
    try:
        conv = await parse(inbound, wire, flow)
        ctx = await context(st, inbound, conv, flow)
        conv = await shape(st.pipelines[ctx.route.name], conv, ctx)
        sent = await send_upstream(st, conv, ctx, flow)
    except ProxyError as err:
        return failed(flow, err)
    loop = response_loop(st.pipelines[sent.ctx.route.name], sent.conv, sent.ctx, sent.send, sent.url)
    flow.rounds = loop
    if sent.resp.headers.get("content-type", "").startswith(SSE):
        flow.answered(sent.resp.status_code)
        return _streamed(sent, flow, wire, loop)
    return await _whole(sent, flow, wire, loop)


def _streamed(sent: Sent, flow: Flow, wire: Codec, loop: ReadLoop | None) -> Answer:
    """Relayed event by event as it arrives; however the stream ends, the flow ends once with how."""
    resp = sent.resp
    chunks = iter_raw(resp, sent.url) if loop is None else loop.stream(resp)
    if flow.trace.on:
        chunks = flow.trace.within(chunks)

    def on_usage(usage: Usage) -> None:
        flow.usage = usage

    async def relay() -> AsyncIterator[bytes]:
        end = StreamEnd(resp.status_code)
        size = 0
        try:
            watched = wire.watch_stream(chunks, on_usage, sent.conv.usage_hidden)
            async for chunk in stream_events(watched, end, flow, wire):
                size += len(chunk)
                yield chunk
        finally:
            flow.end(end.status, end.error, bytes_out=size)

    return Answer(resp.status_code, response_headers(resp.headers, decoded=True), flow.headers, chunks=relay())


async def _whole(sent: Sent, flow: Flow, wire: Codec, loop: ReadLoop | None) -> Answer:
    """Read whole (the hidden rounds answered first), then answered with its usage accounted once it is sent."""
    resp = sent.resp
    try:
        if loop is None:
            content = await read_answer(resp, sent.url)
        else:
            resp, content = await loop.complete(resp)
            flow.headers["x-ctxproxy-read-rounds"] = str(loop.done)
    except ProxyError as err:
        flow.answered(sent.resp.status_code)
        return failed(flow, err)
    status = resp.status_code
    flow.answered(status)

    def account() -> None:  # after the body is sent: the client does not wait for the record and the log line
        try:
            if status == 200:
                flow.usage = wire.usage_of_reply(content)
        finally:
            flow.end(status, bytes_out=len(content))

    return Answer(status, response_headers(resp.headers, decoded=True), flow.headers, content, then=account)


async def _count(st: ProxyState, inbound: Inbound, wire: Codec, flow: Flow) -> Answer:
    try:
        conv = await parse(inbound, wire, flow)
        ctx = await context(st, inbound, conv, flow)
        if ctx.route.count_tokens == "rewritten":
            conv = await shape(st.pipelines[ctx.route.name], conv, ctx, "count")
        url = upstream_url(ctx.route.upstream, wire.upstream_path(ctx.model, False), ctx.upstream_query)
        payload = await conv.rendered()
        resp = await provider_call(st, flow.trace, "count_tokens", "POST", url, ctx.upstream_headers, payload,
                                   ctx.route.upstream, ctx.model)
        content = await read_answer(resp, url)
    except ProxyError as err:
        return failed(flow, err)
    flow.headers["x-ctxproxy-count-tokens"] = ctx.route.count_tokens
    for e in conv.kinds(Degraded):  # counted on the client's own request: say why, as on /v1/messages
        flow.headers["x-ctxproxy-degraded"] = e.header
    flow.end(resp.status_code, rewritten=conv.changed)
    return Answer(resp.status_code, response_headers(resp.headers, decoded=True), flow.headers, content)
