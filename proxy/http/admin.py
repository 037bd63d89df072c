"""Who may read /ctx/* and what they see.

The admin token (CTXPROXY_ADMIN_TOKEN, compared in constant time) sees every
tenant. A client's own API key sees only its own tenant. With no admin token
configured, a request without a key is answered only from loopback (a local
developer's dashboard), with a `Host` naming the proxy (not a DNS-rebinding
page's: proxy/http/local_guard.py), and sees everything; from elsewhere it is refused.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.requests import Request

from proxy.engine.routing import api_key_of, require_proxy_host, tenant_id
from proxy.errors import Unauthorized
from proxy.state import state_of

ADMIN_HEADER = "x-ctx-admin-token"
_LOOPBACK = ("127.", "::1", "localhost")


@dataclass(frozen=True)
class Scope:
    tenant: str | None  # None: all tenants

    def allows(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


def scope_of(request: Request) -> Scope:
    st = state_of(request)
    token = st.settings.admin_token
    presented = request.headers.get(ADMIN_HEADER) or request.query_params.get("token")
    key = api_key_of(request.headers)
    if token:
        for candidate in (presented, key):
            if candidate and hmac.compare_digest(candidate.encode(), token.encode()):
                return Scope(None)
    if key:
        return Scope(tenant_id(key, st.settings.tenant_salt))
    host = request.client.host if request.client else ""
    if not token and host.startswith(_LOOPBACK):
        require_proxy_host(request.headers, st.settings.server, "without a key this view is trusted for coming "
                                                                "from loopback")
        return Scope(None)
    raise Unauthorized("this endpoint needs the admin token (X-Ctx-Admin-Token) or your API key (Authorization)",
                       code="unauthorized")
