"""The ordered list of transforms that rewrite a request on its way upstream, and how it is run.

Each transform is a small class in its own module with a `name` (its config
section), a pydantic `Settings` model for that section (proxy/rewrite/settings.py),
and `async def apply(conv, ctx) -> Conversation`, idempotent on its own output.
A transform may also have `restore(conv, ctx)`, run before any transform's
`apply` (the status bar puts earlier statuses back and measures the history
there). Reading `TRANSFORMS` top to bottom is reading what the proxy does.

Transforms ask for digests and token counts synchronously; the runner has the
big messages' ones computed off the event loop first (digests before the
first transform, counts before the first that reads them: `needs_counts`,
True unless a transform says otherwise), so no transform stalls the loop.

Containment: whatever a transform raises, the client's request goes upstream
unmodified (`forward_unmodified`), never a 500 (proxy/rewrite/degrade.py).
Traced (proxy/telemetry/), each transform's `apply` is a span of the request.

`shape` is the one way a request is made ready to send, for a turn, for the
retry after a context overflow and for count_tokens alike (a transform with
`counted = False` - the status bar: counting is not a turn - is left out of
a count). A transform may also have a response-side hook, `on_response`,
that takes over reading the provider's answer (the read tool's hidden rounds,
proxy/rewrite/context_read/loop.py); `response_loop` finds it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel

from proxy.config import Route
from proxy.request import Conversation, RequestContext
from proxy.request.events import Degraded, StoreWaited
from proxy.rewrite.cache_hints import CacheHints
from proxy.rewrite.compress.transform import Compress
from proxy.rewrite.context_read.loop import ReadLoop, Send
from proxy.rewrite.context_read.transform import ContextRead
from proxy.rewrite.degrade import STORE_DOWN, STORE_FALLBACK, forward_unmodified, wait_for_store
from proxy.rewrite.offload import Offload
from proxy.rewrite.settings import Peers
from proxy.rewrite.status_bar.transform import StatusBar
from proxy.store import StoreError
from proxy.store.guarded import backing_off, said_down


class Transform(Protocol):
    name: ClassVar[str]
    Settings: ClassVar[type[BaseModel]]
    # needs_counts: ClassVar[bool] = True, optional: False if it reads no token counts of conv.messages
    # counted: ClassVar[bool] = True, optional: False if it has no part in what count_tokens counts
    # async def restore(self, conv, ctx) -> Conversation, optional: runs before every transform's apply
    # def on_response(self, conv, ctx, send, url) -> ReadLoop | None, optional: reads the provider's answer

    def __init__(self, settings: Any, peers: Peers) -> None: ...

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation: ...


# Ordered: offload → compress → the read tool → the new status, last → cache hints (marking where
# the stable prefix ends). The status bar's `restore` (earlier statuses back in place) runs first.
TRANSFORMS: list[type[Transform]] = [Offload, Compress, ContextRead, StatusBar, CacheHints]


def peers_of(route: Route) -> Peers:
    """The settings of the route's enabled transforms, for those that must agree with another."""
    def on(name: str) -> Any:
        settings = route.section(name)
        return settings if settings is not None and getattr(settings, "enabled", True) else None

    return Peers(compress=on("compress"), context_read=on("context_read"), cache_hints=on("cache_hints"))


def build_pipeline(route: Route) -> list[Transform]:
    """The transforms enabled for one route, built once per route at start."""
    peers = peers_of(route)
    out: list[Transform] = []
    for t in TRANSFORMS:
        settings = route.section(t.name)
        if settings is not None and getattr(settings, "enabled", True):
            out.append(t(settings, peers))
    return out


Purpose = Literal["turn", "count"]


