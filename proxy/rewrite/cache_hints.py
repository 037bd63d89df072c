"""Cache hints: help the provider's prompt cache hit, per route.

Providers cache only what they route to the same machine and, for some
models, only up to breakpoints the request marks; most agents set neither.
The proxy knows the session and where the stable prefix ends, so it adds:
- `prompt_cache_key` from the session (or tenant), unless the client set one;
- breakpoints at the end of the stable prefix - after the tools and system
  prompt, after the latest summary, before the status bar - as
  `cache_control: {"type": "ephemeral"}` (Anthropic format) or
  `prompt_cache_breakpoint` parts (OpenAI models that take them), within the
  provider's limit, counting the client's own markers;
- `prompt_cache_retention` where configured.
Markers do not change what a message says; accounting hashes the unmarked
messages (`conv.unmarked`), so moving a marker is not a prefix break.
"""

from __future__ import annotations

import hashlib
from fnmatch import fnmatchcase
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from proxy.lru import LRU
from proxy.request import Conversation, RequestContext
from proxy.request.events import CompactionInEffect
from proxy.rewrite.compress.history import system_end
from proxy.rewrite.settings import CacheHintsSettings, Peers
from proxy.rewrite.status_bar.trajectory import is_status
from proxy.wire.codec import MARK_TTL_SECONDS, BreakpointStyle


def cache_fields(settings: CacheHintsSettings | None, conv: Conversation, ctx: RequestContext) -> dict[str, Any]:
    """The cache-routing fields the agent's requests carry (the client's own first): the proxy's
    summarizer sends the same ones so its call lands where the agent's prefix is cached. None in an
    API without them (Anthropic's refuses fields it does not know)."""
    body = conv.body
    out: dict[str, Any] = {k: body[k] for k in ("prompt_cache_key", "prompt_cache_retention") if k in body}
    if settings is None or not settings.enabled or not conv.wire.routing_fields:
        return out
    mode = settings.prompt_cache_key
    if mode == "auto":
        mode = "session" if "api.openai.com" in ctx.route.upstream.base_url else "off"
    if mode != "off" and "prompt_cache_key" not in out:
        basis = ctx.tenant + ("" if mode == "tenant" else "\0" + ctx.session)
        out["prompt_cache_key"] = "ctx-" + hashlib.blake2b(basis.encode(), digest_size=12).hexdigest()
    if settings.retention and "prompt_cache_retention" not in out:
        out["prompt_cache_retention"] = settings.retention
    return out


_STYLES_CACHED = 1_000  # (model, upstream) pairs whose breakpoint style is remembered
MIN_CACHEABLE_TOKENS = 1024  # Anthropic's smallest cacheable prefix (more on some models): a mark before it is moot


class CacheHints:
    name: ClassVar[str] = "cache_hints"
    Settings: ClassVar[type[BaseModel]] = CacheHintsSettings

    def __init__(self, settings: CacheHintsSettings, peers: Peers) -> None:
        self.settings = settings
        # (model, upstream URL) -> the breakpoint style `auto` finds for it (globs matched once per model)
        self._styles: LRU[tuple[str, str], BreakpointStyle | Literal["none"]] = LRU(_STYLES_CACHED)

    def style(self, ctx: RequestContext) -> BreakpointStyle | Literal["none"]:
        s = self.settings
        if s.breakpoints != "auto":
            return s.breakpoints
        key = (ctx.model or "", ctx.route.upstream.base_url)
        style = self._styles.get(key)
        if style is None:  # model names come from clients: the LRU keeps it bounded
            style = self._auto(*key)
            self._styles.put(key, style)
        return style

    def _auto(self, model: str, base_url: str) -> BreakpointStyle | Literal["none"]:
        s = self.settings
        if "anthropic" in base_url or any(fnmatchcase(model, g) for g in s.anthropic_models):
            return "anthropic"
        if any(fnmatchcase(model, g) for g in s.openai_breakpoint_models):
            return "openai"
        return "none"

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        body = conv.body
        for name, value in cache_fields(self.settings, conv, ctx).items():
            if name not in body:
                body[name] = value
                conv.changed = True
        style = self.style(ctx)
        if style != "none":
            self._mark(conv, style)
        return conv

    def _mark(self, conv: Conversation, style: BreakpointStyle) -> None:
        msgs, wire = conv.messages, conv.wire
        if sum(conv.counts(msgs)) + conv.fixed_tokens() < MIN_CACHEABLE_TOKENS:
            return  # a prompt too short for any provider to cache: a mark would change its bytes for nothing
        # the client's own marks: (item index, lifetime in seconds); -1 for those on tools and system
        client = [(-1, t) for t in wire.fixed_marks(conv.body)]
        for n, m in enumerate(msgs):
            if wire.has_breakpoint(m):
                client += [(n, t) for t in wire.marks(m)] or [(n, MARK_TTL_SECONDS["5m"])]
        budget = self.settings.max_breakpoints - len(client)
        end = len(msgs) - 1
        if end >= 0 and is_status(wire, msgs[end]):
            end -= 1
        head = system_end(wire, msgs)
        kept = max((e.kept for e in conv.kinds(CompactionInEffect)), default=0)
        wanted = [i for i in (end, kept - 1, head - 1) if i >= 0]  # most valuable first
        out, unmarked = list(msgs), {}
        for i in dict.fromkeys(wanted):
            while i >= 0 and budget > 0:
                if wire.has_breakpoint(out[i]):
                    break
                new = wire.with_breakpoint(out[i], style, self._ttl(client, i))
                if new is not None:
                    unmarked[i] = msgs[i]
                    out[i] = new
                    budget -= 1
                    break
                i -= 1  # e.g. an assistant message with tool calls only: mark the one before
        if unmarked:
            conv.set_messages(out)
            conv.unmarked = unmarked

    def _ttl(self, client: list[tuple[int, int]], i: int) -> str | None:
        """The route's TTL, moved into what the client's marks allow around item `i`.

        Anthropic refuses a longer-lived breakpoint after a shorter-lived one: ours
        lives no longer than any client mark before it and no shorter than any after.
        """
        if not client:
            return self.settings.ttl
        want = MARK_TTL_SECONDS.get(self.settings.ttl or "5m", MARK_TTL_SECONDS["5m"])
        after = max((t for n, t in client if n > i), default=0)
        got = min(max(want, after), min((t for n, t in client if n < i), default=MARK_TTL_SECONDS["1h"]))
        return self.settings.ttl if got == want else next(k for k, v in MARK_TTL_SECONDS.items() if v == got)
