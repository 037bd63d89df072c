"""What a client sees when something breaks, on each API the proxy serves: provider errors, dropped sockets,
streams cut mid-way or ending early, a dead or slow provider, malformed requests, a failing transform, a store
that goes away, SIGTERM.

Each test is one fault, named for what the user sees, written once and run for every API it applies to (the
table `APIS` below: the client's path, a body builder, and how that API says an error). Every error the proxy
makes itself is in the client's API's shape (OpenAI's `{"error": {...}}`, Anthropic's `{"type": "error", ...}`,
Google's `{"error": {"code", "message", "status"}}`; in a stream one last error event); every error the provider
makes reaches the client as it sent it. Misbehaving providers that the mock cannot imitate (a socket closed
mid-response, a short body) are a few lines of raw TCP on 127.0.0.1 (`RawUpstream`). Everything is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from proxy_server import InProcessProxy, make_settings
from silent_server import SilentServer

import proxy.store.guarded as guarded
from proxy.accounting.counters import timeline_key
from proxy.engine.routing import tenant_id
from proxy.store import open_store

HI = [{"role": "user", "content": "hi"}]
OFFLOAD = {"offload": {"tool_result_tokens": 300}}
ANTHROPIC_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                   "request_too_large", "rate_limit_error", "api_error", "overloaded_error"}
GEMINI_MODEL = "gemini-2.5-pro"
CLAUDE = "claude-sonnet-4-6"

# A request that waited on the dead store (the Redis client's own 5-10 s stalls) fails as a ReadTimeout:
# the client's timeout bounds the answer, in process as over a socket. A store call costs at most
# store_timeout (0.5 s), so the bound is generous and no clock is read.
STALL_BOUND_S = 4.0


def log_text(tag: str, lines: int = 400) -> str:
    """A tool output big enough to be offloaded (OFFLOAD)."""
    return "\n".join(f"{tag} line {i}: worker processed item {i * 7919 % 100003} ok" for i in range(lines))


# --------------------------------------------------------------------------- the APIs: a table

def sse_frames(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name or None, parsed data) of each event of a stream, strictly: an optional `event:` line, then one
    `data:` line of JSON (or [DONE]), then a blank line - a half-sent event glued to another does not parse."""
    assert re.search(rb"\r?\n\r?\n\Z", raw), raw[-300:]
    out: list[tuple[str | None, Any]] = []
    for block in re.split(rb"\r?\n\r?\n", raw)[:-1]:
        lines = block.split(b"\r\n") if b"\r\n" in block else block.split(b"\n")
        name = None
        if lines[0].startswith(b"event: "):
            name = lines.pop(0)[7:].decode()
        assert len(lines) == 1 and lines[0].startswith(b"data:"), block
        payload = lines[0][5:].strip()
        data = "[DONE]" if payload == b"[DONE]" else json.loads(payload)
        if name is not None and isinstance(data, dict) and "type" in data:
            assert data["type"] == name, block
        out.append((name, data))
    return out


def openai_error(data: Any) -> dict[str, Any]:
    err = data["error"]
    assert isinstance(err, dict) and set(err) >= {"message", "type", "code"}, data
    assert isinstance(err["message"], str) and err["message"], data
    return err


def anthropic_error(data: Any) -> dict[str, Any]:
    assert isinstance(data, dict) and data.get("type") == "error", data
    err = data["error"]
    assert isinstance(err, dict) and err["type"] in ANTHROPIC_TYPES, data
    assert isinstance(err["message"], str) and err["message"], data
    return err


def google_error(data: Any) -> dict[str, Any]:
    err = data["error"]
    assert isinstance(err, dict) and set(err) == {"code", "message", "status"}, data
    assert isinstance(err["message"], str) and err["message"], data
    return err


def responses_error_event(data: Any) -> dict[str, Any]:
    """The Responses API's own `error` event (not chat's envelope), which its clients parse."""
    assert data["type"] == "error" and isinstance(data["message"], str) and data["message"], data
    assert "code" in data and "sequence_number" in data, data
    return data


def openai_sdk(prefix: str) -> Callable[[Any], openai.OpenAI]:
    return lambda p: p.openai(prefix, api_key=p.api.key, max_retries=0, timeout=10)


