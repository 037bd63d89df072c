"""Context windows learned from the provider's own `context_length_exceeded` errors.

A user of a local 32k model should not have to tell the proxy its window: the
first overflow says "maximum context length is N tokens". The proxy records N
for the route and model (in the store, so restarts and replicas know it too),
compacts to fit, and retries once; the client sees a normal answer.
"""

from __future__ import annotations

import re

import orjson

from proxy.store import Store, StoreError

_LIMIT = re.compile(r"maximum context length is ([\d,]+) tokens", re.IGNORECASE)


def overflow_limit(content: bytes) -> int | None:
    """The window a context-length error names, or None if this is not one."""
    try:
        err = orjson.loads(content).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(err, dict):
        return None
    message = str(err.get("message") or "")
    if err.get("code") != "context_length_exceeded" and "context length" not in message.lower():
        return None
    m = _LIMIT.search(message)
    return int(m.group(1).replace(",", "")) if m else None


class LearnedWindows:
    """Per (route, model): the smallest window a provider has reported. Cached in process."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._known: dict[tuple[str, str], int | None] = {}

    @staticmethod
    def _key(route: str, model: str) -> str:
        return f"windows:{route}:{model}"

    async def get(self, route: str, model: str | None) -> int | None:
        if not model:
            return None
        k = (route, model)
        if k not in self._known:
            try:
                raw = await self.store.get(self._key(route, model))
            except StoreError:
                return None
            self._known[k] = int(raw) if raw else None
        return self._known[k]

    async def learn(self, route: str, model: str, window: int) -> None:
        self._known[(route, model)] = window
        try:
            await self.store.put(self._key(route, model), str(window).encode())
        except StoreError:
            pass  # known in this process; other replicas learn on their own first overflow
