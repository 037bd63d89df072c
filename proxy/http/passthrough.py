"""Every other /v1/* request, forwarded unchanged: method, query, body, status, headers, streams.

The proxy manages chat context; for models, embeddings, responses, files and
whatever a provider adds next it is a transparent pipe with the route's
upstream and credentials.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import ProxyError
from proxy.http.answers import known
from proxy.http.local_guard import INJECTS_KEY, require_proxy_host
from proxy.http.relay import client_codec, error_response, query_of, read_body, relay_response, relay_stream
from proxy.http.request_run import model_in, new_request_id
from proxy.http.routing import resolve_route
from proxy.http.send import provider_call
from proxy.logs import event
from proxy.state import ProxyState, state_of
from proxy.telemetry import NO_TRACE, RequestTrace
from proxy.upstream.client import iter_raw, request_headers, response_headers, upstream_url

# Bodies at most this large with a declared length are relayed in one piece
# (keeping Content-Length); anything else streams.
_BUFFER_LIMIT = 1024 * 1024


def _model_of(body: bytes, content_type: str) -> str | None:
    return model_in(body) if body and "json" in content_type else None


async def passthrough(request: Request) -> Response:
    st = state_of(request)
    if not st.tracing.on:
        return await _passthrough(st, request, NO_TRACE)
    trace = st.tracing.request(request.method, request.scope["path"], request.headers.items(),
                               client_codec(request).family, operation="passthrough")
    with trace.activate():  # it ends with the request's log line
        return await _passthrough(st, request, trace)


async def _passthrough(st: ProxyState, request: Request, trace: RequestTrace) -> Response:
    t0 = time.perf_counter()
    rid = new_request_id()
    log: dict[str, object] = {"request_id": rid, "method": request.method, "path": request.scope["path"]}
    wire = client_codec(request)
    k = known(request.scope)  # its answer is counted as it starts (proxy/http/answers.py)
    k.kind, k.request_id = "passthrough", rid
    try:
        body = await read_body(request, st.settings.server, decode=False)  # forwarded as sent, encoding and all
        k.model = _model_of(body, request.headers.get("content-type", ""))
        route = resolve_route(st.settings, request.path_params.get("route"), request.headers, k.model,
                              "anthropic" if wire.family == "anthropic" else None)
        log["route"] = k.route = route.name
        if route.upstream.api_key_env:
            require_proxy_host(request.headers, st.settings.server, INJECTS_KEY)
        url = upstream_url(route.upstream, request.path_params["path"], query_of(request))
        sent_headers = request_headers(request.headers.items(), route.upstream)
        resp = await provider_call(st, trace, "passthrough", request.method, url, sent_headers, body or None,
                                   route.upstream, k.model)
    except ProxyError as err:
        k.error = err.code
        _logged(trace, err.status, err.code, log)
        return error_response(err, wire, {"x-ctxproxy-request-id": rid})
    upstream, own = response_headers(resp.headers), [("x-ctxproxy-request-id", rid), ("x-ctxproxy-route", route.name)]
    log.update(status=resp.status_code, overhead_ms=round((time.perf_counter() - t0) * 1000, 3))
    declared = resp.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) <= _BUFFER_LIMIT:
        try:
            content = b"".join([c async for c in iter_raw(resp, url)])
        except ProxyError as err:
            k.error = err.code
            _logged(trace, err.status, err.code, {**log, "status": err.status})
            return error_response(err, wire, {"x-ctxproxy-request-id": rid})
        _logged(trace, resp.status_code, None, log)
        return relay_response(content, resp.status_code, upstream, own)
    _logged(trace, resp.status_code, None, log)
    return relay_stream(iter_raw(resp, url), resp.status_code, upstream, own)


def _logged(trace: RequestTrace, status: int, error: str | None, log: dict[str, object]) -> None:
    """The request's log line; its span (tracing on) ends with it."""
    event("request", **({**log, "status": status, "error": error} if error else log))
    if trace.on:
        trace.end(status, error)
