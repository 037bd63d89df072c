"""The text marks the proxy writes into a prompt, so any transform (and accounting) can recognise its own."""

import re

PLACEHOLDER_MARK = "[ctxproxy:"  # opens every placeholder; such text is never cleared or offloaded again
STATUS_OPEN = "<agent_status>"  # opens the status bar's message
SUMMARY_OPEN = "<context_summary>"  # opens a compaction summary
SYNTHETIC_RESULT = "[ctxproxy: no result was recorded for this tool call]"  # a call's missing result, filled in

# Kinds of messages the proxy writes: each transform names what it writes as it writes it (Conversation.wrote),
# and a compaction's record keeps the kinds of its prefix, so accounting never reads a kind back from wording.
OFFLOAD, CLEARED, SUMMARY, ARCHIVE, SYNTHETIC, STATUS, REWRITTEN = (
    "offload", "cleared", "summary", "archive", "synthetic", "status", "rewritten")


def legacy_kind(text: str) -> str:
    """The kind of a message the proxy wrote, read from its opening: only for a compaction recorded before
    records kept their kinds, and for a status a client sent back (its own copy of the proxy's text)."""
    if text.startswith(STATUS_OPEN):
        return STATUS
    if text.startswith(SUMMARY_OPEN):
        return SUMMARY
    if text == SYNTHETIC_RESULT:
        return SYNTHETIC
    if text.startswith(PLACEHOLDER_MARK):
        first = text.split("\n", 1)[0]
        if first.startswith(PLACEHOLDER_MARK + " cleared tool result"):
            return CLEARED
        if " were archived " in first:
            return ARCHIVE
        if " stored whole (" in first:
            return OFFLOAD
    return REWRITTEN


_HANDLE = re.compile(r'handle="(ctx_[0-9a-f]{20})"')


def legacy_written(text: str) -> tuple[str, str | None] | None:
    """(kind, handle) of a message read from its text, None for the client's own: for the prefix of a compaction
    recorded before records kept their kinds."""
    kind = legacy_kind(text)
    if kind == REWRITTEN:
        return None
    m = _HANDLE.search(text)
    return kind, m.group(1) if m else None
