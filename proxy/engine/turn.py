"""The turn engine: one request of an API with a codec, top to bottom, for any transport.

parse → route/session → shape → send (overflow retry) → read-back rounds → answer.
Each step is a call into its own module; `turn` only sequences them, and
answers an `Answer` (proxy/engine/run.py) that a transport frames: the HTTP
handlers as a response (JSON or SSE), the Responses WebSocket as frames. The
accountant is asked once per request (`open`), and its ledger closed once.
`count` is a turn that stops before the send: count_tokens answers for exactly
what the turn would send (the route's transforms but the status bar, which is
no part of a count). Traced (proxy/telemetry/), the request is one SERVER span
current while the steps run, ended with the request's log line (a stream's:
when it has ended).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable

from proxy import loop_free
from proxy.accounting.ledger import Ledger, Outcome
from proxy.accounting.report import event_fields
from proxy.engine.run import Answer, Inbound, RequestRun, StreamEnd, context, parse, refusal, stream_events
from proxy.engine.send import Sent, provider_call, send_upstream
from proxy.errors import ProxyError
from proxy.request import Conversation, RequestContext
from proxy.request.events import Degraded
from proxy.rewrite.context_read.loop import ReadLoop
from proxy.rewrite.pipeline import response_loop, shape
from proxy.state import ProxyState
from proxy.upstream.client import iter_raw, read_answer, response_headers, upstream_url
from proxy.wire.codec import Codec
from proxy.wire.usage import Usage

SSE = "text/event-stream"


async def turn(st: ProxyState, inbound: Inbound, wire: Codec) -> Answer:
    """One turn of `wire`'s API: the provider's answer to the request as the route rewrites it."""
    run = RequestRun.start(inbound, wire)
    return await _traced(st, inbound, run, "turn", functools.partial(_turn, st, inbound, wire, run))


async def count(st: ProxyState, inbound: Inbound, wire: Codec) -> Answer:
    """A token count (Messages' count_tokens, Gemini's countTokens; `wire`: its codec): the provider's count of
    what the turn would send (`count_tokens: raw`: of what the client sent)."""
    run = RequestRun.start(inbound, wire, kind="count")
    return await _traced(st, inbound, run, "count_tokens", functools.partial(_count, st, inbound, wire, run))


async def _traced(st: ProxyState, inbound: Inbound, run: RequestRun, operation: str,
                  steps: Callable[[], Awaitable[Answer]]) -> Answer:
    if not st.tracing.on:
        return await steps()
    run.trace = st.tracing.request(inbound.method, inbound.path, inbound.headers, run.wire.dialect.name,
                                   transport=inbound.transport, operation=operation)
    with run.trace.activate():  # the request's span is its stages' parent; it ends with the request (finish)
        return await steps()


async def _turn(st: ProxyState, inbound: Inbound, wire: Codec, run: RequestRun) -> Answer:
    try:
        conv = await parse(inbound, wire, run)
        ctx = await context(st, inbound, conv, run)
        conv = await shape(st.pipelines[ctx.route.name], conv, ctx)
        sent = await send_upstream(st, conv, ctx, run, functools.partial(_opened, st, run))
    except ProxyError as err:
        return await run.failed(st, err)
    ledger = sent.early or await _opened(st, run, sent.conv, sent.ctx)
    outcome = ledger.outcome
    outcome.upstream_s, outcome.accepted = sent.answered - run.t_sent, sent.resp.status_code < 300
    run.known.accounted = True  # closed once, however the request ends
    if run.trace.on:
        run.trace.opened(ledger)
    run.headers.update(ledger.headers())
    run.log.update(rewritten=sent.conv.changed, overhead_ms=round(outcome.overhead_s * 1000, 3),
                   upstream_headers_ms=round(outcome.upstream_s * 1000, 3), **event_fields(sent.conv))
    loop = response_loop(st.pipelines[sent.ctx.route.name], sent.conv, sent.ctx, sent.send, sent.url)
    ledger.rounds = loop
    if sent.resp.headers.get("content-type", "").startswith(SSE):
        return _streamed(sent, ledger, run, wire, loop)
    return await _whole(sent, ledger, run, wire, loop)


async def _opened(st: ProxyState, run: RequestRun, conv: Conversation, ctx: RequestContext) -> Ledger:
    """The request as sent remembered for the session's next turn and its ledger opened: done while the provider
    answers (proxy/engine/send.py), it adds nothing to the client's wait."""
    await st.memo.remember(ctx.tenant, ctx.session, conv)
    return await st.accounting.open(ctx, conv, Outcome(overhead_s=run.t_sent - run.t0, own=list(ctx.own_calls.made)))


