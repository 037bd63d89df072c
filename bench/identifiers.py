"""Identifiers an agent named (file paths, URLs, hashes) and whether a request still carries them.

Defined here for the benchmark, independently of the proxy's own list
(proxy/rewrite/compress/history.py), so the proxy is not graded by its own yardstick.

* URL: ``http(s)://`` up to whitespace, a quote, a bracket or a backslash.
* Hash: 7 to 64 lowercase hex characters between word boundaries, with at
  least one digit and one letter (git short and full hashes, sha256, ids).
* File path, in what is left once URLs are taken out: a run of path characters
  (letters, digits, ``_ . - + @ ~``) with at least one ``/`` inside, that
  starts with ``/``, ``./``, ``../`` or ``~/``, or has two slashes or more, or
  ends in a file extension (``.py``, ``.json``: 1-8 letters/digits after a dot,
  with a letter); or a bare file name with an extension from a list of common
  source/config ones (``setup.py``, ``README.md``). Trailing punctuation and
  a trailing ``/`` are dropped; ``and/or``-style pairs of short words and
  things without a letter are not paths.

What counts as *named by the agent*: the text of user and assistant messages,
with tool-call arguments decoded from their JSON string (so ``"cat
/testbed/a.py\\n"`` names ``/testbed/a.py``), in the trajectory up to the last
request the client sent. Presence in a request: the identifier occurs as a
substring of the text of any of its messages (any role; content, tool-call
arguments raw and decoded).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

URL_RE = re.compile(r"https?://[^\s\"'<>`\\)\]}|]+")
HASH_RE = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,64}\b")
_PCH = r"[\w.+@~-]"
PATH_RE = re.compile(rf"(?<![\w/.+@~-])(?:~|\.\.?)?/?{_PCH}+(?:/{_PCH}+)+/?|(?<![\w/.+@~-])/{_PCH}+")
# (no "env", "log", "patch", "in": `app.env`, `self.log`, `unittest.mock.patch` are attributes, not files)
_EXT = ("py|pyi|pyx|js|mjs|ts|tsx|jsx|go|rs|c|h|cc|cpp|hpp|java|kt|rb|php|cs|swift|sh|bash|toml|yaml|yml|json|md|"
        "rst|txt|cfg|ini|lock|html|css|sql|proto|xml|pony|ipynb|csv|png|jpg|pdf|zip|gz|tar")
FILE_RE = re.compile(rf"(?<![\w/.+@~-])[\w+@-][\w.+@-]*\.(?:{_EXT})\b(?![/\w])")
_TRAIL = ".,;:'\")]}!?`"
_FILE_EXT = re.compile(r"\.[A-Za-z0-9]{1,8}$")


def _clean(s: str) -> str:
    s = s.rstrip(_TRAIL)
    while s.endswith("/") and len(s) > 1:
        s = s[:-1].rstrip(_TRAIL)
    return s


def _is_path(p: str) -> bool:
    if not re.search(r"[A-Za-z]", p) or len(p) < 4:
        return False
    segs = [x for x in p.split("/") if x]
    if not segs:
        return False
    if p.startswith(("/", "./", "../", "~/")):
        # absolute: one segment is enough if it has an extension or it is a deeper path
        return len(segs) >= 2 or bool(_FILE_EXT.search(segs[-1])
                                      and re.search(r"[A-Za-z]", segs[-1].rsplit(".", 1)[-1]))
    if p.count("/") >= 2:
        return True
    last = segs[-1]
    ext = _FILE_EXT.search(last)
    if ext and re.search(r"[A-Za-z]", ext.group(0)) and len(last) > len(ext.group(0)):
        return True
    return False


def extract(text: str) -> list[str]:
    """Identifiers in one text, in order of first appearance, deduplicated."""
    seen: dict[str, None] = {}
    for m in URL_RE.finditer(text):
        u = _clean(m.group(0))
        if len(u) > 10:
            seen.setdefault(u, None)
    rest = URL_RE.sub(" ", text)
    for m in HASH_RE.finditer(rest):
        seen.setdefault(m.group(0), None)
    for m in PATH_RE.finditer(rest):
        p = _clean(m.group(0))
        if _is_path(p):
            seen.setdefault(p, None)
    for m in FILE_RE.finditer(rest):
        f = _clean(m.group(0))
        if len(f) >= 4 and re.search(r"[A-Za-z]", f.rsplit(".", 1)[0]):
            seen.setdefault(f, None)
    return list(seen)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _decoded(arguments: Any) -> str:
    """The string values of a tool call's JSON arguments, joined (the raw string if it is not JSON)."""
    if not isinstance(arguments, str):
        return json.dumps(arguments, ensure_ascii=False) if arguments is not None else ""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif v is not None:
            out.append(str(v))
    walk(value)
    return "\n".join(out)


def named_text(message: dict[str, Any]) -> str:
    """What a message names: its content and its tool calls' decoded arguments."""
    parts = [_content(message.get("content"))]
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            parts.append(_decoded(fn.get("arguments")))
    return "\n".join(p for p in parts if p)


def _message_blocks(content: Any) -> list[str]:
    """What Anthropic Messages blocks say beyond text: `tool_use` inputs (raw and decoded), `tool_result` contents."""
    out: list[str] = []
    for b in content if isinstance(content, list) else ():
        if not isinstance(b, dict):
            continue
        if b.get("type") == "tool_use":
            out += [json.dumps(b.get("input"), ensure_ascii=False), _decoded(json.dumps(b.get("input")))]
        elif b.get("type") == "tool_result":
            out.append(_content(b.get("content")))
    return out


def searchable_text(messages: Iterable[dict[str, Any]]) -> str:
    """Everything a request's messages say, for presence checks (raw and decoded arguments), in chat's shape
    or in Anthropic's (tool calls as `tool_use` blocks, results as `tool_result` blocks)."""
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        parts.append(_content(m.get("content")))
        parts += _message_blocks(m.get("content"))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                raw = fn.get("arguments")
                parts.append(raw if isinstance(raw, str) else json.dumps(raw))
                parts.append(_decoded(raw))
    return "\n".join(parts)


def head_end(messages: list[dict[str, Any]]) -> int:
    """Index after the leading system messages and the first user message."""
    i = 0
    while i < len(messages) and messages[i].get("role") in ("system", "developer"):
        i += 1
    if i < len(messages) and messages[i].get("role") == "user":
        i += 1
    return i


def named(messages: list[dict[str, Any]]) -> dict[str, int]:
    """Identifier -> index of the first user/assistant message naming it."""
    out: dict[str, int] = {}
    for i, m in enumerate(messages):
        if m.get("role") not in ("user", "assistant"):
            continue
        for ident in extract(named_text(m)):
            out.setdefault(ident, i)
    return out


def retention(raw: list[dict[str, Any]], sent: list[dict[str, Any]] | None, examples: int = 12) -> dict[str, Any]:
    """Of the identifiers `raw` names (user/assistant), how many occur in `sent` (the provider's last request).

    Also over the identifiers first named after the head (system + first user message), which a proxy that
    keeps the head verbatim cannot keep for free.
    """
    ids = named(raw)
    h = head_end(raw)
    text = searchable_text(sent or [])
    lost = [i for i in ids if i not in text]
    later = [i for i, at in ids.items() if at >= h]
    lost_later = [i for i in later if i not in text]
    return {"total": len(ids), "kept": len(ids) - len(lost), "after_head": len(later),
            "after_head_kept": len(later) - len(lost_later),
            "lost_examples": [{"id": i, "first_named_at": ids[i], "role": raw[ids[i]].get("role")}
                              for i in lost[:examples]],
            "lost": lost}