@dataclass(frozen=True)
class Api:
    """One client API: where it posts, what it sends, and how it says an error (a partial error object to match)."""

    name: str
    key: str
    auth: Callable[[str], dict[str, str]]
    path: Callable[[bool], str]  # streamed or not
    body: Callable[..., dict[str, Any]]  # (stream, turns=None, tools=False)
    big: Callable[[str], Any]  # turns whose last tool result is offloaded
    text: Callable[[Any], str]  # the text of a whole reply
    error: Callable[[Any], dict[str, Any]]  # the error object of an error body, its shape checked
    event_error: Callable[[Any], dict[str, Any]]  # ... of a stream's error event
    is_error_event: Callable[[str | None, Any], bool]
    event_text: Callable[[str | None, Any], str]
    finished: Callable[[list[tuple[str | None, Any]]], bool]  # a stream that ended as it should
    provider_error: Callable[[int, str], dict[str, Any]]  # the provider's own error body
    # what the proxy's own errors say (matched against the error object)
    unreachable: dict[str, Any]
    stream_cut: dict[str, Any]
    invalid: dict[str, Any]
    not_found: dict[str, Any]
    too_large: dict[str, Any]
    internal: dict[str, Any]
    # a raw provider's stream: its opening, one text event, its ending, an error event it sends
    opening: bytes
    word: Callable[[str], bytes]
    ending: bytes
    error_event: bytes
    google: bool = False
    event_ignores: tuple[str, ...] = ()  # what of the error kinds an error event does not say
    count: tuple[str, Callable[[Any], dict[str, Any]]] | None = None  # a token-count endpoint, its body
    sdk: Callable[[Any], Any] | None = None  # the API's own SDK client for a proxy
    sdk_create: Callable[..., Any] | None = None  # (client, body) -> the reply (a stream iterated)
    sdk_error: Callable[[Any], dict[str, Any]] = field(default=lambda e: e)  # an SDK exception's error object
    sdk_stream_texts: Callable[..., Iterator[str]] | None = None

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**self.auth(self.key), **(extra or {})}

    def upstream_url(self, v1: str) -> str:
        """The provider's base for this API, from the mock's (or a raw server's) `/v1` base."""
        return v1.removesuffix("/v1") + "/v1beta" if self.google else v1

    def settings(self, **raw: Any) -> dict[str, Any]:
        if self.google:
            raw["upstream"] = {"api": "google", **raw.get("upstream", {})}
        return raw

    def post(self, p: Any, body: Any, headers: dict[str, str] | None = None, *, path: str | None = None,
             stream: bool | None = None, timeout: float = 10) -> httpx.Response:
        if stream is None:
            stream = getattr(body, "streamed", False) if self.google else body.get("stream") is True
        path = path or self.path(stream)
        return p.post(path, json=body, headers=self.headers(headers), timeout=timeout)

    def post_raw(self, p: Any, raw: Any, path: str, timeout: float = 10, **headers: str) -> httpx.Response:
        return p.post(path, content=raw, headers=self.headers({"content-type": "application/json", **headers}),
                      timeout=timeout)

    def assert_error(self, r: httpx.Response, status: int, kind: dict[str, Any] | None = None) -> dict[str, Any]:
        """A response the proxy made itself: this API's error envelope, nothing else."""
        assert r.status_code == status, (r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json"), r.headers
        err = self.error(r.json())
        if self.google:
            assert err["code"] == status, err
        for k, v in (kind or {}).items():
            assert err[k] == v, (k, err)
        return err

    def events(self, raw: bytes) -> list[tuple[str | None, Any]]:
        return sse_frames(raw)

    def stream_text(self, raw: bytes) -> str:
        return "".join(self.event_text(n, d) for n, d in self.events(raw) if not self.is_error_event(n, d))

    def one_error_event_at_the_end(self, raw: bytes, kind: dict[str, Any] | None = None) -> dict[str, Any]:
        evs = self.events(raw)
        errors = [i for i, (n, d) in enumerate(evs) if self.is_error_event(n, d)]
        assert errors == [len(evs) - 1], evs
        assert not self.finished(evs[:-1]), evs
        err = self.event_error(evs[-1][1])
        for k, v in (kind or {}).items():
            if k in self.event_ignores:
                continue
            assert err[k] == v, (k, err)
        return err

    def sse(self, *texts: str, end: bool = False) -> bytes:
        return self.opening + b"".join(self.word(t) for t in texts) + (self.ending if end else b"")


# ---- OpenAI Chat Completions

def _chat_body(stream: bool = False, turns: Any = None, tools: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": turns or HI}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    if stream:
        body["stream"] = True
    return body


def _chat_big(tag: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"Read the log ({tag})."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "cat log"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": log_text(tag)}]


def _chat_text(_: str | None, d: Any) -> str:
    return (d["choices"][0]["delta"].get("content") or "") if isinstance(d, dict) and d.get("choices") else ""


def _openai_provider_error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


def _chat_create(client: openai.OpenAI, body: dict[str, Any]) -> Any:
    out = client.chat.completions.create(**body)
    return list(out) if body.get("stream") else out


def _chat_stream_texts(client: openai.OpenAI, body: dict[str, Any]) -> Iterator[str]:
    for chunk in client.chat.completions.create(**{**body, "stream": True}):
        yield chunk.choices[0].delta.content


OPENAI_UNREACHABLE = {"code": "upstream_unreachable", "type": "upstream_error"}

CHAT = Api(
    name="chat", key="sk-faults", auth=lambda k: {"authorization": f"Bearer {k}"},
    path=lambda stream: "/v1/chat/completions", body=_chat_body, big=_chat_big,
    text=lambda j: j["choices"][0]["message"]["content"], error=openai_error, event_error=openai_error,
    is_error_event=lambda n, d: isinstance(d, dict) and "error" in d, event_text=_chat_text,
    finished=lambda evs: bool(evs) and evs[-1][1] == "[DONE]", provider_error=_openai_provider_error,
    unreachable=OPENAI_UNREACHABLE, stream_cut={"code": "upstream_stream_cut"},
    invalid={"type": "invalid_request_error"}, not_found={"type": "invalid_request_error"},
    too_large={"type": "invalid_request_error"}, internal={"code": "internal_error"},
    opening=b"",
    word=lambda t: (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
                    b'[{"index":0,"delta":{"content":%s},"finish_reason":null}]}\n\n' % json.dumps(t).encode()),
    ending=(b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
            b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'),
    error_event=b'data: {"error":{"message":"Overloaded","type":"server_error","param":null,"code":null}}\n\n',
    sdk=openai_sdk("/v1"), sdk_create=_chat_create, sdk_error=lambda e: e.body,
    sdk_stream_texts=_chat_stream_texts,
)


# ---- OpenAI Responses

def _responses_body(stream: bool = False, turns: Any = None, tools: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "input": turns or "hi"}
    if tools:
        body["tools"] = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
    if stream:
        body["stream"] = True
    return body


def _responses_big(tag: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": f"Read the log ({tag})."},
            {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": '{"cmd": "cat log"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": log_text(tag)}]


def _responses_text(j: Any) -> str:
    return "".join(c["text"] for item in j["output"] if item["type"] == "message"
                   for c in item["content"] if c["type"] == "output_text")


def _responses_create(client: openai.OpenAI, body: dict[str, Any]) -> Any:
    out = client.responses.create(**body)
    return list(out) if body.get("stream") else out


RESPONSES = Api(
    name="responses", key="sk-faults", auth=lambda k: {"authorization": f"Bearer {k}"},
    path=lambda stream: "/v1/responses", body=_responses_body, big=_responses_big, text=_responses_text,
    error=openai_error, event_error=responses_error_event,
    is_error_event=lambda n, d: isinstance(d, dict) and d.get("type") == "error",
    event_text=lambda n, d: d["delta"] if isinstance(d, dict) and d.get("type") == "response.output_text.delta"
    else "",
    finished=lambda evs: bool(evs) and isinstance(evs[-1][1], dict) and evs[-1][1].get("type") == "response.completed",
    provider_error=_openai_provider_error,
    unreachable=OPENAI_UNREACHABLE, stream_cut={"code": "upstream_stream_cut"},
    invalid={"type": "invalid_request_error"}, not_found={"type": "invalid_request_error"},
    too_large={"type": "invalid_request_error"}, internal={"code": "internal_error"},
    opening=b"",
    word=lambda t: (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_1",'
                    b'"output_index":0,"content_index":0,"delta":%s}\n\n' % json.dumps(t).encode()),
    ending=(b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_1","object":'
            b'"response","status":"completed","output":[],"usage":{"input_tokens":9,"output_tokens":2,'
            b'"total_tokens":11}}}\n\n'),
    error_event=(b'event: error\ndata: {"type":"error","code":"server_error","message":"Overloaded","param":null,'
                 b'"sequence_number":1}\n\n'),
    sdk=openai_sdk("/v1"), sdk_create=_responses_create, sdk_error=lambda e: e.body,
    event_ignores=("type",),  # its error event's type is `error`
)


# ---- Anthropic Messages

MESSAGES_TOOLS = [{"name": "Bash", "description": "Run a shell command.",
                   "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


def _messages_body(stream: bool = False, turns: Any = None, tools: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": CLAUDE, "max_tokens": 256, "messages": turns or HI}
    if tools:
        body["tools"] = MESSAGES_TOOLS
    if stream:
        body["stream"] = True
    return body


def _messages_big(tag: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Read the log ({tag})."},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "cat log"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": log_text(tag)},
                                         {"type": "text", "text": "What failed?"}]}]


def sse_event(data: dict[str, Any]) -> bytes:
    """One Messages event as Anthropic frames it."""
    return b"event: " + data["type"].encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + \
        b"\n\n"


def _messages_create(client: anthropic.Anthropic, body: dict[str, Any]) -> Any:
    out = client.messages.create(**body)
    return list(out) if body.get("stream") else out


def _messages_stream_texts(client: anthropic.Anthropic, body: dict[str, Any]) -> Iterator[str]:
    with client.messages.stream(**{k: v for k, v in body.items() if k != "stream"}) as s:
        yield from s.text_stream


_ANTHROPIC_TYPE = {429: "rate_limit_error", 529: "overloaded_error"}

MESSAGES = Api(
    name="messages", key="sk-ant-faults", auth=lambda k: {"x-api-key": k, "anthropic-version": "2023-06-01"},
    path=lambda stream: "/v1/messages", body=_messages_body, big=_messages_big,
    text=lambda j: j["content"][0]["text"], error=anthropic_error, event_error=anthropic_error,
    is_error_event=lambda n, d: n == "error",
    event_text=lambda n, d: d["delta"].get("text", "") if n == "content_block_delta" else "",
    finished=lambda evs: bool(evs) and evs[-1][0] == "message_stop",
    provider_error=lambda status, message: {"type": "error", "error": {
        "type": _ANTHROPIC_TYPE.get(status, "api_error"), "message": message}, "request_id": "req_011CXYZ"},
    unreachable={"type": "api_error"}, stream_cut={"type": "api_error"},
    invalid={"type": "invalid_request_error"}, not_found={"type": "not_found_error"},
    too_large={"type": "request_too_large"}, internal={"type": "api_error"},
    opening=(sse_event({"type": "message_start", "message": {
        "id": "msg_raw1", "type": "message", "role": "assistant", "model": CLAUDE, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 1}}})
        + sse_event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
    word=lambda t: sse_event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
    ending=(sse_event({"type": "content_block_stop", "index": 0})
            + sse_event({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                         "usage": {"output_tokens": 2}})
            + sse_event({"type": "message_stop"})),
    error_event=b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n',
    count=("/v1/messages/count_tokens", lambda turns: {"model": CLAUDE, "messages": turns}),
    sdk=lambda p: p.anthropic("", api_key=p.api.key, max_retries=0, timeout=10), sdk_create=_messages_create,
    sdk_error=lambda e: e.body["error"], sdk_stream_texts=_messages_stream_texts,
)


# ---- Google Gemini

GEMINI_TOOLS = [{"functionDeclarations": [{"name": "run_shell_command", "description": "Run a command",
                                           "parametersJsonSchema": {"type": "object",
                                                                    "properties": {"command": {"type": "string"}}}}]}]


class Streamed(dict):
    """A Gemini body that knows it is for the streaming method (Gemini says so in the path, not the body)."""

    streamed = True


def _gemini_body(stream: bool = False, turns: Any = None, tools: bool = False) -> dict[str, Any]:
    hi = [{"role": "user", "parts": [{"text": "hi"}]}]
    body: dict[str, Any] = (Streamed if stream else dict)(contents=turns or hi)
    if tools:
        body["tools"] = GEMINI_TOOLS
    return body


def _gemini_big(tag: str) -> list[dict[str, Any]]:
    return [{"role": "user", "parts": [{"text": f"Read the log ({tag})."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {"command": "cat log"}},
                                         "thoughtSignature": "c2lnbmF0dXJl"}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "run_shell_command",
                                                             "response": {"output": log_text(tag)}}}]}]


def _gemini_text(_: str | None, d: Any) -> str:
    if not isinstance(d, dict) or "candidates" not in d:
        return ""
    return "".join(p.get("text", "") for p in d["candidates"][0]["content"]["parts"])


_GOOGLE_STATUS = {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
GOOGLE_UNAVAILABLE = {"status": "UNAVAILABLE", "code": 502}

GEMINI = Api(
    name="gemini", key="gk-test", auth=lambda k: {"x-goog-api-key": k},
    path=lambda stream: f"/v1beta/models/{GEMINI_MODEL}:" + ("streamGenerateContent?alt=sse" if stream
                                                              else "generateContent"),
    body=_gemini_body, big=_gemini_big, text=lambda j: j["candidates"][0]["content"]["parts"][0]["text"],
    error=google_error, event_error=google_error, is_error_event=lambda n, d: isinstance(d, dict) and "error" in d,
    event_text=_gemini_text,
    finished=lambda evs: bool(evs) and isinstance(evs[-1][1], dict)
    and bool(evs[-1][1].get("candidates", [{}])[0].get("finishReason")),
    provider_error=lambda status, message: {"error": {"code": status, "message": message,
                                                      "status": _GOOGLE_STATUS[status]}},
    unreachable=GOOGLE_UNAVAILABLE, stream_cut=GOOGLE_UNAVAILABLE,
    invalid={"status": "INVALID_ARGUMENT"}, not_found={"status": "NOT_FOUND"},
    too_large={"status": "INVALID_ARGUMENT"}, internal={"status": "INTERNAL"},
    opening=b"",
    word=lambda t: (b'data: {"candidates": [{"content": {"parts": [{"text": %s}],"role": "model"},"index": 0}]}'
                    b'\r\n\r\n' % json.dumps(t).encode()),
    ending=(b'data: {"candidates": [{"content": {"parts": [{"text": ""}],"role": "model"},"finishReason": "STOP",'
            b'"index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 2,'
            b'"totalTokenCount": 11}}\r\n\r\n'),
    error_event=b'data: {"error": {"code": 503, "message": "Overloaded", "status": "UNAVAILABLE"}}\r\n\r\n',
    google=True,
)

APIS = [CHAT, RESPONSES, MESSAGES, GEMINI]
ALL = pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)


def only(*apis: Api) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("api", apis, ids=lambda a: a.name)


# --------------------------------------------------------------------------- a provider that misbehaves on purpose

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_request(conn: socket.socket) -> bytes:
    """One HTTP/1.1 request (headers + Content-Length body), bounded in size and by the socket timeout."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 1 << 20:
        got = conn.recv(65536)
        if not got:
            return data
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    want = int(m.group(1)) if m else 0
    while len(body) < want and len(body) < 64 << 20:
        got = conn.recv(65536)
        if not got:
            break
        body += got
    return head + b"\r\n\r\n" + body


def reset(conn: socket.socket) -> None:
    """Close with an RST instead of a FIN."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class RawUpstream:
    """Bare TCP on 127.0.0.1: every connection is handed to `behave(conn)`, then closed."""

    def __init__(self, behave: Callable[[socket.socket], None]) -> None:
        self.behave = behave
        self.connections = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(32)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"raw-upstream-{self.port}", daemon=True)

    def _serve(self) -> None:
        deadline = time.monotonic() + 120  # never outlives a test run by much
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            self.behave(conn)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def __enter__(self) -> RawUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept at once (Linux), not at its next poll
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._sock.close()


