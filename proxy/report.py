"""What the proxy did to a request, as response headers and log fields."""

from __future__ import annotations

from proxy.conversation import Conversation
from proxy.prefix_check import PrefixCheck


def event_fields(conv: Conversation) -> dict[str, object]:
    kinds = [e.kind for e in conv.events]
    return {"events": kinds} if kinds else {}


def event_headers(conv: Conversation, check: PrefixCheck | None = None) -> dict[str, str]:
    out = {}
    offloads = [e for e in conv.events if e.kind == "offload"]
    if offloads:
        out["x-ctxproxy-offloaded"] = str(len(offloads))
        out["x-ctxproxy-tokens-saved"] = str(sum(e.detail["saved"] for e in offloads))
    for e in conv.events:
        if e.kind == "compaction":
            out["x-ctxproxy-compaction"] = str(e.detail["version"])
        elif e.kind == "compact":
            out["x-ctxproxy-compacted"] = e.detail["layer"]
            out["x-ctxproxy-tokens-before"] = str(e.detail["before"])
            out["x-ctxproxy-tokens-after"] = str(e.detail["after"])
            if e.detail.get("summary_rejected"):  # why the compaction fell back from a summary
                out["x-ctxproxy-summary-rejected"] = _header_text(e.detail["summary_rejected"])
        elif e.kind == "degraded":
            out["x-ctxproxy-degraded"] = "store-unavailable"
        elif e.kind == "status":
            out["x-ctxproxy-status-bar"] = "1"
    if check is not None:
        out["x-ctxproxy-cacheable-tokens"] = str(check.cacheable)
        if check.cause:
            out["x-ctxproxy-cache-break"] = check.cause
    return out


def _header_text(text: str, limit: int = 200) -> str:
    """One printable ASCII line: a header value may carry nothing else."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text)
    return clean[:limit]
