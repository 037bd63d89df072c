"""The one key schema of everything the proxy stores: every key starts with its tenant.

    t:<tenant>:<kind>[:<part>...]             tenant-wide (blobs, decisions, windows, handles)
    t:<tenant>:s:<session>:<kind>[:<part>...] one session's (timeline, trace, statuses, compactions)

Nothing is stored outside a tenant's prefix, so no request can reach another
tenant's data by naming it. The strings are persisted: changing one orphans data.
"""

from __future__ import annotations


def tenant_key(tenant: str, *parts: str) -> str:
    return ":".join(("t", tenant, *parts))


def session_key(tenant: str, session: str, *parts: str) -> str:
    return tenant_key(tenant, "s", session, *parts)
