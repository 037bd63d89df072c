"""Tenant-scoped archive of the text the proxy took out of a prompt.

Everything the model can read back by handle (offloaded tool results, cleared
history, summarized spans) lives here under the tenant that sent it: another
API key gets "no such handle", never the text. The text is the tenant's, not a
route's: a handle given on one route reads back on every route of the tenant.
What the proxy *decided* to do with a text is a route's own (proxy/store/decisions.py).

Stored text counts against the tenant's byte quota: past it, the tenant's
oldest text is evicted first. Eviction removes only text, never a decision, so
a placeholder already sent keeps its bytes; reading an evicted handle back
answers "no stored content", like any unknown handle.
"""

from __future__ import annotations

import hashlib

from proxy.store.base import Store, StoreError
from proxy.store.decisions import SECONDS_PER_DAY
from proxy.store.keys import tenant_key

HANDLE_PREFIX = "ctx_"
_HANDLE_HEX = 20  # hex chars of the content hash in a handle: 80 bits, unguessable without the text


def content_handle(kind: str, text: str) -> str:
    """Handle of a piece of text: a hash of what it is and what it says, the same on every process."""
    h = hashlib.blake2b(digest_size=16)
    h.update(kind.encode() + b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return HANDLE_PREFIX + h.hexdigest()[:_HANDLE_HEX]


def is_handle(value: str) -> bool:
    return value.startswith(HANDLE_PREFIX) and len(value) == len(HANDLE_PREFIX) + _HANDLE_HEX \
        and all(c in "0123456789abcdef" for c in value[len(HANDLE_PREFIX):])


def _blob_key(tenant: str, handle: str) -> str:
    return tenant_key(tenant, "blob", handle)


def _quota_group(tenant: str) -> str:
    return tenant_key(tenant, "archive")


class Archive:
    """Stored text of one tenant."""

    def __init__(self, store: Store, tenant: str, retention_days: float | None = None,
                 quota_bytes: int | None = None, fallback: Store | None = None) -> None:
        self.store = store
        self.fallback = fallback  # read when the store has no such text (stored there while the store was down)
        self.tenant = tenant
        self.ttl = retention_days * SECONDS_PER_DAY if retention_days else None
        self.quota = quota_bytes or None  # 0/None: unlimited, and not counted

    async def put_text(self, handle: str, text: str) -> None:
        """Durably store the text (before any request that names its handle goes upstream).

        Under a quota, this may evict the tenant's oldest stored text (never this one).
        """
        key, value = _blob_key(self.tenant, handle), text.encode("utf-8", "surrogatepass")
        if self.quota is None:
            await self.store.put(key, value, ttl=self.ttl)
        else:
            await self.store.put_counted(key, value, _quota_group(self.tenant), self.quota, ttl=self.ttl)

    async def stored_bytes(self) -> int:
        """Bytes of text this tenant holds against its quota (0 when no quota counts it)."""
        return await self.store.counted_bytes(_quota_group(self.tenant))

    async def get_text(self, handle: str) -> str | None:
        if not is_handle(handle):
            return None
        key = _blob_key(self.tenant, handle)
        try:
            raw = await self.store.get(key)
        except StoreError:
            if self.fallback is None:
                raise
            raw = None
        if raw is None and self.fallback is not None:
            raw = await self.fallback.get(key)
        return None if raw is None else raw.decode("utf-8", "surrogatepass")
