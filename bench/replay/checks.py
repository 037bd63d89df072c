"""Checks on every request the provider received: tool-call pairing, and that previews only shrink.

``tool_pairing_problems`` is reusable on any list of messages; ``RewriteCheck``
accumulates, over one trajectory, what ctxproxy replaced by placeholders and
whether anything else was altered.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from tests import mock_upstream as mu

PLACEHOLDER_MARK = 'context_read(handle="'  # also matches the alternate names (ctxproxy_context_read...)


def tool_pairing_problems(messages: list[dict[str, Any]], strict: bool = False) -> list[str]:
    """What is wrong with the tool-call pairing of one request's messages ([] = valid).

    Each tool call id of an assistant message must be answered by a tool message
    after it and before the next assistant message (or the end of the request);
    each tool message must answer a call of the latest assistant message, once.
    `strict` adds OpenAI's stricter rule: the answers follow the call immediately,
    with no other message between them.
    """
    problems: list[str] = []
    open_at = -1  # index of the assistant message whose calls are being answered
    calls: set[str] = set()
    pending: set[str] = set()
    for j, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            if pending:
                problems.append(f"messages[{open_at}]: tool call(s) {sorted(pending)} unanswered "
                                f"before the next assistant message [{j}]")
            ids = [c.get("id") for c in m.get("tool_calls") or [] if isinstance(c, dict)]
            if len(set(ids)) != len(ids):
                problems.append(f"messages[{j}]: duplicate tool call ids {ids}")
            if any(not isinstance(x, str) or not x for x in ids):
                problems.append(f"messages[{j}]: tool call without an id")
            open_at, calls, pending = j, {x for x in ids if isinstance(x, str)}, {x for x in ids if isinstance(x, str)}
        elif role == "tool":
            tid = m.get("tool_call_id")
            if tid not in calls:
                problems.append(f"messages[{j}]: tool message for {tid!r} answers no call of the "
                                f"preceding assistant message [{open_at}]")
            elif tid not in pending:
                problems.append(f"messages[{j}]: second tool message for {tid!r}")
            else:
                pending.discard(tid)
        elif strict and pending:
            problems.append(f"messages[{j}]: {role} message between tool call(s) {sorted(pending)} "
                            f"of [{open_at}] and their results")
    if pending:
        problems.append(f"messages[{open_at}]: tool call(s) {sorted(pending)} unanswered at the end of the request")
    return problems


def content_text(content: Any) -> str:
    """The text of a message's content (a string, or the text parts of a list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def message_tokens(message: dict[str, Any]) -> int:
    """Tokens the mock provider bills for one message (its own rendering and o200k_base)."""
    return len(mu.tokens(mu.render_message(message)))


def digest(message: Any) -> str:
    """A stable digest of a message (its JSON, keys sorted)."""
    return hashlib.blake2b(json.dumps(message, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass"),
                           digest_size=12).hexdigest()


@dataclass
class RewriteCheck:
    """Accumulates the preview / transparency checks over the requests of one trajectory."""

    thresholds: tuple[int, int] | None  # (tool, user) offload thresholds of the setting, if any
    rewritten: dict[int, set[str]] = field(default_factory=dict)  # position -> digests of its placeholders
    sizes: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # position -> (orig, new, role)
    larger: list[dict[str, Any]] = field(default_factory=list)  # preview >= original (violations)
    altered: list[dict[str, Any]] = field(default_factory=list)  # changed without a placeholder
    missing_read_tool: list[dict[str, Any]] = field(default_factory=list)  # placeholder, but no tools offered
    length_mismatch: list[dict[str, Any]] = field(default_factory=list)
    messages_checked: int = 0

    def check(self, turn: int, original: list[dict[str, Any]], sent: dict[str, Any]) -> None:
        """`original` = the client's messages[:turn]; `sent` = the body the provider received."""
        upstream = sent.get("messages") or []
        if len(upstream) < len(original):
            self.length_mismatch.append({"turn": turn, "client": len(original), "provider": len(upstream)})
        has_tools = bool(sent.get("tools"))
        for j, (orig, new) in enumerate(zip(original, upstream)):
            self.messages_checked += 1
            if new == orig:
                continue
            text, before = content_text(new.get("content")), content_text(orig.get("content"))
            if PLACEHOLDER_MARK in text and PLACEHOLDER_MARK not in before:
                self.rewritten.setdefault(j, set()).add(digest(new))
                if j not in self.sizes:
                    self.sizes[j] = (message_tokens(orig), message_tokens(new), str(orig.get("role")))
                o, n, role = self.sizes[j]
                if n >= o:
                    self.larger.append({"turn": turn, "position": j, "role": role, "original_tokens": o,
                                        "preview_tokens": n})
                if not has_tools:
                    self.missing_read_tool.append({"turn": turn, "position": j})
                rest_new = {k: v for k, v in new.items() if k != "content"}
                rest_orig = {k: v for k, v in orig.items() if k != "content"}
                if rest_new != rest_orig:
                    self.altered.append({"turn": turn, "position": j,
                                         "what": "non-content fields of a rewritten message"})
            else:
                self.altered.append({"turn": turn, "position": j, "role": orig.get("role"),
                                     "what": "changed without a placeholder"})

    def missed(self, messages: list[dict[str, Any]], last_turn: int) -> list[dict[str, Any]]:
        """Messages sent at least once, clearly over the threshold (mock tokens > 1.1 x), never offloaded."""
        if self.thresholds is None:
            return []
        tool_t, user_t = self.thresholds
        out = []
        for j, m in enumerate(messages[:last_turn]):
            limit = tool_t if m.get("role") in ("tool", "function") else user_t if m.get("role") == "user" else None
            if limit is None or j in self.rewritten:
                continue
            n = message_tokens(m)
            if n > limit * 1.1:
                out.append({"position": j, "role": m.get("role"), "tokens": n})
        return out

    def summary(self) -> dict[str, Any]:
        """The check's findings over the trajectory."""
        ratios = [n / o for o, n, _ in self.sizes.values() if o]
        return {
            "messages_checked": self.messages_checked,
            "rewritten_messages": len(self.rewritten),
            "original_tokens": sum(o for o, _, _ in self.sizes.values()),
            "preview_tokens": sum(n for _, n, _ in self.sizes.values()),
            "max_preview_share": round(max(ratios), 4) if ratios else None,
            "detail": [{"position": j, "role": role, "original_tokens": o, "preview_tokens": n}
                       for j, (o, n, role) in sorted(self.sizes.items())],
            "preview_not_smaller": self.larger,
            "unstable_rewrites": sorted(j for j, d in self.rewritten.items() if len(d) > 1),
            "altered_without_placeholder": self.altered,
            "placeholder_without_read_tool": self.missing_read_tool,
            "fewer_messages_upstream": self.length_mismatch,
        }
