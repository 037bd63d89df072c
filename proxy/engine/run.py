"""The steps of the request path that are not the pipeline: parsing, route/session, the request's log line.

`Inbound` is a request as any transport hands it over (an HTTP request, one
turn of a WebSocket), `Answer` what the engine gives back for it to frame: the
engine never sees Starlette. A request's `Flow` (proxy/request/flow.py, made by
`start`) carries what every step adds to and is watched by accounting, tracing
and the log line (`LogLine`); `failed` turns a ProxyError into the client's
error response, ending the flow with it.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from proxy.accounting.observer import Accounted
from proxy.accounting.own_calls import RequestOwnCalls
from proxy.accounting.report import event_fields
from proxy.engine.routing import (
    INJECTS_KEY,
    api_key_of,
    forwarded_query,
    injected_key,
    query_key,
    request_class,
    require_proxy_host,
    resolve_route,
    session_id,
    tenant_id,
)
from proxy.errors import ProxyError, RequestTimeout, UpstreamUnreachable
from proxy.logs import log as logger
from proxy.logs import request_event
from proxy.request import Conversation, RequestContext
from proxy.request.flow import Flow, Known, Observer
from proxy.state import ProxyState
from proxy.telemetry.base import NO_TRACE, RequestTrace
from proxy.upstream.client import request_headers
from proxy.upstream.windows import context_window
from proxy.wire.codec import Codec
from proxy.wire.sse import StreamCutShort

_ids = random.Random()  # seeded from os.urandom once: a request id must be unique, not secret


def new_request_id() -> str:
    """`req_` and 16 hex digits, as random as secrets.token_hex(8) for telling requests apart, without its
    system call per request (an id is no credential: nothing is authorized by knowing one)."""
    return f"req_{_ids.getrandbits(64):016x}"


@dataclass
class Inbound:
    """A request as a transport hands it to the engine: where it was sent, its headers (lower-case names, in order),
    the route its path names, and how to read its body (bounded, decoded: the transport's business)."""

    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    route: str | None
    read: Callable[[], Awaitable[bytes]]
    transport: str = "http"  # or "websocket": one turn of a socket
    known: Known = field(default_factory=Known)

    def header_map(self) -> dict[str, str]:
        """The headers by name, the first value of a repeated name winning (as Starlette's Headers.get)."""
        return dict(reversed(self.headers))


@dataclass
class Answer:
    """What the engine answers, for a transport to frame: a status, the provider's headers (raw, as
    proxy/upstream/client.py response_headers gives them) and the proxy's own, then either the whole body
    (`then`: called once it is sent, however that went) or its events as they arrive (`chunks`: whole SSE events)."""

    status: int
    upstream_headers: list[tuple[bytes, bytes]]
    headers: dict[str, str]
    content: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    then: Callable[[], None] | None = None


def refusal(err: ProxyError, wire: Codec, headers: dict[str, str] | None = None) -> Answer:
    """The proxy's own error as an answer, in the shape of the API the client speaks."""
    own = dict(headers or {})
    if isinstance(err, RequestTimeout):  # the rest of the request may still trickle in: not worth reading
        own["connection"] = "close"
    return Answer(err.status, [(b"content-type", b"application/json")], own, wire.error_body(err))


def start(st: ProxyState, inbound: Inbound, wire: Codec, kind: str = "turn", trace: RequestTrace = NO_TRACE) -> Flow:
    """A request's flow, watched by accounting, its trace (when tracing is on) and its log line, in that order: each
    reads what the one before it added. `kind`: turn, count (count_tokens), passthrough, compress, retrieve."""
    rid = new_request_id()
    log: dict[str, object] = {"request_id": rid, "path": inbound.path}
    if inbound.transport != "http":  # a turn of a WebSocket (proxy/http/ws_turn.py)
        log["transport"] = inbound.transport
    k = inbound.known
    k.kind, k.request_id = kind, rid
    observers: list[Observer] = [Accounted(st.accounting), trace, LOG_LINE] if trace.on \
        else [Accounted(st.accounting), LOG_LINE]
    return Flow(rid, time.perf_counter(), log, {"x-ctxproxy-request-id": rid}, k, wire, observers, trace)


class LogLine:
    """The request's one log line, written when it ends, with what accounting added to it."""

    async def sent(self, flow: Flow) -> None:
        pass

    def answered(self, flow: Flow) -> None:
        conv = flow.conv
        if conv is not None:
            flow.log.update(rewritten=conv.changed, overhead_ms=round((flow.t_sent - flow.t0) * 1000, 3),
                            upstream_headers_ms=round(max(0.0, flow.t_answered - flow.t_sent) * 1000, 3),
                            **event_fields(conv))

    def ended(self, flow: Flow) -> None:
        flow.log["status"] = flow.status
        if flow.error is not None:
            flow.log["error"] = flow.error
        flow.log["total_ms"] = round((time.perf_counter() - flow.t0) * 1000, 3)
        request_event(flow.log)


LOG_LINE = LogLine()


def failed(flow: Flow, err: ProxyError) -> Answer:
    """The client's error, in its API's shape; the request ends with it (accounted as one failed request when
    it had been sent upstream)."""
    flow.end(err.status, err.code)
    return refusal(err, flow.wire, flow.headers)


async def parse(inbound: Inbound, wire: Codec, flow: Flow) -> Conversation:
    """The body, bounded and checked, as the API-neutral conversation (a 4xx for anything malformed).
    A body refused for its content, not for being unreadable JSON, is still counted under its model."""
    raw = await inbound.read()
    try:
        return await Conversation.read(raw, wire)
    except ProxyError as err:
        if err.code != "invalid_json":
            flow.known.model = model_in(raw)
        raise


def model_in(raw: bytes) -> str | None:
    """The `model` of a JSON body, if it names one (for counting a request the proxy refused)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


async def context(st: ProxyState, inbound: Inbound, conv: Conversation, flow: Flow) -> RequestContext:
    """Route, tenant, session and window; then the rest of parsing (only items new to the session)."""
    k = flow.known
    k.model = conv.model
    try:
        ctx, opening = await _context(st, inbound, conv, flow.request_id, flow.trace)
    except Exception:
        await conv.check()  # a bad body is reported first, as it always has been
        raise
    known = st.memo.recall(ctx.tenant, ctx.session, conv)
    if opening:  # derived from the opening alone: another conversation with that opening is a branch of its own
        await conv.prepare_digests()
        branch = await st.accounting.branch(ctx.tenant, ctx.session, ctx.model, conv.digests(conv.client_messages))
        if branch != ctx.session:
            ctx = dataclasses.replace(ctx, session=branch)
    k.route, k.tenant, k.session = ctx.route.name, ctx.tenant, ctx.session
    # from here a refusal is in the session's timeline: its answer names the session as a turn's does
    flow.headers.update({"x-ctxproxy-route": ctx.route.name, "x-ctxproxy-session": ctx.session})
    await conv.check(known)
    flow.log.update(route=ctx.route.name, model=ctx.model, session=ctx.session, tenant=ctx.tenant, stream=ctx.stream,
                   messages=len(conv.messages), bytes_in=len(conv.raw))
    return ctx


async def _context(st: ProxyState, inbound: Inbound, conv: Conversation, request_id: str,
                   trace: RequestTrace) -> tuple[RequestContext, bool]:
    """The context, and whether its session was derived from the opening (routing.session_id). The headers are
    read into a dict once (the first value of a repeated name wins)."""
    model = conv.model
    items = inbound.headers
    headers = inbound.header_map()
    route = resolve_route(st.settings, inbound.route, headers, model, conv.wire.dialect.name)
    if route.upstream.api_key_env:
        require_proxy_host(headers, st.settings.server, INJECTS_KEY)
    key = query_key(inbound.query, conv.wire.dialect.key_query)
    tenant = tenant_id(api_key_of(headers, key), st.settings.tenant_salt)
    window = context_window(st.settings, model, route.context_window)
    learned = await st.windows.get(tenant, route.name, model)
    session, opening = session_id(headers, tenant, route, conv)
    return RequestContext(request_id=request_id, route=route, tenant=tenant, session=session, model=model,
                          stream=conv.wire.is_stream(conv.body), store=st.store, fallback=st.fallback,
                          upstream_query=forwarded_query(inbound.query, route, conv.wire.dialect.key_query),
                          archive_quota=st.settings.store_quota_bytes,
                          window=min(window, learned or window), upstream=st.upstream,
                          upstream_headers=request_headers(items, injected_key(route), identity_encoding=True),
                          own_calls=RequestOwnCalls(st.accounting.own_call), trace=trace,
                          shared=st.accounting.shared,
                          client_compacts=request_class(headers) == "compaction"
                          or conv.wire.client_compacts(conv.body)), opening


@dataclass
class StreamEnd:
    """How a relayed stream ended: the status it is accounted with and the error code, if it broke."""

    status: int
    error: str | None = None


async def stream_events(chunks: AsyncIterator[bytes], end: StreamEnd, flow: Flow,
                        wire: Codec) -> AsyncIterator[bytes]:
    """Chunks as they arrive; a broken stream ends with one error event (and `end` says why), never a hang.

    The chunks are whole events but for the provider's last bytes. When those are an unterminated event
    and the stream then breaks, they are dropped: SSE never dispatches an event the stream ended inside,
    and glued to the front of the error event they would make that one unreadable too.
    """
    first: float | None = None
    tail = b""  # an unterminated event, held until something follows it
    last = b""  # the last chunk given (a numbered stream's next number is read there)
    try:
        async for chunk in chunks:
            if first is None:
                first = time.perf_counter()
                flow.log["ttfb_ms"] = round((first - flow.t0) * 1000, 3)
            if tail or not chunk.endswith(b"\n\n"):
                chunk = tail + chunk
                cut = chunk.rfind(b"\n\n") + 2  # 1: no event ends in it
                chunk, tail = (chunk[:cut], chunk[cut:]) if cut > 1 else (b"", chunk)
            if chunk:
                last = chunk
                yield chunk
        if tail:
            yield tail
    except ProxyError as err:
        end.status, end.error = err.status, err.code
        yield wire.stream_error(err, last)
    except StreamCutShort as cut:
        cut_err = UpstreamUnreachable(f"upstream stream ended early: {cut}", code="upstream_stream_cut")
        end.status, end.error = cut_err.status, cut_err.code
        yield wire.stream_error(cut_err, last)
    except Exception as exc:  # a proxy bug: the headers are out, so say it in the stream rather than cut it
        logger.error("unexpected error in a stream", exc_info=exc, extra={"fields": {"request_id": flow.request_id}})
        end.status, end.error = 500, "internal_error"
        yield wire.stream_error(ProxyError("internal proxy error; see the proxy log"), last)
