"""The steps of the request path that are not the pipeline: parsing, route/session, the request's log line.

`Inbound` is a request as any transport hands it over (an HTTP request, one
turn of a WebSocket), `Answer` what the engine gives back for it to frame: the
engine never sees Starlette. `RequestRun` carries what every step adds to (its
id, its clock, the headers the client gets, the fields of its one log line) and ends the request exactly
once: `finish` writes the log line, `failed` turns a ProxyError into the
client's error response (accounting a request that reached the upstream).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from proxy import loop_free
from proxy.accounting.ledger import Outcome
from proxy.accounting.own_calls import RequestOwnCalls
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
class Known:
    """What the engine learned of a request, for counting its answer where no ledger does (proxy/http/answers.py)."""

    kind: str = "other"  # turn | count | passthrough | other (a path the proxy does not serve)
    route: str | None = None
    model: str | None = None
    tenant: str | None = None
    session: str | None = None
    error: str | None = None  # the proxy's error code, when it refused
    request_id: str | None = None
    accounted: bool = False  # a ledger records this request: not counted here


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


@dataclass
class RequestRun:
    request_id: str
    t0: float
    log: dict[str, object]
    headers: dict[str, str]
    wire: Codec  # the client's API: its errors take that shape
    t_sent: float = 0.0  # when the rewritten request went upstream (0: it never did)
    ctx: RequestContext | None = None
    conv: Conversation | None = field(default=None, repr=False)
    known: Known = field(default_factory=Known)  # what counts the answer when no ledger does (proxy/http/answers.py)
    trace: RequestTrace = NO_TRACE  # its spans (proxy/telemetry/), ended with its log line

    @classmethod
    def start(cls, inbound: Inbound, wire: Codec, kind: str = "turn") -> RequestRun:
        """`kind`: turn, or count (count_tokens: rewritten as a turn would be, never a turn itself)."""
        rid = new_request_id()
        log: dict[str, object] = {"request_id": rid, "path": inbound.path}
        if inbound.transport != "http":  # a turn of a WebSocket (proxy/http/ws_turn.py)
            log["transport"] = inbound.transport
        k = inbound.known
        k.kind, k.request_id = kind, rid
        return cls(rid, time.perf_counter(), log, {"x-ctxproxy-request-id": rid}, wire, known=k)

    def finish(self, fields: dict[str, object], **more: object) -> None:
        """The request's one log line."""
        error = more.get("error")
        if isinstance(error, str):
            self.known.error = error
        self.log.update(fields)
        self.log.update({k: v for k, v in more.items() if v is not None})
        self.log["total_ms"] = round((time.perf_counter() - self.t0) * 1000, 3)
        request_event(self.log)
        if self.trace.on:
            status, error = more.get("status"), more.get("error")
            self.trace.end(status if isinstance(status, int) else None, error if isinstance(error, str) else None)

    async def failed(self, st: ProxyState, err: ProxyError) -> Answer:
        """The client's error; a request that reached the upstream step is accounted as one failed request."""
        fields: dict[str, object] = {}
        if self.ctx is not None and self.conv is not None and self.t_sent:
            outcome = Outcome(overhead_s=self.t_sent - self.t0, own=list(self.ctx.own_calls.made))
            ledger = await st.accounting.open(self.ctx, self.conv, outcome)
            self.known.accounted = True
            if self.trace.on:
                self.trace.opened(ledger)
            fields = ledger.close(err.status, err.code)
        self.finish(fields, status=err.status, error=err.code)
        return refusal(err, self.wire, self.headers)


async def parse(inbound: Inbound, wire: Codec, run: RequestRun) -> Conversation:
    """The body, bounded and checked, as the API-neutral conversation (a 4xx for anything malformed).
    A body refused for its content, not for being unreadable JSON, is still counted under its model."""
    raw = await inbound.read()
    try:
        return await loop_free.parse(raw, wire)
    except ProxyError as err:
        if err.code != "invalid_json":
            run.known.model = model_in(raw)
        raise


def model_in(raw: bytes) -> str | None:
    """The `model` of a JSON body, if it names one (for counting a request the proxy refused)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


async def context(st: ProxyState, inbound: Inbound, conv: Conversation, run: RequestRun) -> RequestContext:
    """Route, tenant, session and window; then the rest of parsing (only items new to the session)."""
    k = run.known
    k.model = conv.model
    try:
        ctx, opening = await _context(st, inbound, conv, run.request_id, run.trace)
    except Exception:
        await loop_free.check(conv)  # a bad body is reported first, as it always has been
        raise
    known = st.memo.recall(ctx.tenant, ctx.session, conv)
    if opening:  # derived from the opening alone: another conversation with that opening is a branch of its own
        await conv.prepare_digests()
        branch = await st.accounting.branch(ctx.tenant, ctx.session, ctx.model, conv.digests(conv.client_messages))
        if branch != ctx.session:
            ctx = dataclasses.replace(ctx, session=branch)
    k.route, k.tenant, k.session = ctx.route.name, ctx.tenant, ctx.session
    # from here a refusal is in the session's timeline: its answer names the session as a turn's does
    run.headers.update({"x-ctxproxy-route": ctx.route.name, "x-ctxproxy-session": ctx.session})
    await loop_free.check(conv, known)
    run.ctx, run.conv = ctx, conv
    run.log.update(route=ctx.route.name, model=ctx.model, session=ctx.session, tenant=ctx.tenant, stream=ctx.stream,
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


async def stream_events(chunks: AsyncIterator[bytes], end: StreamEnd, run: RequestRun,
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
                run.log["ttfb_ms"] = round((first - run.t0) * 1000, 3)
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
        logger.error("unexpected error in a stream", exc_info=exc, extra={"fields": {"request_id": run.request_id}})
        end.status, end.error = 500, "internal_error"
        yield wire.stream_error(ProxyError("internal proxy error; see the proxy log"), last)
