"""The read-back rate's two counts: handles given to the model, and of those, the ones it read back.

A handle is *given* when an offload or cleared placeholder carrying it is first
sent upstream, and *read* the first time the model reads it with
`context_read`; each is counted once per tenant, atomically across replicas
(`put_if_absent` on a small record), and a read is counted where its handle was
given (route, model, hour, session), so the rate over any window is at most 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from proxy.lru import LRU
from proxy.request import Conversation
from proxy.store import Store
from proxy.store.keys import tenant_key
from proxy.wire.usage import Usage

if TYPE_CHECKING:
    from proxy.request import ReadRounds as Rounds

_SEEN = 50_000  # (tenant, handle) pairs known to be counted as given already, in process

# count(group, hour, "tenant:session", "handles_given" | "handles_read"): adds one where the figures are kept
Count = Callable[[str, int, str, str], None]


def _given_key(tenant: str, handle: str) -> str:
    return tenant_key(tenant, "given", handle)


def _read_key(tenant: str, handle: str) -> str:
    return tenant_key(tenant, "readback", handle)


@dataclass
class ReadBack:
    """A request's hidden read-back rounds: the messages they added, their usage, the handles asked for."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    usages: list[Usage] = field(default_factory=list)
    handles: list[str] = field(default_factory=list)


def read_back(rounds: Rounds | None, conv: Conversation) -> ReadBack:
    if rounds is None or not rounds.done:
        return ReadBack()
    added = rounds.messages[len(conv.messages):]
    handles: dict[str, None] = {}
    for m in added:
        for call in conv.wire.calls(m) if conv.wire.role(m) == "assistant" else ():
            try:
                args = orjson.loads(call.arguments or "{}")
            except orjson.JSONDecodeError:
                continue
            if isinstance(args, dict) and isinstance(args.get("handle"), str):
                handles[args["handle"].strip()] = None
    return ReadBack(added, list(rounds.usages), list(handles))


class HandleCounts:
    """Decides, against the store, which handles are given or read for the first time."""

    def __init__(self, store: Store, ttl: float) -> None:
        self.store, self.ttl = store, ttl
        self._seen: LRU[tuple[str, str], bool] = LRU(_SEEN)

    async def given(self, tenant: str, session: str, group: str, hour: int, handles: list[str], count: Count) -> None:
        for h in handles:
            if (tenant, h) in self._seen:
                continue
            if await self.store.put_json_if_absent(_given_key(tenant, h), [group, hour, session], ttl=self.ttl):
                count(group, hour, f"{tenant}:{session}", "handles_given")
            self._seen.put((tenant, h), True)

    async def read(self, tenant: str, handles: list[str], count: Count) -> None:
        given = await self.store.get_many([_given_key(tenant, h) for h in handles])
        for h, where in zip(handles, given):
            if where is None:  # not a handle the proxy gave in a placeholder
                continue
            if await self.store.put_if_absent(_read_key(tenant, h), b"1", ttl=self.ttl):
                group, hour, session = orjson.loads(where)
                count(group, hour, f"{tenant}:{session}", "handles_read")
