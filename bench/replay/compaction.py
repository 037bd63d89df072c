"""Compacted history in the requests the provider served: which message it is, its size, what it lost.

The marks of each proxy's compacted-history message (ctxproxy's summary and
archive note, cliffcompaction's summary, ctxkeeper's notes), and, for
ctxproxy, why an identifier the trajectory named is missing from its last
request (judged with the identifier regex of the proxy under test).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from bench import identifiers as idents
from bench.paths import ROOT
from bench.replay.checks import content_text, message_tokens
from proxy.wire.chat.codec import CHAT
from tests import mock_upstream as mu

IDENTIFIER_HEADING = "\n## Identifiers (verbatim from the compacted messages)\n"  # ctxproxy's summary layout
# The proxy module (under the proxy's source directory) whose IDENTIFIER regex, _TRAILING and text_of decide what
# its summaries list; read by file, from the proxy under test, not imported from the working tree.
PROXY_HISTORY_FILE = os.path.join("proxy", "rewrite", "compress", "history.py")
SUMMARY_MARKS = ("<context_summary>",  # ctxproxy layer 2
                 "[ctxproxy:",  # ctxproxy archive fallback (a span behind a placeholder)
                 "The following is a summary of your previous actions",  # cliffcompaction
                 "[[NOTES kept by the context keeper")  # ctxkeeper


def is_status(m: dict[str, Any]) -> bool:
    """A status-bar message of ctxproxy (``<agent_status>``), set aside when lining requests up with the client's."""
    return m.get("role") == "user" and isinstance(m.get("content"), str) and m["content"].startswith("<agent_status>")


def chunks_common(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> int:
    """Tokens of the common prefix of two prompts given as chunks (the mock's rendering)."""
    n = 0
    for x, y in zip(a, b):
        if x == y:
            n += len(x)
            continue
        n += mu.common_prefix_len(x, y)
        break
    return n


def summary_stats(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The compacted-history message of a request (summary / notes / archive note), with its size."""
    for j, m in enumerate(messages):
        text = content_text(m.get("content"))
        if m.get("role") == "user" and text.startswith(SUMMARY_MARKS):
            out: dict[str, Any] = {"position": j, "tokens": message_tokens(m), "chars": len(text)}
            if text.startswith("<context_summary>"):
                body, _, listing = text.partition(IDENTIFIER_HEADING)
                listing = listing.rsplit("\n</context_summary>", 1)[0]
                ids = [x for x in listing.splitlines() if x.strip()]
                out.update(kind="summary", identifiers_listed=len(ids),
                           identifier_tokens=len(mu.tokens("\n".join(ids))) if ids else 0,
                           digest_tokens=len(mu.tokens(body)))
            elif text.startswith("[ctxproxy:"):
                out["kind"] = "archive"
            else:
                out["kind"] = "notes" if text.startswith("[[NOTES") else "cliff-summary"
            return out
    return None


def identifier_listing(messages: list[dict[str, Any]]) -> str:
    """The code-written identifier list of the last ctxproxy summary among `messages` ("" when there is none)."""
    listing = ""
    for m in messages:
        text = content_text(m.get("content"))
        if text.startswith("<context_summary>"):
            listing = text.partition(IDENTIFIER_HEADING)[2]
    return listing


def diagnose_lost(lost: list[str], raw: list[dict[str, Any]], sent: list[dict[str, Any]],
                  history: Any) -> dict[str, Any]:
    """Why ctxproxy's last request lacks an identifier the raw trajectory named (diagnosis only).

    `history` is the proxy's own proxy/rewrite/compress/history.py module (loaded from the proxy under test), whose
    identifier regex decides what its code-written list can hold: an identifier it does not match can only survive in
    the model-written part or verbatim. Categories: `proxy regex misses it` (no match of the proxy's regex in any
    message naming it, exactly as written), `matched, not listed` (the regex finds it but the last summary's list
    does not have it: cap, token budget, or dropped at a later compaction), `no summary` (compacted without one).
    """
    listing = identifier_listing(sent)
    listed = set(x.strip() for x in listing.splitlines())
    out: dict[str, list[str]] = {"proxy regex misses it": [], "matched, not listed": [], "no summary": []}
    for ident in lost:
        if not listing:
            out["no summary"].append(ident)
            continue
        proxy_ids = set()
        for m in raw:
            if ident in idents.named_text(m) or ident in history.text_of(CHAT, m):
                proxy_ids.update(x.group(0).rstrip(history._TRAILING)
                                 for x in history.IDENTIFIER.finditer(history.text_of(CHAT, m)))
        if ident in proxy_ids or any(ident in x for x in proxy_ids):
            out["matched, not listed"].append(ident)
        else:
            out["proxy regex misses it"].append(ident)
    out["listed_count"] = len(listed)  # type: ignore[assignment]
    return out


def load_proxy_history(src: str | None) -> Any:
    """proxy/rewrite/compress/history.py of the proxy under test (standalone module), for diagnosing lost identifiers.

    `src`: the directory holding the proxy package (--proxy-src); default the repository's."""
    path = os.path.join(src or ROOT, PROXY_HISTORY_FILE)
    spec = importlib.util.spec_from_file_location("ctxproxy_history_under_test", path)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception:
        return None
    return mod if hasattr(mod, "IDENTIFIER") else None
