"""Every other /v1/* request, forwarded unchanged: method, query, body, status, headers, streams.

The proxy manages chat context; for models, embeddings, responses, files and
whatever a provider adds next it is a transparent pipe with the route's
upstream and credentials. The transport reads the body as sent (its
Content-Encoding kept) and frames the answer (proxy/http/turns.py).
"""

from __future__ import annotations

import time

from proxy.engine.routing import INJECTS_KEY, forwarded_query, injected_key, require_proxy_host, resolve_route
from proxy.engine.run import Answer, Inbound, failed, model_in, start
from proxy.engine.send import provider_call
from proxy.errors import ProxyError
from proxy.request.flow import Flow
from proxy.state import ProxyState
from proxy.upstream.client import iter_raw, request_headers, response_headers, upstream_url
from proxy.wire.codec import Codec
from proxy.wire.dialects import OPENAI

# Bodies at most this large with a declared length are relayed in one piece
# (keeping Content-Length); anything else streams.
_BUFFER_LIMIT = 1024 * 1024


def _model_of(body: bytes, content_type: str) -> str | None:
    return model_in(body) if body and "json" in content_type else None


async def passthrough(st: ProxyState, inbound: Inbound, wire: Codec, upstream_path: str) -> Answer:
    """`inbound` forwarded to `upstream_path` below the route's upstream; `wire`: the API whose shape its
    errors take."""
    if not st.tracing.on:
        return await _passthrough(st, inbound, wire, upstream_path, start(st, inbound, wire, "passthrough"))
    trace = st.tracing.request(inbound.method, inbound.path, inbound.headers, wire.dialect.name,
                               operation="passthrough")
    with trace.activate():  # it ends with the request's log line
        return await _passthrough(st, inbound, wire, upstream_path, start(st, inbound, wire, "passthrough", trace))


async def _passthrough(st: ProxyState, inbound: Inbound, wire: Codec, upstream_path: str, flow: Flow) -> Answer:
    k = flow.known  # its answer is counted as it starts (proxy/http/answers.py)
    flow.log["method"] = inbound.method
    headers = inbound.header_map()
    try:
        body = await inbound.read()
        k.model = _model_of(body, headers.get("content-type", ""))
        route = resolve_route(st.settings, inbound.route, headers, k.model,
                              None if wire.dialect is OPENAI else wire.dialect.name)  # OpenAI's: the guess
        flow.log["route"] = k.route = route.name
        if route.upstream.api_key_env:
            require_proxy_host(headers, st.settings.server, INJECTS_KEY)
        url = upstream_url(route.upstream, upstream_path, forwarded_query(inbound.query, route, wire.dialect.key_query))
        sent_headers = request_headers(inbound.headers, injected_key(route))
        resp = await provider_call(st, flow.trace, "passthrough", inbound.method, url, sent_headers, body or None,
                                   route.upstream, k.model)
        flow.headers["x-ctxproxy-route"] = route.name
        flow.log["overhead_ms"] = round((time.perf_counter() - flow.t0) * 1000, 3)
        upstream = response_headers(resp.headers)
        declared = resp.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) <= _BUFFER_LIMIT:
            content = b"".join([c async for c in iter_raw(resp, url)])
            flow.end(resp.status_code)
            return Answer(resp.status_code, upstream, flow.headers, content)
    except ProxyError as err:
        return failed(flow, err)
    flow.end(resp.status_code)
    return Answer(resp.status_code, upstream, flow.headers, chunks=iter_raw(resp, url))
