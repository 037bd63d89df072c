"""A turn answers the same through the fast lane as through FastAPI's stack: status, headers, body, count, log line.

The fast lane (proxy/http/fast_lane.py) serves POST /v1/chat/completions,
/v1/responses and /v1/messages (and under /r/{route}) past Starlette's layers.
Each test sends a request both ways - to the app as a server would, and to the
app's own middleware stack, as every request went before the lane - and compares
what the client got and what the proxy counted and logged. Requests the lane
leaves alone are seen to reach the stack.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.exceptions import HTTPException
from starlette.responses import Response

from proxy.app import TURNS
from proxy.errors import BadRequest
from proxy.http.fast_lane import turn_of

HI = [{"role": "user", "content": "hi"}]
CASES = [
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": HI}),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": HI, "stream": True}),
    ("/r/default/v1/chat/completions", {"model": "gpt-4o", "messages": HI}),
    ("/v1/responses", {"model": "gpt-4o", "input": "hi"}),
    ("/r/default/v1/responses", {"model": "gpt-4o", "input": "hi", "stream": True}),
    ("/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": HI}),
    ("/r/default/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": HI, "stream": True}),
]
VOLATILE = re.compile(r"x-request-id|x-ctxproxy-overhead-ms|date|x-ctxproxy-request-id")  # differ per request anyway
AUTH = {"authorization": "Bearer sk-lane"}


class Spied:
    """The app's own stack (FastAPI's middleware and router), each request that reaches it counted: the lane
    left it to the app."""

    def __init__(self, app: Any) -> None:
        self.app, self.paths = app, []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/metrics":  # the tests' own look at the counters
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


@pytest.fixture
def stack(proxy) -> Iterator[Spied]:
    """The stack every request went through before the lane, spied on."""
    proxy.get("/healthz")  # the stack is built by the first request
    inner = proxy.app.middleware_stack
    proxy.app.middleware_stack = spied = Spied(inner)
    yield spied
    proxy.app.middleware_stack = inner


def send(proxy, app: Any, path: str, *, method: str = "POST", raise_app_exceptions: bool = False,
         **kw: Any) -> httpx.Response:
    """One request to `app` over ASGI on the proxy's loop (`scope["app"]` set, as the FastAPI app sets it)."""
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if app is not proxy.app:
            scope["app"] = proxy.app
        await app(scope, receive, send)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=asgi, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url=proxy.url) as client:
            r = await client.request(method, path, **kw)
            await r.aread()
            return r

    return proxy.call(go())


def counts(proxy) -> dict[str, float]:
    text = proxy.get("/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(ctxproxy_requests_total\{[^}]*\}) (\S+)$", text,
                                                              re.M)}


def both(proxy, upstream, stack: Spied, path: str, headers: dict[str, str] | None = None,
         **kw: Any) -> tuple[httpx.Response, httpx.Response, list[dict[str, float]]]:
    """The request through the lane, then through the stack, each a tenant's first turn and the mock's first
    answer (its ids count up); and what each added to the request counters."""
    before = counts(proxy)
    laned = send(proxy, proxy.app, path, headers={**_as("lane"), **(headers or {})}, **kw)
    proxy.settle()
    between = counts(proxy)
    sent = list(upstream.requests)
    upstream.reset()
    upstream._seq = 0  # noqa: SLF001 - the mock's ids start again, as for the first request
    routed = send(proxy, stack, path, headers={**_as("router"), **(headers or {})}, **kw)
    upstream.requests[:0] = sent
    proxy.settle()
    after = counts(proxy)
    added = [{k: v - a.get(k, 0) for k, v in b.items() if v != a.get(k, 0)}
             for a, b in ((before, between), (between, after))]
    return laned, routed, added


def _as(who: str) -> dict[str, str]:
    """A tenant and session of its own: nothing the other request did (a prefix the provider cached) shows."""
    return {"authorization": f"Bearer sk-{who}", "x-session-id": who}


def assert_same(laned: httpx.Response, routed: httpx.Response) -> None:
    assert laned.status_code == routed.status_code
    assert headers(laned, "lane") == headers(routed, "router")
    assert laned.content == routed.content


def headers(r: httpx.Response, session: str) -> list[tuple[str, str]]:
    return [(k, "S" if k == "x-ctxproxy-session" and v == session else v) for k, v in r.headers.multi_items()
            if not VOLATILE.fullmatch(k)]


@pytest.mark.parametrize(("path", "body"), CASES)
def test_a_turn_is_answered_and_counted_the_same_through_the_lane(proxy, upstream, stack, path, body):
    laned, routed, added = both(proxy, upstream, stack, path, json=body)
    assert laned.status_code == 200, laned.text
    assert_same(laned, routed)
    assert added[0] == added[1] and sum(added[0].values()) == 1, added
    assert stack.paths == [path]  # the router's turn only: the lane's never reached the stack
    assert len(upstream.requests) == 2


