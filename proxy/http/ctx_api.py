"""/ctx/v1/* and /metrics: what the proxy did, for people, dashboards and scrapers.

Scoped (proxy/http/admin.py): the admin token sees every tenant, a client's API key
only its own. Every /ctx/v1 read first writes this process's pending
accounting, so a request is visible as soon as its response has completed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from proxy.accounting import inspector
from proxy.accounting.counters import (
    INSPECT_MAX,
    SESSIONS_PREFIX,
    inspect_key,
    session_summaries,
    texts_key,
    timeline_key,
)
from proxy.accounting.own_calls import numbered
from proxy.accounting.stats import stats
from proxy.engine.routing import api_key_of, tenant_id
from proxy.errors import NotFound, StoreUnavailable, Unauthorized
from proxy.http.admin import Scope, scope_of
from proxy.state import state_of
from proxy.store import Store, StoreError
from proxy.store.archive import Archive

RECENT_SESSIONS = 50
_DASHBOARD = Path(__file__).with_name("dashboard.html")


def _json(obj: object) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


async def get_blob(request: Request) -> Response:
    """The stored text behind a handle, for the tenant whose key stored it."""
    st = state_of(request)
    key = api_key_of(request.headers)
    if not key:
        raise Unauthorized("send the API key that made the request (Authorization: Bearer ...)", code="missing_api_key")
    handle = request.path_params["handle"]
    try:
        text = await Archive(st.store, tenant_id(key, st.settings.tenant_salt), fallback=st.fallback).get_text(handle)
    except StoreError:
        raise StoreUnavailable("the proxy's store is unreachable; try again shortly") from None
    if text is None:
        raise NotFound(f"no stored content with handle {handle!r} for this API key", code="handle_not_found")
    return Response(text, media_type="text/plain; charset=utf-8")


async def get_stats(request: Request) -> Response:
    scope = scope_of(request)
    st = state_of(request)
    await st.accounting.settle()
    prices = {name: facts.price for name, facts in st.settings.models.items() if facts.price is not None}
    try:
        return _json(await stats(st.store, scope.tenant, prices=prices))
    except StoreError:
        raise StoreUnavailable("the proxy's store is unreachable; figures are unavailable") from None


async def _sessions(request: Request, scope: Scope | None = None) -> list[tuple[str, str]]:
    """(tenant, session) pairs the caller may see."""
    scope = scope or scope_of(request)
    await state_of(request).accounting.settle()
    prefix = SESSIONS_PREFIX + (f"{scope.tenant}:" if scope.tenant else "")
    keys = await state_of(request).store.counters(prefix)
    return [tuple(k[len(SESSIONS_PREFIX):].split(":", 1)) for k in keys]  # type: ignore[misc]


async def _tenant_of(request: Request, wanted: str) -> str:
    """The tenant of a session the caller may see; 404 otherwise (another tenant's is "not found" too)."""
    scope = scope_of(request)
    match = [t for t, s in await _sessions(request, scope) if s == wanted]
    if not match:
        whose = "for this API key" if scope.tenant else "recorded by this proxy"
        raise NotFound(f"no session {wanted!r} {whose}", code="session_not_found")
    return match[0]


async def list_sessions(request: Request) -> Response:
    try:
        rows = await session_summaries(state_of(request).store, await _sessions(request))
    except StoreError:
        raise StoreUnavailable("the proxy's store is unreachable") from None
    rows.sort(key=lambda r: r.get("last", 0), reverse=True)
    return _json({"sessions": rows[:RECENT_SESSIONS]})


async def get_session(request: Request) -> Response:
    """One session's summary and timeline. The id is the rest of the path (X-Session-Id may hold `/`),
    percent-decoded: `ctxproxy stats --session` and the dashboard send it encoded."""
    wanted = request.path_params["session"]
    if not wanted:  # /ctx/v1/sessions/
        return await list_sessions(request)
    try:
        tenant = await _tenant_of(request, wanted)
        store = state_of(request).store
        (summary,) = await session_summaries(store, [(tenant, wanted)]) or (None,)
        timeline = [orjson.loads(x) for x in await store.read_log(timeline_key(tenant, wanted))]
    except StoreError:
        raise StoreUnavailable("the proxy's store is unreachable") from None
    for e, n in zip(timeline, numbered(timeline)):
        e["n"] = n
    return _json({"session": wanted, "summary": summary, "requests": timeline})


async def get_request(request: Request) -> Response:
    """One request of a session in the inspector: what went upstream, against what the client sent.

    `{n}` is the request's number in the session's timeline as `ctxproxy stats --session` and the dashboard
    number it (client requests 1, 2, 3...; the proxy's own calls under the request that made them: 3.1), or
    its request id.
    """
    wanted, which = request.path_params["session"], request.path_params["n"]
    store = state_of(request).store
    try:
        tenant = await _tenant_of(request, wanted)
        timeline = [orjson.loads(x) for x in await store.read_log(timeline_key(tenant, wanted))]
        labels = numbered(timeline)
        at = next((i for i, (e, n) in enumerate(zip(timeline, labels)) if which in (n, e.get("request_id"))), None)
        if at is None:
            raise NotFound(f"no request {which!r} in session {wanted!r} (its client requests are numbered 1 to "
                           f"{sum('.' not in n for n in labels)}; the proxy's own calls n.1, n.2)",
                           code="request_not_found")
        entry, n = timeline[at], labels[at]
        own = "." in n  # the proxy's own call: its record says what it sent
        turn = entry.get("kind", "turn") == "turn"
        rec = await _inspect_record(store, tenant, wanted, entry["request_id"], at - len(timeline)) \
            if own or turn else None
        if own and rec is not None and "sent" in rec:
            return _json({"session": wanted, "request": n, "request_id": entry["request_id"],
                          "entry": {**entry, "n": n}, "sent": rec["sent"]})
        if not turn:
            made = f"the proxy's own call made for request {n.split('.')[0]}" if "." in n else "no turn"
            raise NotFound(f"request {n} of session {wanted!r} was {made} ({entry['kind']}, status "
                           f"{entry.get('status')}, prompt {entry.get('prompt')} tokens): the inspector shows the "
                           f"prompts of turns and of the proxy's own calls it recorded", code="request_not_found")
        if rec is None:
            raise NotFound(f"request {n} of session {wanted!r} has no inspector record (only the newest "
                           f"{INSPECT_MAX} requests of a session keep one)", code="request_not_found")
        texts = {}
        for raw in await store.read_log(texts_key(tenant, wanted)):
            t = orjson.loads(raw)
            texts[t["d"]] = t["m"]
    except StoreError:
        raise StoreUnavailable("the proxy's store is unreachable") from None
    return _json({"session": wanted, "request": n, "request_id": entry["request_id"], "entry": {**entry, "n": n},
                  **inspector.expand(rec, texts)})


async def _inspect_record(store: Store, tenant: str, session: str, request_id: str, at: int) -> dict[str, Any] | None:
    """A request's inspector record: at the position its timeline entry has counting from the newest (both
    logs are appended together), else looked up by id."""
    key = inspect_key(tenant, session)
    found = _with_id(await store.read_log(key, at, at), request_id)
    return found if found is not None else _with_id(await store.read_log(key), request_id)


def _with_id(raws: list[bytes], request_id: str) -> dict[str, Any] | None:
    for raw in raws:
        rec: dict[str, Any] = orjson.loads(raw)
        if rec.get("id") == request_id:
            return rec
    return None


async def metrics(request: Request) -> Response:
    """In-process figures, rendered in a worker thread: a large scrape never holds up the requests being proxied
    (and never waits for the store)."""
    text = await asyncio.to_thread(state_of(request).metrics.render)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def dashboard(request: Request) -> Response:
    """One self-contained page (no build step, no external assets) over the JSON endpoints."""
    return HTMLResponse(_DASHBOARD.read_text(encoding="utf-8"))
