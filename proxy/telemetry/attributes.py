"""Span attributes from what accounting measured: the same figures /ctx/v1 shows, never message content.

Pure functions (no OpenTelemetry import): the GenAI semantic conventions'
names for the model and its usage, ctxproxy's own for what it did. A figure
the timeline leaves empty (None: a request the provider did not accept has no
tokens saved) is left out, as OpenTelemetry attributes cannot be null.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.request.flow import Flow
    from proxy.wire.usage import Usage

Attributes = dict[str, Any]


def usage_attributes(usage: Usage | None) -> Attributes:
    """gen_ai.usage.*: input tokens include the cached ones (as the conventions ask), as Usage.prompt does."""
    if usage is None:
        return {}
    out: Attributes = {"gen_ai.usage.input_tokens": usage.prompt, "gen_ai.usage.output_tokens": usage.completion}
    if usage.cached is not None:
        out["gen_ai.usage.cache_read.input_tokens"] = usage.cached
    if usage.cache_write is not None:
        out["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write
    return out


def request_attributes(flow: Flow) -> Attributes:
    """The request span's figures once it ended: those of the timeline entry accounting recorded (`flow.entry`)."""
    ctx, e = flow.ctx, flow.entry
    if ctx is None or e is None:
        return {}
    ok = e["accepted"]
    out: Attributes = {
        "ctxproxy.request_id": ctx.request_id, "ctxproxy.route": ctx.route.name, "ctxproxy.session": ctx.session,
        "ctxproxy.tenant": ctx.tenant, "ctxproxy.offloads": e["offloaded"], "ctxproxy.offloads_new": e["offloaded_new"],
        "ctxproxy.compactions": e["compactions"], "ctxproxy.read_rounds": e["read_rounds"],
        "ctxproxy.own_calls": len(ctx.own_calls.made), "ctxproxy.degraded": e["degraded"],
        "ctxproxy.rewritten": flow.conv is not None and flow.conv.changed,
        "ctxproxy.cacheable_tokens": e["cacheable"] or 0,
        **usage_attributes(flow.usage),
    }
    if ctx.model:
        out["gen_ai.request.model"] = ctx.model
    if e["compacted"]:
        out["ctxproxy.compaction"] = e["compacted"]
    if ok:
        out.update({"ctxproxy.tokens_saved": e["saved"], "ctxproxy.tokens_saved.offload": e["saved_offload"],
                    "ctxproxy.tokens_saved.compress": e["saved_compress"], "ctxproxy.client_tokens": e["client_tokens"],
                    "ctxproxy.sent_tokens": e["sent_tokens"]})
        if e["break"]:
            out["ctxproxy.cache_break"] = e["break"]
    return out


def minus(total: Usage, parts: list[Usage]) -> Usage:
    """What the last call of a turn was billed: the turn's total less its hidden rounds'."""
    from proxy.wire.usage import Usage

    def sub(a: int | None, bs: list[int | None]) -> int | None:
        return None if a is None else max(0, a - sum(b or 0 for b in bs))

    return Usage(max(0, total.prompt - sum(p.prompt for p in parts)),
                 max(0, total.completion - sum(p.completion for p in parts)),
                 sub(total.cached, [p.cached for p in parts]), sub(total.cache_write, [p.cache_write for p in parts]))
