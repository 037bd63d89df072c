"""Text inside a message's content, for every API: a string, or a list of parts of which some carry text.

The three codecs differ only in which part types carry text (chat: any part
with a `text`; Responses: input_text / output_text; Messages: text blocks), so
reading a content's texts and writing the proxy's text into its first text part
are written once here, the types given.
"""

from __future__ import annotations

from typing import Any


def _is_text(part: Any, types: frozenset[str] | None) -> bool:
    if not (isinstance(part, dict) and isinstance(part.get("text"), str)):
        return False
    kind = part.get("type")  # from the client: a list or an object cannot be looked up in `types`
    return types is None or (isinstance(kind, str) and kind in types)


def texts(content: Any, types: frozenset[str] | None) -> list[str]:
    """The content's texts in order: the string itself, or each text part's text."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if _is_text(p, types)]
    return []


def with_first_text(content: list[Any], text: str, types: frozenset[str] | None) -> list[Any]:
    """The parts with `text` in the first text part (its other keys kept), the other text parts dropped."""
    out, placed = [], False
    for p in content:
        if _is_text(p, types):
            if not placed:
                out.append({**p, "text": text})
                placed = True
            continue
        out.append(p)
    return out


def joined(content: Any, types: frozenset[str] | None) -> str | None:
    """An item's text: a string content itself, or its text parts joined by newlines; None if it has none."""
    if isinstance(content, str):
        return content
    found = texts(content, types)
    return "\n".join(found) if found else None


def first(content: Any, types: frozenset[str] | None) -> str:
    """The first text of a content, where the proxy writes its own marks; "" if none."""
    found = texts(content, types)
    return found[0] if found else ""


def with_text_at(item: dict[str, Any], field: str, text: str, types: frozenset[str] | None) -> dict[str, Any]:
    """A copy of the item whose `field` content has `text` as its text (a string content is replaced whole)."""
    value = item.get(field)
    if not isinstance(value, list):
        return {**item, field: text}
    return {**item, field: with_first_text(value, text, types)}
