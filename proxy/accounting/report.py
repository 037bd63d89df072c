"""What the proxy did to a request, as response headers and log fields.

Headers say what *this* request did (`-offloaded-new`, `-tokens-saved`,
`-compacted`) apart from what is in effect in it (`-offloaded`: the offload
placeholders it carries, most of them written by earlier requests); they come
from the request's Figures, as the timeline and the counters do. Every size of
a prompt (`-prompt-tokens`, `-tokens-before/after`) is the one definition of
proxy/request.py `prompt_tokens`; the answer's reserve is its own header.
"""

from __future__ import annotations

from proxy.accounting.figures import Figures
from proxy.accounting.prefix_check import PrefixCheck
from proxy.request import Conversation
from proxy.request.events import (
    ClientCompacts,
    CompactionInEffect,
    Degraded,
    HistoryElsewhere,
    StatusAdded,
    StatusSkipped,
    StoreWaited,
)


def event_fields(conv: Conversation) -> dict[str, object]:
    """The request's events for its log line, and the time it waited for the store (part of its overhead, never
    of the provider's time)."""
    kinds = [e.kind for e in conv.events]
    out: dict[str, object] = {"events": kinds} if kinds else {}
    waited = sum(e.ms for e in conv.events if isinstance(e, StoreWaited))
    if waited:
        out["store_wait_ms"] = round(waited, 3)
    return out


def event_headers(conv: Conversation, figures: Figures, check: PrefixCheck | None = None) -> dict[str, str]:
    out = {}
    if figures.placeholders or figures.offloads_new:
        out["x-ctxproxy-offloaded"] = str(figures.placeholders)
        out["x-ctxproxy-offloaded-new"] = str(len(figures.offloads_new))
    out["x-ctxproxy-tokens-saved"] = str(figures.saved)
    out["x-ctxproxy-prompt-tokens"] = str(figures.sent_tokens)
    if figures.compacted:
        d = figures.compaction_detail
        sizes = figures.compaction_sizes()
        out["x-ctxproxy-compacted"] = figures.compacted
        out["x-ctxproxy-tokens-before"] = str(sizes["tokens_before"])
        out["x-ctxproxy-tokens-after"] = str(sizes["tokens_after"])
        if figures.reserve:  # what the trigger counts beside the prompt
            out["x-ctxproxy-output-reserve"] = str(figures.reserve)
        if d.get("summary_rejected"):  # why the compaction fell back from a summary
            out["x-ctxproxy-summary-rejected"] = _header_text(d["summary_rejected"])
    for e in conv.events:
        if isinstance(e, CompactionInEffect):
            out["x-ctxproxy-compaction"] = str(e.version)
        elif isinstance(e, Degraded):
            out["x-ctxproxy-degraded"] = e.header
        elif isinstance(e, StatusAdded):
            out["x-ctxproxy-status-bar"] = "1"
        elif isinstance(e, StatusSkipped):  # why this request has no status bar
            out["x-ctxproxy-status-bar"] = _header_text(f"skipped: {e.reason}")
        elif isinstance(e, HistoryElsewhere):
            out["x-ctxproxy-compress"] = "unavailable: the provider holds the history (previous_response_id)"
        elif isinstance(e, StoreWaited):
            out["x-ctxproxy-store-wait-ms"] = str(round(e.ms))
        elif isinstance(e, ClientCompacts):
            out["x-ctxproxy-compress"] = "skipped: the client compacts this request itself (compaction_trigger)"
    if check is not None and check.measured:
        out["x-ctxproxy-cacheable-tokens"] = str(check.cacheable)
        if check.cause:
            out["x-ctxproxy-cache-break"] = check.cause
    return out


def _header_text(text: str, limit: int = 200) -> str:
    """One printable ASCII line: a header value may carry nothing else."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text)
    return clean[:limit]
