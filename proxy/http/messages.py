"""POST /v1/messages (Anthropic's Messages API, Claude Code's) and its count_tokens.

/v1/messages is the request path (proxy/http/handler.py) with the Messages
codec. count_tokens answers, by default, for what the proxy would send: the
request rewritten by the route's transforms (the status bar aside: counting
is not a turn), so a client that compacts itself near its limit sees the room
the proxy made. A route with `count_tokens: raw` passes the client's request
through instead. GET /v1/models and the rest pass through
(proxy/http/passthrough.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy import loop_free
from proxy.errors import ProxyError
from proxy.http.handler import handle
from proxy.http.relay import error_response, query_of, read_body, relay_response
from proxy.http.request_run import RequestRun, context
from proxy.http.send import provider_call
from proxy.rewrite.events import Degraded
from proxy.rewrite.pipeline import shape
from proxy.state import ProxyState, state_of
from proxy.upstream.client import read_answer, response_headers, upstream_url
from proxy.wire.codec import Body
from proxy.wire.messages.codec import MESSAGES, Messages

COUNT_PATH = "messages/count_tokens"


class _Counting(Messages):
    """count_tokens' codec: its body has no max_tokens, and every parse of it says so.

    Not only the first: a transform that fails, or a store that is down, has the
    pipeline parse the client's bytes again to forward them unmodified
    (proxy/rewrite/degrade.py), and that parse must not ask for max_tokens.
    """

    def parse(self, raw: bytes) -> Body:
        return self.parse_as(raw, need_max_tokens=False)


COUNTING = _Counting()


async def messages(request: Request) -> Response:
    return await handle(request, MESSAGES)


async def count_tokens(request: Request) -> Response:
    st, run = state_of(request), RequestRun.start(request, MESSAGES, kind="count")
    if not st.tracing.on:
        return await _count_tokens(st, request, run)
    run.trace = st.tracing.request(request.method, request.scope["path"], request.headers.items(), MESSAGES.family,
                                   operation="count_tokens")
    with run.trace.activate():  # it ends with the request's log line (run.finish)
        return await _count_tokens(st, request, run)


async def _count_tokens(st: ProxyState, request: Request, run: RequestRun) -> Response:
    try:
        raw = await read_body(request, st.settings.server)
        conv = await loop_free.parse(raw, COUNTING)
        ctx = await context(st, request, conv, run)
        if ctx.route.count_tokens == "rewritten":
            conv = await shape(st.pipelines[ctx.route.name], conv, ctx, "count")
        url = upstream_url(ctx.route.upstream, COUNT_PATH, query_of(request))
        payload = await loop_free.to_bytes(conv)
        resp = await provider_call(st, run.trace, "count_tokens", "POST", url, ctx.upstream_headers, payload,
                                   ctx.route.upstream, ctx.model)
        content = await read_answer(resp, url)
    except ProxyError as err:
        run.finish({}, status=err.status, error=err.code)
        return error_response(err, MESSAGES, run.headers)
    run.headers["x-ctxproxy-count-tokens"] = ctx.route.count_tokens
    for e in conv.kinds(Degraded):  # counted on the client's own request: say why, as on /v1/messages
        run.headers["x-ctxproxy-degraded"] = e.header
    run.finish({}, status=resp.status_code, rewritten=conv.changed)
    return relay_response(content, resp.status_code, response_headers(resp.headers, decoded=True), run.headers)
