"""The one key schema of everything the proxy stores: every key starts with its tenant.

    t:<tenant>:<kind>[:<part>...]                  tenant-wide (blobs, windows, handles)
    t:<tenant>:r:<route>:<kind>[:<part>...]        one route's (recorded rewrite decisions)
    t:<tenant>:s:<session>:<kind>[:<part>...]      one session's (timeline, trace, statuses, clock)
    t:<tenant>:s:<session>:r:<route>:<kind>[...]   one session on one route (its compactions)

Nothing is stored outside a tenant's prefix, so no request can reach another
tenant's data by naming it. A decision the proxy made by a route's policy
(an offload, a summary, a compaction) is keyed by that route, so another
route's policy never replays it; the text a handle names is tenant-wide, so
it reads back on any route. Route names hold no ':' (proxy/config.py), so a
route's keys never collide with another kind. The strings are persisted:
changing one orphans data.
"""

from __future__ import annotations


def tenant_key(tenant: str, *parts: str) -> str:
    return ":".join(("t", tenant, *parts))


def route_key(tenant: str, route: str, *parts: str) -> str:
    return tenant_key(tenant, "r", route, *parts)


def session_key(tenant: str, session: str, *parts: str) -> str:
    return tenant_key(tenant, "s", session, *parts)


def route_session_key(tenant: str, session: str, route: str, *parts: str) -> str:
    return session_key(tenant, session, "r", route, *parts)
