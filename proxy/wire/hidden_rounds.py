"""What the Responses and Messages codecs' hidden read rounds share: the round counter and reading an answer.

Each codec runs its own rounds (its own shapes of a call, a result and a
stream, proxy/wire/responses/rounds.py, proxy/wire/messages/rounds.py); the
bookkeeping and the rule for a non-streamed answer are the same: a first
answer the loop cannot read reaches the client as it came, an unusable answer
to a hidden round is refused (HiddenRoundFailed), never relayed.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from proxy.request import Conversation, ReadTool
from proxy.store.archive import Archive
from proxy.upstream.client import read_body
from proxy.wire.chat.reply import hidden_failure, provider_error
from proxy.wire.usage import Usage, summed


class HiddenRounds:
    """The hidden rounds of one client request: how many, and what the provider billed for each."""

    def __init__(self, conv: Conversation, tool: ReadTool, archive: Archive) -> None:
        self.conv, self.tool, self.archive = conv, tool, archive
        self.messages = list(conv.messages)  # the items as they grow (what accounting reads as the rounds)
        self.done = 0
        self.own: Usage | None = None
        self.usages: list[Usage] = []

    @property
    def last(self) -> bool:
        return self.done >= self.tool.max_rounds

    def add_own(self, usage: Usage | None) -> None:
        if usage is not None:
            self.own = usage if self.own is None else self.own + usage
            self.usages.append(usage)

    def summed_usage(self, final: Any) -> Any:
        """The final answer's usage with every hidden round's added, in the provider's own spelling."""
        raw = [u.raw for u in self.usages if u.raw is not None]
        return summed([*raw, final]) if raw and isinstance(final, dict) else final


def _is_error_body(content: bytes) -> bool:
    try:
        return provider_error(orjson.loads(content)) is not None
    except orjson.JSONDecodeError:
        return False


async def read_answer(resp: httpx.Response, url: str, hidden: bool, field: str, kind: str,
                      type_: str | None = None) -> tuple[bytes, dict[str, Any] | None]:
    """A non-streamed answer's body, and its JSON when it is a 200 whose `field` is a list (and whose `type` is
    `type_`, where the API names its objects so) - else None: the answer goes to the client as it came. In a
    hidden round anything else but a provider's error is refused."""
    content = await read_body(resp, url)
    ctype = resp.headers.get("content-type", "")
    if resp.status_code != 200:
        if hidden and not _is_error_body(content):
            raise hidden_failure(resp.status_code, content, ctype, "an error status without an error body")
        return content, None
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get(field), list) \
            or (type_ is not None and data.get("type") != type_):
        if hidden:
            raise hidden_failure(resp.status_code, content, ctype, f"not {kind}")
        return content, None
    return content, data
