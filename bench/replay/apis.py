"""The wire APIs a turn can be replayed in: chat completions, the Responses API and Anthropic's Messages API.

Everything the turn-by-turn replay does that depends on the API lives here, so
``turns.replay_trace`` is the same loop for both:

* the request body of a turn (``body``): the chat corpus's ``messages[:i]``
  (after a client-side setting's transform) as it is, or converted into a
  Responses request (``responses_items.to_request``) or a Messages request
  (``messages_items.to_request``); a native session's own input
  (``native.NativeTrace.body``, ``native.NativeMessagesTrace.body``);
* the endpoint (``path``) and the credentials' headers (``headers``: Messages
  sends ``x-api-key`` and ``anthropic-version``);
* the request read back as chat messages (``view``): what the pairing,
  preview, summary and identifier checks look at, for the client's body and
  for the body the provider received alike;
* the mock's prompt chunks of a body (``chunks``: cache breaks, sizes);
* the provider's usage as (prompt, cached, completion) tokens (``billed``,
  one function: a proxy may make chat calls on a Responses turn or the
  reverse, each billed in its own shape), and the cache writes Anthropic bills
  apart (``cache_written``).
"""

from __future__ import annotations

from typing import Any, Protocol

from bench.replay import messages_items
from bench.replay.native import NativeMessagesTrace, NativeTrace
from bench.replay.responses_items import to_messages, to_request
from bench.replay.settings import Setting
from bench.replay.traces import Trace, request_body
from tests import mock_upstream as mu

AnyTrace = Trace | NativeTrace | NativeMessagesTrace


class Api(Protocol):
    name: str
    path: str

    def body(self, trace: AnyTrace, i: int, setting: Setting | None = None, window: int = 0) -> dict[str, Any]:
        """The request the client sends at turn `i` (through `setting`'s client-side transform, if any)."""

    def view(self, body: Any) -> list[dict[str, Any]]:
        """The conversation of a request body as chat messages."""

    def chunks(self, body: dict[str, Any]) -> list[Any]:
        """The mock provider's prompt chunks of a request body."""

    def headers(self, key: str) -> dict[str, str]:
        """The headers that carry the client's key (and the API version) in this API."""


def _chat_body(trace: Trace, i: int, setting: Setting | None, window: int) -> dict[str, Any]:
    body = request_body(trace, i)
    if setting is not None and setting.transform is not None:
        body["messages"] = setting.transform(body["messages"], body.get("tools"), window)
    return body


class ChatApi:
    name = "chat"
    path = "/chat/completions"

    def headers(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    def body(self, trace: AnyTrace, i: int, setting: Setting | None = None, window: int = 0) -> dict[str, Any]:
        if not isinstance(trace, Trace):
            raise TypeError(f"{trace.name} is a native session: it replays in its own API only")
        return _chat_body(trace, i, setting, window)

    def view(self, body: Any) -> list[dict[str, Any]]:
        msgs = body.get("messages") if isinstance(body, dict) else None
        return msgs if isinstance(msgs, list) else []

    def chunks(self, body: dict[str, Any]) -> list[Any]:
        return mu.prompt_chunks(body)


class ResponsesApi:
    name = "responses"
    path = "/responses"

    def headers(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    def body(self, trace: AnyTrace, i: int, setting: Setting | None = None, window: int = 0) -> dict[str, Any]:
        if isinstance(trace, NativeMessagesTrace):
            raise TypeError(f"{trace.name} is a Messages session: it replays in the Messages API only")
        if isinstance(trace, NativeTrace):
            if setting is not None and setting.transform is not None:
                raise TypeError(f"setting {setting.name} transforms chat messages; {trace.name} has none")
            return trace.body(i)
        return to_request(_chat_body(trace, i, setting, window))

    def view(self, body: Any) -> list[dict[str, Any]]:
        if not isinstance(body, dict):
            return []
        msgs = body.get("messages")
        if "input" not in body and isinstance(msgs, list):  # a chat call the proxy made
            return msgs
        return to_messages(body.get("input"), body.get("instructions"))

    def chunks(self, body: dict[str, Any]) -> list[Any]:
        return mu.responses_prompt_chunks(body)


class MessagesApi:
    name = "messages"
    path = "/messages"

    def body(self, trace: AnyTrace, i: int, setting: Setting | None = None, window: int = 0) -> dict[str, Any]:
        if isinstance(trace, NativeTrace):
            raise TypeError(f"{trace.name} is a Responses session: it replays in the Responses API only")
        if isinstance(trace, NativeMessagesTrace):
            if setting is not None and setting.transform is not None:
                raise TypeError(f"setting {setting.name} transforms chat messages; {trace.name} has none")
            return trace.body(i)
        return messages_items.to_request(_chat_body(trace, i, setting, window))

    def view(self, body: Any) -> list[dict[str, Any]]:
        if isinstance(body, dict) and not messages_items.is_messages_body(body) and isinstance(
                body.get("messages"), list) and any(isinstance(m, dict) and m.get("role") in ("tool", "system")
                                                    or "tool_calls" in m for m in body["messages"]):
            return body["messages"]  # a chat call (not one the replay sends; kept readable all the same)
        return messages_items.to_messages(body)

    def chunks(self, body: dict[str, Any]) -> list[Any]:
        return mu.messages_prompt_chunks(body)

    def headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key, "anthropic-version": messages_items.ANTHROPIC_VERSION}


CHAT = ChatApi()
RESPONSES = ResponsesApi()
MESSAGES = MessagesApi()
APIS: dict[str, Api] = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}


def cache_written(usage: dict[str, Any]) -> int:
    """Tokens written to the cache, where the provider bills them apart (Anthropic's cache_creation_input_tokens)."""
    return int(usage.get("cache_creation_input_tokens") or 0)


def billed(usage: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens of a chat, Responses or Messages usage object (Messages: the prompt is
    input_tokens + cache_read_input_tokens + cache_creation_input_tokens, cached the reads)."""
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        read, written = int(usage.get("cache_read_input_tokens") or 0), cache_written(usage)
        return int(usage.get("input_tokens") or 0) + read + written, read, int(usage.get("output_tokens", 0))
    if "input_tokens" in usage:
        return (int(usage["input_tokens"]), int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0)),
                int(usage.get("output_tokens", 0)))
    return (int(usage["prompt_tokens"]), int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
            int(usage.get("completion_tokens", 0)))