def close_at_once(conn: socket.socket) -> None:
    pass  # accept, then close without reading a byte


def read_then_close(conn: socket.socket) -> None:
    read_request(conn)


def read_then_reset(conn: socket.socket) -> None:
    read_request(conn)
    reset(conn)


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _truncated(part: bytes) -> Callable[[socket.socket], None]:
    def behave(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n" + part)
        time.sleep(0.05)
        conn.close()
    return behave


truncated_json = _truncated(b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":'
                            b'{"role":"assist')
truncated_json.__name__ = "truncated_json"
truncated_message = _truncated(b'{"model":"claude-sonnet-4-6","id":"msg_1","type":"message","role":"assistant",'
                               b'"content":[{"type":"te')
truncated_message.__name__ = "truncated_message"


def relayed(sent: bytes) -> bytes:
    """What the client gets of a provider's whole events: the same bytes, each event ended by a bare blank line
    (Google ends its events with CRLFs)."""
    return sent.replace(b"\r\n\r\n", b"\n\n")


def sse_then(conn: socket.socket, body: bytes, how: str) -> None:
    """Send `body` as an event stream, in a few writes, then end it `how`: reset, eof (no framing) or end (chunked)."""
    read_request(conn)
    chunked = how in ("reset", "end")
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 + (b"transfer-encoding: chunked\r\n\r\n" if chunked else b"connection: close\r\n\r\n"))
    step = max(1, len(body) // 3)
    for i in range(0, len(body), step):
        piece = body[i:i + step]
        conn.sendall(_chunked(piece) if chunked else piece)
        time.sleep(0.01)
    if how == "reset":
        reset(conn)
    elif how == "end":
        conn.sendall(b"0\r\n\r\n")
    else:
        conn.shutdown(socket.SHUT_WR)


# --------------------------------------------------------------------------- proxies for an API

def start(make_proxy: Any, api: Api, upstream_v1: str, **raw: Any) -> Any:
    """A proxy whose default route is `upstream_v1` speaking `api`; `p.api` is the API."""
    p = make_proxy(upstream_url=api.upstream_url(upstream_v1), **api.settings(**raw))
    p.api = api
    return p


@pytest.fixture
def api_proxy(make_proxy, upstream, api) -> Any:
    """A proxy for the test's API, offloading big tool results (OFFLOAD)."""
    return start(make_proxy, api, upstream.base_url, defaults=OFFLOAD)


@pytest.fixture
def faulty(make_proxy, upstream, api) -> Iterator[Callable[..., Any]]:
    """`faulty(behave)` → a proxy for the test's API whose route `broken` goes to a RawUpstream; `default` goes to
    the mock."""
    with contextlib.ExitStack() as stack:
        def make(behave: Callable[[socket.socket], None], **raw: Any) -> Any:
            raw_up = stack.enter_context(RawUpstream(behave))
            p = start(make_proxy, api, upstream.base_url, store=raw.pop("store", None),
                      routes=[{"name": "broken", "upstream": {"base_url": api.upstream_url(raw_up.base_url),
                                                              "read_timeout": 30}}], **raw)
            p.raw = raw_up
            return p
        yield make


def keeps_serving(p: Any, upstream: Any) -> None:
    assert p.get("/healthz", timeout=5).status_code == 200
    upstream.script("still here")
    r = p.api.post(p, p.api.body())
    assert r.status_code == 200, r.text
    assert p.api.text(r.json()) == "still here"


def assert_forwarded_as_sent(api: Api, sent: bytes, raw: bytes) -> None:
    """The provider got the client's bytes, exactly; but a chat stream, to which the proxy always adds
    `stream_options.include_usage` (it reads the usage off the stream)."""
    if api is CHAT and json.loads(raw).get("stream") is True:
        assert json.loads(sent) == {**json.loads(raw), "stream_options": {"include_usage": True}}, sent[-300:]
    else:
        assert sent == raw


def bodies(api: Api, stream: bool, tools: bool = True) -> tuple[dict[str, Any], ...]:
    """Without tools, and with them (the proxy's read loop then reads the answer before the client does)."""
    return (api.body(stream), api.body(stream, tools=True)) if tools else (api.body(stream),)


# --------------------------------------------------------------------------- provider errors

PROVIDER_5XX = [pytest.param(api, status, id=f"{api.name}-{status}")
                for api in APIS for status in (500, 503, *((529,) if api is MESSAGES else ()))]


@pytest.mark.parametrize("api,status", PROVIDER_5XX)
@pytest.mark.parametrize("stream", [False, True])
def test_provider_5xx_reaches_the_client_unchanged(make_proxy, upstream, api, status, stream):
    """With tools the proxy's read loop looks at the answer first; the error still passes as it came."""
    error = api.provider_error(status, f"The server had an error ({status})")
    raw = json.dumps(error).encode()
    p = start(make_proxy, api, upstream.base_url)
    for body in bodies(api, stream):
        upstream.reset()
        upstream.fail_next(status, raw, {"x-upstream-marker": "m1", "request-id": "req_011CXYZ",
                                         "x-should-retry": "true"})
        r = api.post(p, body)
        assert r.status_code == status
        assert r.content == raw
        assert r.headers["x-upstream-marker"] == "m1"
        assert r.headers["request-id"] == "req_011CXYZ" and r.headers["x-should-retry"] == "true"
        assert len(upstream.requests) == 1  # no hidden round on an error
        if api.sdk is not None:  # the SDK sees the provider's own error, of its own class
            upstream.fail_next(status, raw)
            with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as exc:
                api.sdk_create(api.sdk(p), body)
            assert exc.value.status_code == status
            assert api.sdk_error(exc.value) == error["error"]
            if status == 529:
                assert isinstance(exc.value, anthropic.OverloadedError)
    keeps_serving(p, upstream)


@ALL
def test_provider_rate_limit_keeps_its_retry_after(api_proxy, upstream, api):
    raw = json.dumps(api.provider_error(429, "slow down")).encode()
    upstream.fail_next(429, raw, {"retry-after": "7", "anthropic-ratelimit-requests-remaining": "0"})
    r = api.post(api_proxy, api.body(True))
    assert r.status_code == 429 and r.content == raw
    assert r.headers["retry-after"] == "7" and r.headers["anthropic-ratelimit-requests-remaining"] == "0"


@ALL
def test_provider_error_event_in_a_stream_reaches_the_client_as_sent(faulty, upstream, api):
    """An error event the provider sends mid-stream is the provider's: relayed, and the stream is over."""
    sent = api.sse("Hel") + api.error_event
    p = faulty(lambda conn: sse_then(conn, sent, "end"))
    for body in bodies(api, True):
        r = api.post(p, body, {"x-ctx-route": "broken"})
        assert r.status_code == 200
        assert r.content == relayed(sent), r.content
    keeps_serving(p, upstream)


# --------------------------------------------------------------------------- dropped connections

DROPS = [pytest.param(api, behave, id=f"{api.name}-{behave.__name__}") for api in APIS
         for behave in (close_at_once, read_then_close, read_then_reset, truncated_json,
                        *((truncated_message,) if api is MESSAGES else ()))]


@pytest.mark.parametrize("api,behave", DROPS)
@pytest.mark.parametrize("stream", [False, True])
def test_provider_dropping_the_connection_is_a_clean_502(faulty, upstream, api, behave, stream):
    """A connection closed, reset, or a body cut short: a 502 in the client's API's shape, answered within the
    client timeout (10 s), not after the read timeout (30 s); the client's stream flag does not matter."""
    p = faulty(behave)
    plain, with_tools = bodies(api, stream)
    for body in (plain, plain, with_tools):  # not just the first time: pooled connections must not poison later ones
        r = api.post(p, body, {"x-ctx-route": "broken"})
        err = api.assert_error(r, 502, api.unreachable)
        assert f"127.0.0.1:{p.raw.port}" in err["message"]
    if api.sdk is not None:
        with pytest.raises((openai.InternalServerError, anthropic.InternalServerError)) as exc:
            api.sdk_create(_routed_sdk(api, p, "broken"), api.body(stream))
        assert exc.value.status_code == 502
        assert all(api.sdk_error(exc.value)[k] == v for k, v in api.unreachable.items())
    if api.count is not None:
        path, count_body = api.count
        r = api.post(p, count_body(HI), {"x-ctx-route": "broken"}, path=path)
        api.assert_error(r, 502, api.unreachable)
    keeps_serving(p, upstream)


def _routed_sdk(api: Api, p: Any, route: str) -> Any:
    if api is MESSAGES:
        return p.anthropic(f"/r/{route}", api_key=api.key, max_retries=0, timeout=10)
    return p.openai(f"/r/{route}/v1", api_key=api.key, max_retries=0, timeout=10)


@only(CHAT)
@pytest.mark.parametrize("behave", [close_at_once, read_then_close, read_then_reset], ids=lambda f: f.__name__)
def test_provider_dropping_the_connection_on_a_passthrough_endpoint_is_a_clean_502(faulty, upstream, api, behave):
    p = faulty(behave)
    r = p.get("/r/broken/v1/models", headers=api.headers(), timeout=10)
    api.assert_error(r, 502, api.unreachable)
    keeps_serving(p, upstream)


@ALL
def test_stream_cut_mid_way_ends_with_one_error_event(faulty, upstream, api):
    """The provider resets the connection after two events: the client gets them, then one error event in its
    API's shape, answered within the client timeout (10 s), not after the read timeout (30 s)."""
    sent = api.sse("Hello", " world")
    p = faulty(lambda conn: sse_then(conn, sent, "reset"))
    for body in bodies(api, True):
        route = "/r/broken" + api.path(True)
        with p.stream("POST", route, headers=api.headers(), json=body, timeout=10) as r:
            assert r.status_code == 200
            raw = r.read()
        assert api.events(raw)[:-1] == api.events(sent), raw  # every event the provider sent, as it sent it
        assert api.stream_text(raw) == "Hello world"
        api.one_error_event_at_the_end(raw, api.unreachable)
        if api.sdk_stream_texts is not None:  # with the SDK: the two words arrive, then an error
            got: list[str] = []
            with pytest.raises((openai.APIError, anthropic.APIStatusError)) as exc:
                for text in api.sdk_stream_texts(_routed_sdk(api, p, "broken"), body):
                    got.append(text)
            assert got == ["Hello", " world"]
            if isinstance(exc.value, anthropic.APIStatusError):
                assert exc.value.body["error"]["type"] == "api_error"
    keeps_serving(p, upstream)


@ALL
@pytest.mark.parametrize("how", ["eof", "end"])
@pytest.mark.parametrize("cut", ["between-events", "mid-event"])
def test_stream_ending_before_it_finished_is_reported_in_an_error_event_that_parses(faulty, upstream, api, how, cut):
    """The provider ends the body cleanly (a close, or the last chunk) but the reply never finished: the client
    is told, in a stream it can parse (a half-sent event is dropped, not glued to the error event)."""
    whole = api.sse("Hello", " world")
    sent = whole if cut == "between-events" else whole + api.word(" again")[:-12]
    p = faulty(lambda conn: sse_then(conn, sent, how))
    for body in bodies(api, True, tools=api is MESSAGES):
        r = api.post(p, body, {"x-ctx-route": "broken"})
        assert r.status_code == 200
        assert api.events(r.content)[:-1] == api.events(whole), r.content
        assert api.stream_text(r.content) == "Hello world"
        err = api.one_error_event_at_the_end(r.content, api.stream_cut)
        if api is MESSAGES:
            assert "message_stop" in err["message"]
    keeps_serving(p, upstream)


@ALL
def test_stream_of_a_whole_reply_from_a_raw_provider_passes_byte_for_byte(faulty, upstream, api):
    """The control for the tests above: the same provider, finishing its reply, is relayed as it sent it."""
    sent = api.sse("Hello", " world", end=True)
    p = faulty(lambda conn: sse_then(conn, sent, "end"))
    r = api.post(p, api.body(True), {"x-ctx-route": "broken"})
    assert r.status_code == 200 and r.content == relayed(sent)


@ALL
def test_a_cut_stream_is_counted_as_a_failed_request(faulty, upstream, api):
    p = faulty(lambda conn: sse_then(conn, api.sse("Hello", " world") + api.word(" again")[:-12], "end"))
    r = api.post(p, api.body(True), {"x-ctx-route": "broken"})
    api.one_error_event_at_the_end(r.content)
    metrics = p.get("/metrics", timeout=5).text
    assert re.search(r'ctxproxy_requests_total\{[^}]*route="broken"[^}]*status="502"\} 1\.0', metrics), metrics
    assert not re.search(r'ctxproxy_requests_total\{[^}]*route="broken"[^}]*status="200"\}', metrics)


# --------------------------------------------------------------------------- a dead or slow provider

@ALL
def test_unreachable_provider_is_a_502_counted_as_a_failed_request(make_proxy, tmp_path, api):
    url = f"sqlite:///{tmp_path}/ctx.db"
    p = start(make_proxy, api, "http://127.0.0.1:1/v1", store=url)
    r = api.post(p, api.body(), {"x-session-id": "sess-down"})
    err = api.assert_error(r, 502, api.unreachable)
    assert "127.0.0.1:1" in err["message"]
    metrics = p.get("/metrics", timeout=5).text
    timeline = _wait_for(lambda: _timeline(url, api.key, "sess-down"), timeout=1.0)
    assert re.search(r'ctxproxy_requests_total\{[^}]*status="502"\} 1\.0', metrics), metrics
    assert [e["status"] for e in timeline] == [502]
    for stream in (False, True):
        if api.sdk is not None:
            with pytest.raises((openai.InternalServerError, anthropic.InternalServerError)) as exc:
                api.sdk_create(api.sdk(p), api.body(stream))
            assert exc.value.status_code == 502
            sdk_err = api.sdk_error(exc.value)
            assert all(sdk_err[k] == v for k, v in api.unreachable.items()) and "127.0.0.1:1" in sdk_err["message"]
        else:
            api.assert_error(api.post(p, api.body(stream)), 502, api.unreachable)
    if api.count is not None:
        path, count_body = api.count
        api.assert_error(api.post(p, count_body(HI), path=path), 502, api.unreachable)


@only(CHAT, MESSAGES)
def test_slow_provider_is_a_504_and_a_stalled_stream_ends_with_an_error_event(make_proxy, upstream, api):
    p = start(make_proxy, api, upstream.base_url, upstream={"read_timeout": 0.3})
    upstream.delay = 1.0
    api.assert_error(api.post(p, api.body()), 504, api.unreachable if api is MESSAGES else None)
    upstream.delay, upstream.chunk_delay = 0.0, 1.0
    upstream.script(" ".join("abcdefghijklmnop"))  # a stream of several chunks on every API
    r = api.post(p, api.body(True))
    assert r.status_code == 200
    err = api.one_error_event_at_the_end(r.content, api.unreachable if api is MESSAGES else None)
    assert "timed out" in err["message"]
    upstream.chunk_delay = 0.0
    if api.sdk is not None:
        reply = api.sdk_create(api.sdk(p), api.body())
        assert (reply.content[0].text if api is MESSAGES else reply.choices[0].message.content
                if api is CHAT else reply.output_text) == "ok"
    else:
        assert api.text(api.post(p, api.body()).json()) == "ok"


# --------------------------------------------------------------------------- malformed requests

GENERIC_MALFORMED = [b'{"model": "m", "max_tokens": 5, "messages": [', b"\xff\xfe not utf-8", b"[1, 2, 3]",
                     b'"a string"']
MESSAGES_MALFORMED = [
    b'{"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": 7, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "max_tokens": "5", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "max_tokens": true, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "max_tokens": 5}',
    b'{"model": "m", "max_tokens": 5, "messages": []}',
    b'{"model": "m", "max_tokens": 5, "messages": "hi"}',
    b'{"model": "m", "max_tokens": 5, "messages": [42]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": {"a": 1}}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": ["a string block"]}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", '
    b'"tool_use_id": "toolu_x", "content": "stray"}]}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "go"}, {"role": "assistant", '
    b'"content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]}, '
    b'{"role": "user", "content": "unanswered"}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": {}}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [{"x": 1}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "system": 5}',
]


def _too_deep_for_gemini() -> bytes:
    deep: Any = "x"
    for _ in range(300):
        deep = {"a": deep}
    return json.dumps({**_gemini_body(), "generationConfig": deep}).encode()


GEMINI_MALFORMED = [json.dumps({"contents": [{"role": "user", "parts": "hi"}]}).encode(), _too_deep_for_gemini()]
MALFORMED = ([pytest.param(api, body, id=f"{api.name}-{i}") for api in APIS for i, body in enumerate(GENERIC_MALFORMED)]
             + [pytest.param(MESSAGES, body, id=f"messages-{i + 4}") for i, body in enumerate(MESSAGES_MALFORMED)]
             + [pytest.param(GEMINI, body, id=f"gemini-{i + 4}") for i, body in enumerate(GEMINI_MALFORMED)])


@pytest.mark.parametrize("api,body", MALFORMED)
def test_malformed_bodies_get_a_400_in_the_apis_shape_and_nothing_reaches_the_provider(api_proxy, upstream, api, body):
    r = api.post_raw(api_proxy, body, api.path(False))
    api.assert_error(r, 400, api.invalid if api is not CHAT and api is not RESPONSES else None)
    with contextlib.suppress(ValueError):
        parsed = json.loads(body)
        if isinstance(parsed, dict) and api is MESSAGES:  # the SDK takes it as a BadRequestError
            with pytest.raises(anthropic.BadRequestError):
                api.sdk(api_proxy).post("/v1/messages", body=parsed, cast_to=httpx.Response)
    assert upstream.requests == []
    assert api_proxy.get("/healthz").status_code == 200


@ALL
def test_oversized_body_is_a_413_in_the_apis_shape(make_proxy, upstream, api):
    p = start(make_proxy, api, upstream.base_url, server={"max_body_bytes": 4096})
    big = orjson.dumps(api.body(turns=api.big("oversized")))
    paths = [api.path(False)] + ([api.count[0]] if api.count else [])
    for path in paths:
        api.assert_error(api.post_raw(p, big, path), 413, api.too_large)
        chunked = api.post_raw(p, iter([big[:2000], big[2000:]]), path)
        api.assert_error(chunked, 413, api.too_large)
    assert upstream.requests == []


@ALL
def test_unknown_route_is_a_404_in_the_apis_shape(api_proxy, upstream, api):
    api.assert_error(api.post(api_proxy, api.body(), {"x-ctx-route": "nope"}), 404, api.not_found)
    api.assert_error(api.post(api_proxy, api.body(), path="/r/nope" + api.path(False)), 404, api.not_found)
    assert upstream.requests == []


@only(MESSAGES)
def test_a_route_whose_upstream_speaks_openai_refuses_a_messages_client_in_anthropics_shape(make_proxy, upstream,
                                                                                           api):
    p = start(make_proxy, api, upstream.base_url,
              routes=[{"name": "oai", "upstream": {"base_url": upstream.base_url, "api": "openai"}}])
    err = api.assert_error(api.post(p, api.body(), path="/r/oai/v1/messages"), 400, api.invalid)
    assert "Anthropic Messages API" in err["message"]
    assert upstream.requests == []


# --------------------------------------------------------------------------- nothing half-written

def _store_call(url: str, fn: Callable[[Any], Any]) -> Any:
    async def go() -> Any:
        store = open_store(url)
        try:
            return await fn(store)
        finally:
            await store.close()
    return asyncio.run(go())


def _timeline(url: str, key: str, session: str) -> list[dict]:
    async def read(store: Any) -> list[dict]:
        return [orjson.loads(x) for x in await store.read_log(timeline_key(tenant_id(key, "ctxproxy-tenant-v1"),
                                                                           session))]
    return _store_call(url, read)


def _wait_for(fn: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _refusals(api: Api, turns: Any) -> list[tuple[dict[str, Any], dict[str, str], int]]:
    """Requests refused after their body was parsed (valid JSON that would be offloaded): body, headers, status."""
    nope = (api.body(turns=turns), {"x-ctx-route": "nope"}, 404)
    if api is CHAT:
        return [({**api.body(turns=turns), "stream": "yes"}, {}, 400),
                (api.body(turns=turns), {"x-session-id": "x" * 500}, 400), nope,
                (api.body(turns=turns + [{"role": "wizard"}]), {}, 400)]
    return [({**api.body(turns=turns), "stream": "yes"}, {}, 400),
            ({**api.body(turns=turns), "max_tokens": 0}, {}, 400),
            (api.body(turns=[turns[0], turns[2]]), {}, 400),
            (api.body(turns=[{"role": "system", "content": "x"}, *turns]), {}, 400), nope]


@only(CHAT, MESSAGES)
def test_request_rejected_after_parsing_writes_nothing(make_proxy, upstream, tmp_path, api):
    """Extends test_rejected_requests_store_nothing: valid JSON that would be offloaded, rejected for other reasons."""
    url = f"sqlite:///{tmp_path}/ctx.db"
    p = start(make_proxy, api, upstream.base_url, store=url, defaults=OFFLOAD)
    refusals = _refusals(api, api.big("rejected"))
    for body, headers, status in refusals:
        api.assert_error(api.post(p, body, headers), status, api.invalid if status == 400 and api is MESSAGES
                         else None)
    p.settle()  # let any (wrong) background write land before looking
    assert upstream.requests == []

    async def everything(store: Any) -> tuple[list[str], dict]:
        return await store.keys(""), await store.counters("")
    keys, counters = _store_call(url, everything)
    # nothing half-stored: no text, no decision; only the refusals themselves are counted (on chat, the one whose
    # session was known by then in that session's records)
    if api is CHAT:
        assert all(re.fullmatch(r"t:\w+:session:s-\w+(:first)?", k) for k in keys), keys
        assert counters and all(k.endswith(("|requests", "|errors")) or k.startswith("sessions:") for k in counters)
    else:
        assert keys == []
        assert counters and all(k.endswith(("|requests", "|errors")) for k in counters)
    assert sum(v for k, v in counters.items() if k.endswith("|all|errors")) == len(refusals)


@ALL
def test_provider_failure_after_the_pipeline_is_recorded_as_that_failure(faulty, make_proxy, upstream, tmp_path, api):
    url = f"sqlite:///{tmp_path}/ctx.db"
    p = faulty(truncated_json, store=url, defaults=OFFLOAD)
    session = "sess-truncated"
    r = api.post(p, api.body(turns=api.big("t1")), {"x-ctx-route": "broken", "x-session-id": session})
    api.assert_error(r, 502, api.unreachable)
    timeline = _wait_for(lambda: _timeline(url, api.key, session))
    assert len(timeline) == 1, timeline
    entry = timeline[0]
    assert entry["status"] == 502 and entry["error"] == "upstream_unreachable"
    assert entry["prompt"] is None and entry["completion"] is None  # no usage invented
    assert entry["offloaded"] == 1  # the pipeline did run
    # The metrics say the same.
    metrics = p.get("/metrics", timeout=5).text
    assert re.search(r'ctxproxy_requests_total\{[^}]*route="broken"[^}]*status="502"\} 1\.0', metrics), metrics
    assert not re.search(r'ctxproxy_requests_total\{[^}]*route="broken"[^}]*status="200"\}', metrics)

    # A provider that cannot be reached at all: whatever is stored must not claim success.
    dead = start(make_proxy, api, "http://127.0.0.1:1/v1", store=url, defaults=OFFLOAD)
    r = api.post(dead, api.body(turns=api.big("t2")), {"x-session-id": "sess-gone"})
    api.assert_error(r, 502, api.unreachable)
    dead.settle()  # its accounting written
    assert all(e["status"] == 502 for e in _timeline(url, api.key, "sess-gone"))
    assert 'status="200"' not in dead.get("/metrics", timeout=5).text


# --------------------------------------------------------------------------- a transform that fails

TRANSFORMS = ["offload", "compress", "context_read", "status_bar", "cache_hints"]


@ALL
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_transform_forwards_the_clients_bytes(api_proxy, upstream, api, transform, stream, monkeypatch):
    target = next(t for t in api_proxy.state.pipelines["default"] if t.name == transform)

    async def broken(conv, ctx):  # noqa: ANN001, ANN202
        raise RuntimeError("a bug in a transform")

    monkeypatch.setattr(target, "restore" if hasattr(target, "restore") else "apply", broken)
    body = api.body(stream, api.big("contained"), tools=True)
    if api is MESSAGES:
        body["system"] = [{"type": "text", "text": "You are a coding agent."}]
    raw = orjson.dumps(body)
    r = api.post_raw(api_proxy, raw, api.path(stream))
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-degraded"] == transform
    assert "x-ctxproxy-offloaded" not in r.headers
    assert_forwarded_as_sent(api, upstream.requests[-1].body, raw)  # the client's bytes, exactly
    if stream:
        assert api.finished(api.events(r.content)) and api.stream_text(r.content) == "ok"
    elif api is MESSAGES:
        assert r.json()["content"] == [{"type": "text", "text": "ok"}]
    else:
        assert api.text(r.json()) == "ok"
    metrics = api_proxy.get("/metrics").text
    assert any(line.startswith("ctxproxy_degraded_requests_total{") and line.endswith(" 1.0")
               for line in metrics.splitlines()), metrics[:2000]


@only(MESSAGES)
@pytest.mark.parametrize("transform", ["offload", "compress", "context_read", "cache_hints"])
def test_a_failing_transform_on_count_tokens_counts_the_clients_bytes(api_proxy, upstream, api, transform,
                                                                      monkeypatch):
    target = next(t for t in api_proxy.state.pipelines["default"] if t.name == transform)

    async def broken(conv, ctx):  # noqa: ANN001, ANN202
        raise RuntimeError("a bug in a transform")

    monkeypatch.setattr(target, "apply", broken)
    path, count_body = api.count
    raw = orjson.dumps({**count_body(api.big("counted")), "tools": MESSAGES_TOOLS})
    r = api.post_raw(api_proxy, raw, path)
    assert r.status_code == 200, r.text
    assert upstream.requests[-1].body == raw
    assert r.json()["input_tokens"] > 4000  # the whole tool result was counted, not a placeholder
    assert r.headers["x-ctxproxy-degraded"] == transform  # and the count says why it is the client's own


# --------------------------------------------------------------------------- the store goes away and comes back

class RedisProcess:
    def __init__(self, port: int, workdir: Path) -> None:
        self.port, self.workdir = port, workdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not on PATH; this test needs the binary to kill and restart a store")
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited with {self.proc.returncode} on port {self.port}")
            time.sleep(0.05)
        pytest.fail("redis-server did not answer PING within 10 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"(?m)^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text))


@only(CHAT, MESSAGES)
def test_store_outage_forwards_unmodified_fast_and_recovers(upstream, tmp_path, monkeypatch, api):
    monkeypatch.setattr(guarded, "MAX_BACKOFF_S", 1.0)  # a probe at least every second: recovery shows quickly
    redis = RedisProcess(free_port(), tmp_path)
    redis.start()
    try:
        settings = make_settings(upstream.base_url, f"redis://127.0.0.1:{redis.port}/0", defaults=OFFLOAD)
        with InProcessProxy(settings) as p, p.http_client(headers=api.headers(), timeout=10) as c:
            n = iter(range(1000))

            def send(stream: bool = False) -> tuple[httpx.Response, bytes]:
                # new text: needs the store
                raw = orjson.dumps(api.body(stream, api.big(f"run{next(n)}"), tools=True))
                r = c.post(api.path(stream), content=raw, headers={"content-type": "application/json"},
                           timeout=STALL_BOUND_S)
                return r, raw

            r, raw = send()
            assert r.status_code == 200 and r.headers.get("x-ctxproxy-offloaded") == "1", r.headers
            assert "x-ctxproxy-degraded" not in r.headers and upstream.requests[-1].body != raw
            assert c.get("/readyz").status_code == 200

            redis.kill()
            for i in range(5):
                r, raw = send(stream=bool(i % 2))
                assert r.status_code == 200, r.text
                assert r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert "x-ctxproxy-offloaded" not in r.headers
                assert_forwarded_as_sent(api, upstream.requests[-1].body, raw)  # the client's request
                if i % 2:
                    assert api.finished(api.events(r.content))
            ready = c.get("/readyz", timeout=STALL_BOUND_S)
            assert ready.status_code == 503 and ready.json()["store"] is False
            assert _metric(c.get("/metrics").text, "ctxproxy_degraded_requests_total") >= 5

            redis.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.2)
                r, raw = send()
                assert r.status_code == 200
                if "x-ctxproxy-degraded" not in r.headers:
                    break
            assert "x-ctxproxy-degraded" not in r.headers, "still degraded 10 s after the store came back"
            assert r.headers.get("x-ctxproxy-offloaded") == "1" and upstream.requests[-1].body != raw
            assert c.get("/readyz").status_code == 200
    finally:
        redis.kill()


