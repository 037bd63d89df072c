"""The two wire APIs a turn can be replayed in: chat completions and the Responses API.

Everything the turn-by-turn replay does that depends on the API lives here, so
``turns.replay_trace`` is the same loop for both:

* the request body of a turn (``body``): the chat corpus's ``messages[:i]``
  (after a client-side setting's transform) as it is, or converted into a
  Responses request (``responses_items.to_request``); a native Responses
  session's own input (``native.NativeTrace.body``);
* the endpoint (``path``);
* the request read back as chat messages (``view``): what the pairing,
  preview, summary and identifier checks look at, for the client's body and
  for the body the provider received alike;
* the mock's prompt chunks of a body (``chunks``: cache breaks, sizes);
* the provider's usage as (prompt, cached, completion) tokens (``billed``,
  one function: a proxy may make chat calls on a Responses turn or the
  reverse, each billed in its own shape).
"""

from __future__ import annotations

from typing import Any, Protocol

from bench.replay.native import NativeTrace
from bench.replay.responses_items import to_messages, to_request
from bench.replay.settings import Setting
from bench.replay.traces import Trace, request_body
from tests import mock_upstream as mu

AnyTrace = Trace | NativeTrace


class Api(Protocol):
    name: str
    path: str

    def body(self, trace: AnyTrace, i: int, setting: Setting | None = None, window: int = 0) -> dict[str, Any]:
        """The request the client sends at turn `i` (through `setting`'s client-side transform, if any)."""

    def view(self, body: Any) -> list[dict[str, Any]]:
        """The conversation of a request body as chat messages."""

    def chunks(self, body: dict[str, Any]) -> list[Any]:
        """The mock provider's prompt chunks of a request body."""


def _chat_body(trace: Trace, i: int, setting: Setting | None, window: int) -> dict[str, Any]:
    body = request_body(trace, i)
    if setting is not None and setting.transform is not None:
        body["messages"] = setting.transform(body["messages"], body.get("tools"), window)
    return body


class ChatApi:
    name = "chat"
    path = "/chat/completions"

    def body(self, trace: AnyTrace, i: int, setting: Setting | None = None, window: int = 0) -> dict[str, Any]:
        if not isinstance(trace, Trace):
            raise TypeError(f"{trace.name} is a Responses session: it replays in the Responses API only")
        return _chat_body(trace, i, setting, window)

    def view(self, body: Any) -> list[dict[str, Any]]:
        msgs = body.get("messages") if isinstance(body, dict) else None
        return msgs if isinstance(msgs, list) else []

    def chunks(self, body: dict[str, Any]) -> list[Any]:
        return mu.prompt_chunks(body)


class ResponsesApi:
    name = "responses"
    path = "/responses"

    def body(self, trace: AnyTrace, i: int, setting: Setting | None = None, window: int = 0) -> dict[str, Any]:
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


CHAT = ChatApi()
RESPONSES = ResponsesApi()
APIS: dict[str, Api] = {"chat": CHAT, "responses": RESPONSES}


def billed(usage: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens of a chat or a Responses usage object."""
    if "input_tokens" in usage:
        return (int(usage["input_tokens"]), int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0)),
                int(usage.get("output_tokens", 0)))
    return (int(usage["prompt_tokens"]), int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
            int(usage.get("completion_tokens", 0)))
