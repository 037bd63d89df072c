"""Turns as the proxy's items, and back: tool results lifted out of the user turn that carries them.

Anthropic's Messages and Google's Gemini API carry a turn's tool results as
blocks (parts) of one user turn. The transforms see a conversation as chat
does: an assistant item carrying its calls, then one item per tool result. So
at parse such a turn is split: each result block becomes an item of its own
(the client's block object itself), and each run of its other blocks one user
item. Every other turn is an item as it came.

At render, consecutive items of one role are joined into one turn (the APIs
want turns to alternate; they would combine them anyway), and a run that is
exactly the items one client turn was split into is emitted as that very
object: what no transform changed is the client's bytes. A `system` role item
the proxy made (a status bar or summary note configured as system) joins the
user turn it sits in; a client's own `system` message (Messages'
mid-conversation system messages, which Claude Code sends) stays a message of
its own, as it came.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Origins = dict[int, tuple[dict[str, Any], tuple[Any, ...]]]  # id(first item) -> (client turn, its items)
ORIGINS = "\x00ctxproxy.origins"  # body key of the split turns' origins; never serialized


@dataclass(frozen=True)
class Turns:
    """One API's spelling of turns: the field holding a turn's blocks, its model's role, what a result block is."""

    field: str  # "content" (Messages), "parts" (Gemini)
    model_role: str  # "assistant", "model"
    is_result: Callable[[Any], bool]  # a block that is a tool result
    is_block: Callable[[Any], bool]  # an item that is a result lifted out of its user turn, not a turn

    def turn_role(self, item: Any) -> str:
        """The turn an item belongs to: the user's or the model's."""
        if self.is_block(item):
            return "user"
        return self.model_role if item.get("role") == self.model_role else "user"

    def split(self, turns: list[Any]) -> tuple[list[Any], Origins]:
        """The items of the client's turns, and where each split turn's items came from."""
        items: list[Any] = []
        origins: Origins = {}
        for m in turns:
            blocks = m.get(self.field)
            if m.get("role") == "system":
                origins[id(m)] = (m, (m,))  # the client's own: rendered back as itself (`join`)
            if m.get("role", "user") != "user" or not isinstance(blocks, list) \
                    or not any(self.is_result(b) for b in blocks):
                items.append(m)
                continue
            parts: list[Any] = []
            rest: list[Any] = []
            for block in blocks:
                if self.is_result(block):
                    if rest:
                        parts.append({"role": m.get("role", "user"), self.field: rest})
                        rest = []
                    parts.append(block)
                else:
                    rest.append(block)
            if rest:
                parts.append({"role": m.get("role", "user"), self.field: rest})
            origins[id(parts[0])] = (m, tuple(parts))
            items.extend(parts)
        return items, origins

    def leading_system(self, items: list[Any]) -> int:
        """How many `system` items lead the list: a request the proxy makes (a summary) sends them as the API's
        own system prompt field."""
        lead = 0
        while lead < len(items) and not self.is_block(items[lead]) and items[lead].get("role") == "system":
            lead += 1
        return lead

    def _blocks(self, item: Any) -> list[Any]:
        if self.is_block(item):
            return [item]
        blocks = item.get(self.field)
        if isinstance(blocks, str):
            return [{"type": "text", "text": blocks}] if blocks else []
        return list(blocks) if isinstance(blocks, list) else []

    def join(self, items: list[Any], origins: Origins) -> list[Any]:
        """The turns of the items: alternating roles, the client's own objects wherever nothing changed."""
        out: list[Any] = []
        run: list[Any] = []
        role = ""

        def flush() -> None:
            if not run:
                return
            if len(run) == 1 and not self.is_block(run[0]) and run[0].get("role") in ("user", self.model_role):
                out.append(run[0])
                return
            origin = origins.get(id(run[0]))
            if origin is not None and len(origin[1]) == len(run) and all(a is b for a, b in zip(origin[1], run)):
                out.append(origin[0])
                return
            out.append({"role": role, self.field: [b for item in run for b in self._blocks(item)]})

        for item in items:
            if self._own_system(item, origins):  # a message of its own, between turns
                flush()
                run, role = [], ""
                out.append(item)
                continue
            r = self.turn_role(item)
            if r != role:
                flush()
                run, role = [], r
            run.append(item)
        flush()
        return out

    def _own_system(self, item: Any, origins: Origins) -> bool:
        """A `system` message the client sent (not one a transform made): `split` recorded it as its own origin."""
        return not self.is_block(item) and item.get("role") == "system" and origins.get(id(item), (None,))[0] is item