def test_store_that_accepts_connections_but_never_answers_costs_milliseconds(upstream, monkeypatch):
    """Redis behind a relay that swallows every command: no 5-10 s stalls, every request says it is degraded and
    is forwarded as the client sent it - chat and Messages clients alike, on one proxy."""
    monkeypatch.setattr(guarded, "BACKOFF_S", 0.25)  # backoffs of 0.25, 0.5 and 1 s (0.5 s up to 10 s in a server):
    monkeypatch.setattr(guarded, "MAX_BACKOFF_S", 1.0)  # the 12 requests below still span several of them
    with SilentServer() as silent:
        settings = make_settings(upstream.base_url, silent.url, defaults=OFFLOAD)
        with InProcessProxy(settings) as p, p.http_client(timeout=30) as c:

            def ask(api: Api, body: dict[str, Any]) -> tuple[httpx.Response, bytes]:
                raw = orjson.dumps(body)
                r = c.post(api.path(bool(body.get("stream"))), content=raw,
                           headers=api.headers({"content-type": "application/json"}), timeout=STALL_BOUND_S)
                return r, raw

            for i in range(12):  # spread over several backoffs: some of them carry the probe
                api = (CHAT, MESSAGES)[i % 2]
                turns = api.big(f"silent{i}") if i % 4 > 1 else [{"role": "user", "content": f"question {i}"}]
                r, raw = ask(api, api.body(i % 4 == 3, turns, tools=True))  # plain, big, and big streamed
                assert r.status_code == 200, r.text
                assert r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert_forwarded_as_sent(api, upstream.requests[-1].body, raw)
                time.sleep(0.1)

            store = p.state.store
            deadline = time.monotonic() + 30
            while store.degraded:  # the backoff runs out: the next calls race for the one probe
                assert time.monotonic() < deadline, "the store's backoff never ran out"
                time.sleep(0.02)
            sends = [(api, api.body(turns=api.big(f"burst{i}"))) for i in range(4) for api in (CHAT, MESSAGES)]
            with ThreadPoolExecutor(len(sends)) as pool:
                burst = list(pool.map(lambda a: ask(*a), sends))
            for r, _raw in burst:
                assert r.status_code == 200 and r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert "x-ctxproxy-offloaded" not in r.headers
            assert {raw for _, raw in burst} == {req.body for req in upstream.requests[-len(sends):]}

            # a count, its store unavailable, counts the client's own bytes
            path, count_body = MESSAGES.count
            count = orjson.dumps(count_body(MESSAGES.big("silent-count")))
            r = c.post(path, content=count, headers=MESSAGES.headers({"content-type": "application/json"}))
            assert r.status_code == 200 and r.json()["input_tokens"] > 4000

            ready = c.get("/readyz", timeout=STALL_BOUND_S)
            assert ready.status_code == 503 and ready.json()["store"] is False
            assert _metric(c.get("/metrics").text, "ctxproxy_degraded_requests_total") >= 20


