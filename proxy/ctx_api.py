"""/ctx/v1/*: the proxy's own endpoints for people and client-side tools.

Scoped by the caller's API key: a tenant reads only what its own key stored.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy.archive import Archive
from proxy.errors import NotFound, StoreUnavailable, Unauthorized
from proxy.routing import api_key_of, tenant_id
from proxy.state import state_of
from proxy.store import StoreError


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
