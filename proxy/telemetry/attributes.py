"""Span attributes from what accounting measured: the same figures /ctx/v1 shows, never message content.

Pure functions (no OpenTelemetry import): the GenAI semantic conventions'
names for the model and its usage, ctxproxy's own for what it did. A figure
the timeline leaves empty (None: a request the provider did not accept has no
tokens saved) is left out, as OpenTelemetry attributes cannot be null.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.accounting.prefix_check import expiry_cause

if TYPE_CHECKING:
    from proxy.accounting.ledger import Ledger
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


def request_attributes(ledger: Ledger) -> Attributes:
    """The request span's figures once its ledger is closed: those of its timeline entry (accountant._entry)."""
    ctx, f, check, o = ledger.ctx, ledger.figures, ledger.check, ledger.outcome
    ok, u = o.accepted, o.usage
    out: Attributes = {
        "ctxproxy.request_id": ctx.request_id, "ctxproxy.route": ctx.route.name, "ctxproxy.session": ctx.session,
        "ctxproxy.tenant": ctx.tenant, "ctxproxy.offloads": f.placeholders,
        "ctxproxy.offloads_new": len(f.offloads_new),
        "ctxproxy.compactions": len(f.compactions),
        "ctxproxy.read_rounds": ledger.rounds.done if ledger.rounds is not None else 0,
        "ctxproxy.own_calls": len(o.own), "ctxproxy.degraded": f.degraded, "ctxproxy.rewritten": ledger.conv.changed,
        **usage_attributes(u),
    }
    cacheable = ledger.closed.get("cacheable") if ledger.closed is not None else None
    if cacheable is None:  # not measured (the provider holds the history), or not closed yet: the turn's figure
        cacheable = ledger.cacheable(o.status or 0) if ok else 0
    out["ctxproxy.cacheable_tokens"] = cacheable or 0
    if ctx.model:
        out["gen_ai.request.model"] = ctx.model
    if f.compacted:
        out["ctxproxy.compaction"] = f.compacted
    if ok:
        out.update({"ctxproxy.tokens_saved": f.saved, "ctxproxy.tokens_saved.offload": f.saved_offload,
                    "ctxproxy.tokens_saved.compress": f.saved_compress, "ctxproxy.client_tokens": f.client_tokens,
                    "ctxproxy.sent_tokens": f.sent_tokens})
        cause = expiry_cause(check, u.cached if u else None)
        if cause:
            out["ctxproxy.cache_break"] = cause
    return out


def minus(total: Usage, parts: list[Usage]) -> Usage:
    """What the last call of a turn was billed: the turn's total less its hidden rounds'."""
    from proxy.wire.usage import Usage

    def sub(a: int | None, bs: list[int | None]) -> int | None:
        return None if a is None else max(0, a - sum(b or 0 for b in bs))

    return Usage(max(0, total.prompt - sum(p.prompt for p in parts)),
                 max(0, total.completion - sum(p.completion for p in parts)),
                 sub(total.cached, [p.cached for p in parts]), sub(total.cache_write, [p.cache_write for p in parts]))
