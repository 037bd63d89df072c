"""The steps of the request path that are not the pipeline: parsing, route/session, the request's log line.

`RequestRun` carries what every step adds to (its id, its clock, the headers
the client gets, the fields of its one log line) and ends the request exactly
once: `finish` writes the log line, `failed` turns a ProxyError into the
client's error response (accounting a request that reached the upstream).
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy import loop_free
from proxy.accounting.ledger import Outcome
from proxy.accounting.own_calls import RequestOwnCalls
from proxy.errors import ProxyError, UpstreamUnreachable
from proxy.http.answers import Known, known
from proxy.http.local_guard import INJECTS_KEY, require_proxy_host
from proxy.http.relay import error_response, read_body
from proxy.http.routing import api_key_of, resolve_route, session_id, tenant_id
from proxy.logs import log as logger
from proxy.logs import request_event
from proxy.request import Conversation, RequestContext
from proxy.state import ProxyState
from proxy.telemetry import NO_TRACE, RequestTrace
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
class RequestRun:
    request_id: str
    t0: float
    log: dict[str, object]
    headers: dict[str, str]
    t_sent: float = 0.0  # when the rewritten request went upstream (0: it never did)
    ctx: RequestContext | None = None
    conv: Conversation | None = field(default=None, repr=False)
    wire: Codec | None = None  # the client's API: its errors take that shape
    known: Known = field(default_factory=Known)  # what counts the answer when no ledger does (proxy/http/answers.py)
    trace: RequestTrace = NO_TRACE  # its spans (proxy/telemetry/), ended with its log line

    @classmethod
    def start(cls, request: Request, wire: Codec, kind: str = "turn") -> RequestRun:
        """`kind`: turn, or count (count_tokens: rewritten as a turn would be, never a turn itself)."""
        rid = new_request_id()
        log: dict[str, object] = {"request_id": rid, "path": request.scope["path"]}
        if "ctxproxy.transport" in request.scope:  # a turn of a WebSocket (proxy/http/ws_turn.py)
            log["transport"] = request.scope["ctxproxy.transport"]
        k = known(request.scope)
        k.kind, k.request_id = kind, rid
        return cls(rid, time.perf_counter(), log, {"x-ctxproxy-request-id": rid}, wire=wire, known=k)

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

    async def failed(self, st: ProxyState, err: ProxyError) -> Response:
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
        return error_response(err, self.wire, self.headers)


async def parse(st: ProxyState, request: Request, wire: Codec, run: RequestRun) -> Conversation:
    """The body, bounded and checked, as the API-neutral conversation (a 4xx for anything malformed).
    A body refused for its content, not for being unreadable JSON, is still counted under its model."""
    raw = await read_body(request, st.settings.server)
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


async def context(st: ProxyState, request: Request, conv: Conversation, run: RequestRun) -> RequestContext:
    """Route, tenant, session and window; then the rest of parsing (only items new to the session)."""
    k = run.known
    k.model = conv.model
    try:
        ctx = await _context(st, request, conv, run.request_id, run.trace)
    except Exception:
        await loop_free.check(conv)  # a bad body is reported first, as it always has been
        raise
    k.route, k.tenant, k.session = ctx.route.name, ctx.tenant, ctx.session
    # from here a refusal is in the session's timeline: its answer names the session as a turn's does
    run.headers.update({"x-ctxproxy-route": ctx.route.name, "x-ctxproxy-session": ctx.session})
    await loop_free.check(conv, st.memo.recall(ctx.tenant, ctx.session, conv))
    run.ctx, run.conv = ctx, conv
    run.log.update(route=ctx.route.name, model=ctx.model, session=ctx.session, tenant=ctx.tenant, stream=ctx.stream,
                   messages=len(conv.messages), bytes_in=len(conv.raw))
    return ctx


async def _context(st: ProxyState, request: Request, conv: Conversation, request_id: str,
                   trace: RequestTrace) -> RequestContext:
    """The headers are read into a dict once (the first value of a repeated name, as Headers.get gives): each
    lookup on Starlette's Headers walks and compares its whole raw list, and this makes a handful."""
    model = conv.model
    items = request.headers.items()
    headers = dict(reversed(items))
    route = resolve_route(st.settings, request.path_params.get("route"), headers, model, conv.wire.family)
    if route.upstream.api_key_env:
        require_proxy_host(headers, st.settings.server, INJECTS_KEY)
    tenant = tenant_id(api_key_of(headers), st.settings.tenant_salt)
    window = context_window(st.settings, model, route.context_window)
    learned = await st.windows.get(tenant, route.name, model)
    return RequestContext(request_id=request_id, route=route, tenant=tenant,
                          session=session_id(headers, tenant, route, conv), model=model,
                          stream=conv.wire.is_stream(conv.body), store=st.store,
                          archive_quota=st.settings.store_quota_bytes,
                          window=min(window, learned or window), upstream=st.upstream,
                          upstream_headers=request_headers(items, route.upstream, identity_encoding=True),
                          own_calls=RequestOwnCalls(st.accounting.own_call), trace=trace,
                          shared=st.accounting.shared)


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