# --------------------------------------------------------------------------- SIGTERM drains in-flight streams

def test_sigterm_lets_an_in_flight_stream_finish(tmp_path, upstream):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    env.update(CTXPROXY_UPSTREAM=upstream.base_url, CTXPROXY_STORE=f"sqlite:///{tmp_path}/x.db")
    log = tmp_path / "proxy.log"
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "ctxproxy serve did not become healthy"
            time.sleep(0.05)

        words = "one two three four five six"
        upstream.script(words)
        upstream.chunk_delay = 0.1  # the SIGTERM lands after the first chunk: the rest is still in flight
        events: list[Any] = []
        signalled = False
        with httpx.stream("POST", url + "/v1/chat/completions", headers=CHAT.headers(), timeout=10,
                          json={"model": "m", "messages": HI, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
                if not signalled:
                    proc.send_signal(signal.SIGTERM)
                    signalled = True
        assert signalled
        text = "".join(e["choices"][0]["delta"].get("content") or ""
                       for e in events if isinstance(e, dict) and e["choices"])
        assert text.split() == words.split() and events[-1] == "[DONE]"
        assert not any(isinstance(e, dict) and "error" in e for e in events)
        try:
            code = proc.wait(timeout=30)  # the CLI's graceful-shutdown timeout
        except subprocess.TimeoutExpired:
            pytest.fail(f"ctxproxy serve still running 30 s after SIGTERM, its stream done: {log.read_text()}")
        assert code in (0, -signal.SIGTERM), log.read_text()
        assert "shutdown complete" in log.read_text().lower()
        # New connections are refused once it has gone.
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/healthz", timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
