"""What one Responses WebSocket remembers, so a turn that names only its new items can be sent whole.

Over a WebSocket, Codex (and the API's WebSocket mode generally) sends a
later turn as `previous_response_id` plus the items that are new since that
response. The provider would keep the history with the socket; the proxy
answers over HTTP with `store: false`, so it keeps the history itself and
expands each such turn into the full input the client would have sent over
HTTP: the earlier turn's full input, that response's output items, then the
new items. Rewriting then sees the whole conversation, as on the HTTP path,
and the same history becomes the same upstream bytes however it arrived.

Only a few of the latest responses are kept (a client chains from the last
one; a fork from an earlier one is rare), within the socket's byte budget
counted over all of them (the oldest go first), and none whose history alone
passes it: such a turn is then forwarded as sent, as the HTTP path forwards an
id it does not hold.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

KEPT_RESPONSES = 4  # responses of one socket a later turn may chain from


@dataclass(frozen=True)
class Held:
    """One response's whole history: the input it answered (in full) and the output items it added."""

    items: tuple[Any, ...]  # input then output; item objects are shared with the turns before, never copied
    size: int  # bytes of history it stands for (the JSON of every frame and output that built it)


class SocketHistory:
    """The histories of one socket's latest responses, bounded in count and in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held: OrderedDict[str, Held] = OrderedDict()

    def expand(self, body: dict[str, Any], frame_size: int) -> tuple[dict[str, Any], Held | None, int]:
        """The body to send, the history it continues (None: sent as it came) and its history's size.

        A `previous_response_id` held here is replaced by the history it names; one not held stays, and
        the provider answers it as over HTTP (it may hold that response itself).
        """
        prev = body.get("previous_response_id")
        held = self._held.get(prev) if isinstance(prev, str) else None
        if held is None:
            return body, None, frame_size
        new = body.get("input", [])
        if isinstance(new, str):  # the API's shorthand for one user message
            new = [{"role": "user", "content": new}]
        if not isinstance(new, list):
            return body, None, frame_size  # malformed: the request path refuses it in the API's words
        whole = {k: v for k, v in body.items() if k != "previous_response_id"}
        whole["input"] = [*held.items, *new]
        self._held.move_to_end(prev)  # type: ignore[arg-type]
        return whole, held, held.size + frame_size

    def remember(self, response_id: str, sent_input: Any, output: list[Any], size: int) -> bool:
        """Keep `response_id`'s history (the full input it answered, plus its output); False past the budget."""
        if not isinstance(sent_input, list):
            sent_input = [{"role": "user", "content": sent_input}] if isinstance(sent_input, str) else []
        if size > self.max_bytes:
            self._held.pop(response_id, None)
            return False
        self._held[response_id] = Held((*sent_input, *output), size)
        self._held.move_to_end(response_id)
        while len(self._held) > KEPT_RESPONSES or sum(h.size for h in self._held.values()) > self.max_bytes:
            self._held.popitem(last=False)
        return True

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._held
