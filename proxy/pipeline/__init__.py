"""The ordered list of transforms that rewrite a chat request on its way upstream.

Each transform is a small class in its own module with a `name` (its config
section), a pydantic `Settings` model for that section, and
`async def apply(conv, ctx) -> Conversation`, idempotent on its own output.
Reading `TRANSFORMS` top to bottom is reading what the proxy does to a request.

Transforms ask for digests and token counts synchronously; the runner has the
big messages' ones computed off the event loop first (digests before the
first transform, counts before the first that reads them: `needs_counts`,
True unless a transform says otherwise), so no transform stalls the loop.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from proxy.config import Route
from proxy.conversation import Conversation, Event, RequestContext
from proxy.logs import event
from proxy.store import StoreError
from proxy.store.guarded import backing_off


class Transform(Protocol):
    name: ClassVar[str]
    Settings: ClassVar[type[BaseModel]]
    # needs_counts: ClassVar[bool] = True, optional: False if it reads no token counts of conv.messages

    def __init__(self, settings: Any) -> None: ...

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation: ...


def _transforms() -> list[type[Transform]]:
    from proxy.pipeline.cache_hints import CacheHints
    from proxy.pipeline.compress import Compress
    from proxy.pipeline.offload import Offload
    from proxy.pipeline.read_tool import ReadToolTransform
    from proxy.pipeline.status import StatusBar, StatusHistory

    return [StatusHistory, Offload, Compress, ReadToolTransform, StatusBar, CacheHints]


# Ordered: earlier statuses back in place → offload → compress → read tool → the new status, last
# → cache hints (marking where the stable prefix ends).
TRANSFORMS: list[type[Transform]] = _transforms()

SECTION_MODELS: dict[str, type[BaseModel]] = {t.name: t.Settings for t in TRANSFORMS}


def build_pipeline(route: Route) -> list[Transform]:
    """The transforms enabled for one route, built once per route at start."""
    out: list[Transform] = []
    for t in TRANSFORMS:
        settings = route.section(t.name)
        if settings is not None and getattr(settings, "enabled", True):
            out.append(t(settings))
    return out


async def run_pipeline(pipeline: list[Transform], conv: Conversation, ctx: RequestContext) -> Conversation:
    """Apply each transform; if the store fails, forward the client's request unmodified and say so.

    While the store is known to be down (its breaker open) no transform runs at all: every
    request then says so, not only those that happened to need the store.
    """
    try:
        if backing_off(ctx.store):
            raise StoreError("store unavailable (backing off after a failure)")
        await conv.prepare_digests()
        counted = False
        for transform in pipeline:
            if not counted and getattr(transform, "needs_counts", True):
                await conv.prepare_counts()
                counted = True
            conv = await transform.apply(conv, ctx)
        if not counted:
            await conv.prepare_counts()  # accounting counts what is sent
    except StoreError as e:
        event("store unavailable; forwarding unmodified", request_id=ctx.request_id, error=str(e))
        fresh = Conversation.parse(conv.raw)
        fresh.events.append(Event("degraded", {"reason": "store unavailable"}))
        await fresh.prepare_digests()
        await fresh.prepare_counts()
        return fresh
    return conv