async def shape(pipeline: list[Transform], conv: Conversation, ctx: RequestContext,
                purpose: Purpose = "turn") -> Conversation:
    """The request as it goes upstream: rewritten by the route's transforms, and for a turn's stream, asked to
    report its usage (hidden again from a client that did not ask, `conv.usage_hidden`)."""
    if purpose == "count":
        pipeline = [t for t in pipeline if getattr(t, "counted", True)]
        ctx = dataclasses.replace(ctx, purpose="count")
    conv = await run_pipeline(pipeline, conv, ctx)
    if purpose == "turn" and conv.wire.ask_for_usage(conv.body):
        conv.changed = conv.usage_hidden = True
    return conv


def response_loop(pipeline: list[Transform], conv: Conversation, ctx: RequestContext, send: Send,
                  url: str) -> ReadLoop | None:
    """The transform's loop that reads the provider's answer to this request, if one takes it over."""
    for transform in pipeline:
        hook = getattr(transform, "on_response", None)
        loop: ReadLoop | None = hook(conv, ctx, send, url) if hook is not None else None
        if loop is not None:
            return loop
    return None


async def from_fallback(pipeline: list[Transform], conv: Conversation, ctx: RequestContext,
                        fresh: Conversation) -> Conversation:
    """A request over its window while the store is down, rewritten from the process's own store (byte-stable
    within the process) rather than sent to certain rejection; `fresh` (the client's, unmodified) if that fails."""
    if ctx.fallback is None:
        return fresh
    rewritten = await run_pipeline(pipeline, await Conversation.read(conv.raw, conv.wire),
                                   dataclasses.replace(ctx, store=ctx.fallback), waited=True)
    if any(isinstance(e, Degraded) for e in rewritten.events):
        return fresh
    rewritten.events.append(Degraded(STORE_FALLBACK, "store unavailable: rewritten from the in-process fallback"))
    return rewritten


async def run_pipeline(pipeline: list[Transform], conv: Conversation, ctx: RequestContext,
                       waited: bool = False) -> Conversation:
    """Apply each transform; if any fails (or the store does), forward the client's request unmodified.

    While the store is known to be down (its breaker open) no transform runs at all: every
    request then says so, not only those that happened to need the store. One exception: a request
    already over its window would go unmodified only to be rejected for length, so it waits for the
    store (proxy/rewrite/degrade.py wait_for_store) and, once the store answers, is rewritten after all; if it
    does not (or was already known to be down), it is rewritten from the process's own store (from_fallback).
    """
    current = "pipeline"
    known_down = said_down(ctx.store)  # down since an earlier request: no wait for it (it stays down)
    try:
        if backing_off(ctx.store):
            raise StoreError("store unavailable (backing off after a failure)")
        await conv.prepare_digests()
        for transform in pipeline:
            restore = getattr(transform, "restore", None)
            if restore is not None:
                current = transform.name
                conv = await restore(conv, ctx)
        counted = False
        for transform in pipeline:
            current = transform.name
            if not counted and getattr(transform, "needs_counts", True):
                await conv.prepare_counts()
                counted = True
            if ctx.trace.on:
                with ctx.trace.phase(f"transform {transform.name}", **{"ctxproxy.transform": transform.name}):
                    conv = await transform.apply(conv, ctx)
            else:
                conv = await transform.apply(conv, ctx)
        if not counted:
            current = "pipeline"
            await conv.prepare_counts()  # accounting counts what is sent
    except StoreError as e:
        fresh = await forward_unmodified(conv, ctx, STORE_DOWN, e)
        if waited or fresh.window_need() <= ctx.window:
            return fresh
        if known_down:
            return await from_fallback(pipeline, conv, ctx, fresh)
        started = time.perf_counter()
        if await wait_for_store(ctx.store):  # a stall: rewritten with the store after all
            done = await run_pipeline(pipeline, await Conversation.read(conv.raw, conv.wire), ctx, waited=True)
        else:
            done = await from_fallback(pipeline, conv, ctx, fresh)
        done.events.append(StoreWaited(round((time.perf_counter() - started) * 1000, 3)))
        return done
    except Exception as e:  # noqa: BLE001 - containment: a transform's bug must not fail the agent's request
        return await forward_unmodified(conv, ctx, current, e)
    return conv
