"""/ctx/v1/* and /metrics: what the proxy did, for people, dashboards and scrapers.

Scoped (proxy/admin.py): the admin token sees every tenant, a client's API key
only its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from proxy.accounting import SESSIONS_PREFIX, session_summaries, timeline_key
from proxy.admin import scope_of
from proxy.archive import Archive
from proxy.errors import NotFound, StoreUnavailable, Unauthorized
from proxy.routing import api_key_of, tenant_id
from proxy.state import state_of
from proxy.stats import stats
from proxy.store import StoreError

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
        text = await Archive(st.store, tenant_id(key, st.settings.tenant_salt)).get_text(handle)
    except StoreError:
        raise StoreUnavailable("the proxy's store is unreachable; try again shortly") from None
    if text is None:
        raise NotFound(f"no stored content with handle {handle!r} for this API key", code="handle_not_found")
    return Response(text, media_type="text/plain; charset=utf-8")


async def get_stats(request: Request) -> Response:
    scope = scope_of(request)
    try:
        return _json(await stats(state_of(request).store, scope.tenant))
    except StoreError:
        raise StoreUnavailable("the proxy's store is unreachable; figures are unavailable") from None


async def _sessions(request: Request) -> list[tuple[str, str]]:
    """(tenant, session) pairs the caller may see."""
    scope = scope_of(request)
    prefix = SESSIONS_PREFIX + (f"{scope.tenant}:" if scope.tenant else "")
    keys = await state_of(request).store.counters(prefix)
    return [tuple(k[len(SESSIONS_PREFIX):].split(":", 1)) for k in keys]  # type: ignore[misc]


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
        match = [(t, s) for t, s in await _sessions(request) if s == wanted]
        if not match:
            raise NotFound(f"no session {wanted!r} visible to this key", code="session_not_found")
        tenant = match[0][0]
        store = state_of(request).store
        (summary,) = await session_summaries(store, [(tenant, wanted)]) or (None,)
        timeline = [orjson.loads(x) for x in await store.read_log(timeline_key(tenant, wanted))]
    except StoreError:
        raise StoreUnavailable("the proxy's store is unreachable") from None
    return _json({"session": wanted, "summary": summary, "requests": timeline})


async def metrics(request: Request) -> Response:
    """Rendered in a worker thread: a large scrape never holds up the requests being proxied."""
    text = await asyncio.to_thread(state_of(request).metrics.render)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def dashboard(request: Request) -> Response:
    """One self-contained page (no build step, no external assets) over the JSON endpoints."""
    return HTMLResponse(_DASHBOARD.read_text(encoding="utf-8"))
