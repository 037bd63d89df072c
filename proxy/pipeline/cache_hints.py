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
messages (`conv.notes["unmarked"]`), so moving a marker is not a prefix break.
"""

from __future__ import annotations

import hashlib
from fnmatch import fnmatchcase
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from proxy.conversation import Conversation, RequestContext
from proxy.trajectory import is_status

ANTHROPIC_MARK = {"type": "ephemeral"}
OPENAI_BREAKPOINT = {"type": "prompt_cache_breakpoint"}


class CacheSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # auto: "session" when the upstream is OpenAI's API, else off (other servers may reject the field)
    prompt_cache_key: Literal["auto", "session", "tenant", "off"] = "auto"
    breakpoints: Literal["auto", "none", "openai", "anthropic"] = "auto"
    retention: str | None = None  # e.g. "24h": sent as prompt_cache_retention
    max_breakpoints: int = Field(default=4, ge=1)  # Anthropic allows 4 per request
    openai_breakpoint_models: tuple[str, ...] = ("gpt-5.6*",)  # models that cache only at markers
    anthropic_models: tuple[str, ...] = ("claude*", "*/claude*", "anthropic/*")


def cache_fields(settings: CacheSettings | None, body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
    """The cache-routing fields the agent's requests carry (the client's own first): the proxy's
    summarizer sends the same ones so its call lands where the agent's prefix is cached."""
    out = {k: body[k] for k in ("prompt_cache_key", "prompt_cache_retention") if k in body}
    if settings is None or not settings.enabled:
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


def _has_mark(m: dict[str, Any]) -> bool:
    content = m.get("content")
    return "cache_control" in m or (isinstance(content, list) and any(
        isinstance(p, dict) and ("cache_control" in p or p.get("type") == OPENAI_BREAKPOINT["type"]) for p in content))


def _marked(m: dict[str, Any], style: str) -> dict[str, Any] | None:
    content = m.get("content")
    if isinstance(content, str):
        parts: list[Any] = [{"type": "text", "text": content}]
    elif isinstance(content, list) and content:
        parts = list(content)
    else:
        return None  # nothing to hang a marker on (e.g. tool calls only)
    if style == "anthropic":
        if not isinstance(parts[-1], dict):
            return None
        parts[-1] = {**parts[-1], "cache_control": ANTHROPIC_MARK}
    else:
        parts.append(dict(OPENAI_BREAKPOINT))
    return {**m, "content": parts}


class CacheHints:
    name: ClassVar[str] = "cache"
    Settings: ClassVar[type[BaseModel]] = CacheSettings

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings

    def style(self, ctx: RequestContext) -> str:
        s = self.settings
        if s.breakpoints != "auto":
            return s.breakpoints
        model = ctx.model or ""
        if "anthropic" in ctx.route.upstream.base_url or any(fnmatchcase(model, g) for g in s.anthropic_models):
            return "anthropic"
        if any(fnmatchcase(model, g) for g in s.openai_breakpoint_models):
            return "openai"
        return "none"

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        body = conv.body
        for name, value in cache_fields(self.settings, body, ctx).items():
            if name not in body:
                body[name] = value
                conv.changed = True
        style = self.style(ctx)
        if style != "none":
            self._mark(conv, style)
        return conv

    def _mark(self, conv: Conversation, style: str) -> None:
        msgs = conv.messages
        budget = self.settings.max_breakpoints - sum(1 for m in msgs if _has_mark(m))
        end = len(msgs) - 1
        if end >= 0 and is_status(msgs[end]):
            end -= 1
        head = 0
        while head < len(msgs) and msgs[head].get("role") in ("system", "developer"):
            head += 1
        kept = conv.notes.get("compaction_kept", 0)
        wanted = [i for i in (end, kept - 1, head - 1) if i >= 0]  # most valuable first
        out, unmarked = list(msgs), {}
        for i in dict.fromkeys(wanted):
            while i >= 0 and budget > 0:
                if _has_mark(out[i]):
                    break
                new = _marked(out[i], style)
                if new is not None:
                    unmarked[i] = msgs[i]
                    out[i] = new
                    budget -= 1
                    break
                i -= 1  # e.g. an assistant message with tool calls only: mark the one before
        if unmarked:
            conv.set_messages(out)
            conv.notes["unmarked"] = unmarked
