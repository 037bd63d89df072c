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

A key's slot group (`slot_group`) is the part a sharded backend hashes: a
session's keys stay together, the rest of a tenant's together, so every
operation that touches several keys at once touches one Redis Cluster slot.
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


TENANT_HEAD = "t"
SESSION_PART = "s"


def slot_group(key: str) -> str:
    """The leading part of ``key`` that a clustered backend keeps in one slot ("" when the key has none).

    Operations that touch several keys at once (a counted group's bookkeeping and its
    blobs, one request's logs, a delete of a key's blob, counter and log) only ever mix
    keys of one group, so a backend that shards by slot (Redis Cluster) hashes the group
    alone and runs each such operation on one node. A session's keys group by session
    (they are many and hot: spreading sessions spreads load), everything else of a tenant
    by tenant (a tenant's archive and its quota bookkeeping must be together). A key
    outside the schema (accounting's counters) has no group: it lands wherever its whole
    text hashes, and nothing multi-key may depend on its neighbours.
    """
    parts = key.split(":", 4)
    if len(parts) < 3 or parts[0] != TENANT_HEAD:
        return ""
    if len(parts) == 5 and parts[2] == SESSION_PART:
        return ":".join(parts[:4])
    return ":".join(parts[:2])