@pytest.mark.parametrize(("path", "content", "status"), [
    ("/v1/chat/completions", b"{not json", 400),
    ("/v1/messages", b'{"model": "claude-sonnet-4-5"}', 400),
    ("/r/nowhere/v1/chat/completions", b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}', 404),
    ("/r/nowhere/v1/responses", b'{"model": "gpt-4o", "input": "hi"}', 404),
])
def test_a_refusal_is_the_same_error_counted_the_same(proxy, upstream, stack, path, content, status):
    laned, routed, added = both(proxy, upstream, stack, path, content=content,
                                headers={"content-type": "application/json"})
    assert laned.status_code == status, laned.text
    assert_same(laned, routed)
    assert added[0] == added[1] and sum(added[0].values()) == 1, added
    assert not upstream.requests


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/chat/completions"),  # the pass-through's
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/r/a/b/v1/chat/completions"),  # {route} is one segment: no route of the app's, a 404
    ("POST", "/r//v1/chat/completions"),
    ("POST", "/v1/chat/completions/"),
    ("PUT", "/v1/responses"),
])
def test_what_is_not_a_turn_is_left_to_the_app(proxy, upstream, stack, method, path):
    body = {"model": "claude-sonnet-4-5", "messages": HI}
    laned, routed, added = both(proxy, upstream, stack, path, method=method, json=body)
    assert stack.paths == [path, path]
    assert_same(laned, routed)
    assert added[0] == added[1], added


def test_get_on_a_turns_path_goes_to_the_provider_as_before(proxy, upstream, stack):
    r = send(proxy, proxy.app, "/v1/chat/completions", method="GET", headers=AUTH)
    assert stack.paths == ["/v1/chat/completions"]
    assert [(q.method, q.path) for q in upstream.requests] == [("GET", "/v1/chat/completions")], r.text


def _broken(how: str) -> Any:
    async def handle(request: Any, wire: Any) -> Response:
        if how == "raises":
            raise RuntimeError("a bug in the handler")
        if how == "refuses":
            raise BadRequest("refused by the handler", code="refused")
        if how == "starlette":
            raise HTTPException(405)
        return _StartsThenRefuses()

    return handle


class _StartsThenRefuses(Response):
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"half", "more_body": True})
        raise BadRequest("refused after the answer started")


@pytest.mark.parametrize(("how", "status", "logged"), [
    ("raises", 500, 1), ("refuses", 400, 0), ("starlette", 405, 0), ("midway", 200, 1)])
def test_a_handler_failing_is_answered_logged_and_counted_the_same(proxy, upstream, stack, monkeypatch, caplog, how,
                                                                   status, logged):
    caplog.set_level(logging.ERROR, logger="ctxproxy")
    monkeypatch.setattr("proxy.http.chat.handle", _broken(how))
    laned, routed, added = both(proxy, upstream, stack, "/v1/chat/completions",
                                json={"model": "gpt-4o", "messages": HI})
    assert laned.status_code == status
    assert_same(laned, routed)
    assert added[0] == added[1] and sum(added[0].values()) == 1, added
    timelines = [[(e["status"], e["error"]) for e in proxy.get(f"/ctx/v1/sessions/{who}", headers=_as(who)).json()[
        "requests"]] for who in ("lane", "router")]
    assert timelines[0] == timelines[1] == [(status, {"raises": "internal_error", "refuses": "refused",
                                                      "starlette": "method_not_allowed", "midway": None}[how])]
    if how == "raises":
        assert laned.json()["error"]["message"] == "internal proxy error; see the proxy log"
    errors = [(r.getMessage(), type(r.exc_info[1]).__name__ if r.exc_info else None) for r in caplog.records]
    assert errors[::2] == errors[1::2] and len(errors) == 2 * logged, errors  # the same line, once each way
    if logged:
        assert errors[0][0] == "unexpected error"


@pytest.mark.parametrize("how", ["raises", "midway"])
def test_an_unexpected_exception_still_reaches_the_server(proxy, upstream, stack, monkeypatch, how):
    """As ServerErrorMiddleware does: the 500 sent (unless an answer had started), then the exception re-raised
    for the server to log (uvicorn) or the test client to raise."""
    monkeypatch.setattr("proxy.http.chat.handle", _broken(how))
    raised = []
    for app in (proxy.app, stack):
        with pytest.raises(RuntimeError) as info:
            send(proxy, app, "/v1/chat/completions", json={"model": "gpt-4o", "messages": HI},
                 raise_app_exceptions=True)
        raised.append(str(info.value))
    assert raised[0] == raised[1]


@pytest.mark.parametrize(("scope", "params"), [
    ({"path": "/v1/chat/completions"}, {}),
    ({"path": "/r/coding/v1/messages"}, {"route": "coding"}),
    ({"path": "/r/a b%/v1/responses"}, {"route": "a b%"}),  # a segment, whatever its characters (decoded)
    ({"path": "/r/a/b/v1/chat/completions"}, None),
    ({"path": "/r//v1/chat/completions"}, None),
    ({"path": "/r/v1/chat/completions"}, None),
    ({"path": "/v1/messages/count_tokens"}, None),
    ({"path": "/v1/chat/completions", "method": "GET"}, None),
    ({"path": "/v1/responses", "type": "websocket"}, None),
    ({"path": "/api/v1/chat/completions", "root_path": "/api"}, None),  # the router's business (get_route_path)
])
def test_the_lane_takes_exactly_the_turns_the_router_would_route(scope, params):
    scope = {"type": "http", "method": "POST", **scope}
    handler = turn_of(scope, TURNS)
    assert (handler is None) == (params is None)
    if params is not None:
        assert scope["path_params"] == params
        assert handler is TURNS["/v1/" + scope["path"].split("/v1/", 1)[1]]