def _streamed(sent: Sent, ledger: Ledger, run: RequestRun, wire: Codec, loop: ReadLoop | None) -> Answer:
    """Relayed event by event as it arrives; however the stream ends, the ledger is closed once with how."""
    resp = sent.resp
    chunks = iter_raw(resp, sent.url) if loop is None else loop.stream(resp)
    if run.trace.on:
        chunks = run.trace.within(chunks)

    def on_usage(usage: Usage) -> None:
        ledger.outcome.usage = usage

    async def relay() -> AsyncIterator[bytes]:
        end = StreamEnd(resp.status_code)
        size = 0
        try:
            watched = wire.watch_stream(chunks, on_usage, sent.conv.usage_hidden)
            async for chunk in stream_events(watched, end, run, wire):
                size += len(chunk)
                yield chunk
        finally:
            run.finish(ledger.close(end.status, end.error), status=end.status, error=end.error, bytes_out=size)

    return Answer(resp.status_code, response_headers(resp.headers, decoded=True), run.headers, chunks=relay())


async def _whole(sent: Sent, ledger: Ledger, run: RequestRun, wire: Codec, loop: ReadLoop | None) -> Answer:
    """Read whole (the hidden rounds answered first), then answered with its usage accounted once it is sent."""
    resp = sent.resp
    try:
        if loop is None:
            content = await read_answer(resp, sent.url)
        else:
            resp, content = await loop.complete(resp)
            run.headers["x-ctxproxy-read-rounds"] = str(loop.done)
            cacheable = ledger.cacheable(resp.status_code)
            if loop.done and cacheable is not None:  # the hidden calls' too, as the usage the client gets
                run.headers["x-ctxproxy-cacheable-tokens"] = str(cacheable)
    except ProxyError as err:
        run.finish(ledger.close(err.status, err.code), status=err.status, error=err.code)
        return refusal(err, wire, run.headers)
    status = resp.status_code

    def account() -> None:  # after the body is sent: the client does not wait for the record and the log line
        try:
            if status == 200:
                ledger.outcome.usage = wire.usage_of_reply(content)
        finally:
            run.finish(ledger.close(status), status=status, bytes_out=len(content))

    return Answer(status, response_headers(resp.headers, decoded=True), run.headers, content, then=account)


async def _count(st: ProxyState, inbound: Inbound, wire: Codec, run: RequestRun) -> Answer:
    try:
        conv = await parse(inbound, wire, run)
        ctx = await context(st, inbound, conv, run)
        if ctx.route.count_tokens == "rewritten":
            conv = await shape(st.pipelines[ctx.route.name], conv, ctx, "count")
        url = upstream_url(ctx.route.upstream, wire.upstream_path(ctx.model, False), ctx.upstream_query)
        payload = await loop_free.to_bytes(conv)
        resp = await provider_call(st, run.trace, "count_tokens", "POST", url, ctx.upstream_headers, payload,
                                   ctx.route.upstream, ctx.model)
        content = await read_answer(resp, url)
    except ProxyError as err:
        run.finish({}, status=err.status, error=err.code)
        return refusal(err, wire, run.headers)
    run.headers["x-ctxproxy-count-tokens"] = ctx.route.count_tokens
    for e in conv.kinds(Degraded):  # counted on the client's own request: say why, as on /v1/messages
        run.headers["x-ctxproxy-degraded"] = e.header
    run.finish({}, status=resp.status_code, rewritten=conv.changed)
    return Answer(resp.status_code, response_headers(resp.headers, decoded=True), run.headers, content)
