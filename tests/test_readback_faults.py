"""The hidden read-back loop survives whatever the provider answers, on each API it runs on.

A request with tools gets the proxy's `context_read` tool, so every reply to it goes through the loop that looks
for calls to that tool (proxy/rewrite/context_read/loop.py); when the model calls it, the proxy answers in a
round the client never sees. A first reply of any other shape than the documented one is relayed exactly as the
provider sent it; the reply to a round the client never saw, when it is unusable, becomes one clean error in the
client's API's shape (in a stream, its last event) - never the provider's raw bytes inside the client's stream,
never a 500.

Each test is written once and run for every API it applies to: the table `READBACK` below holds, per API, the
request, and the provider replies scripted byte for byte with the mock's `fail_next(200, body)`; the API's paths
and error shapes are tests/test_faults.py's table. On Messages the handle is learnt from a first request (the same
request is always rewritten into the same bytes, handle included), so the hidden round reads real stored text.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from mock_upstream import MockUpstream
from test_faults import CHAT, CLAUDE, GEMINI, MESSAGES, MESSAGES_TOOLS, OFFLOAD, Api, RawUpstream, read_request, start

MARK = b"injected"  # in every unusable provider reply: must never reach the client
SSE = {"content-type": "text/event-stream"}
HANDLE = re.compile(r'context_read\(handle=\\?"(ctx_[0-9a-f]+)')  # in the JSON body: its quote escaped
MODEL = CLAUDE


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- chat's replies

READ = {"id": "call_r", "type": "function", "function": {"name": "context_read", "arguments": '{"handle":"ctx_0"}'}}


def completion(message: Any, finish: str = "tool_calls") -> dict[str, Any]:
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def calling(calls: Any) -> dict[str, Any]:
    return completion({"role": "assistant", "content": None, "tool_calls": calls})


def chunk(delta: Any, finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def sse(*events: Any) -> bytes:
    """Events as a provider frames them (bytes are taken as already framed), ending in [DONE]."""
    out = [e if isinstance(e, bytes) else b"data: " + dumps(e) + b"\n\n" for e in events]
    return b"".join(out) + b"data: [DONE]\n\n"


OPENING = chunk({"role": "assistant", "content": None})
FINISH = chunk({}, "tool_calls")
TC = {"index": 0, "id": "call_r", "type": "function",
      "function": {"name": "context_read", "arguments": '{"handle":"ctx_0"}'}}
READ_STREAM = sse(OPENING, chunk({"tool_calls": [TC]}), FINISH)
READ_REPLY = dumps(calling([READ]))




CHAT_MALFORMED_REPLIES: dict[str, bytes] = {
    "message a string": dumps(completion("context_read")),
    "message a list": dumps(completion([READ])),
    "message null": dumps(completion(None)),
    "tool_calls an object": dumps(calling(READ)),
    "tool_calls a string": dumps(calling("context_read")),
    "a call that is a string": dumps(calling(["context_read"])),
    "a call that is a list": dumps(calling([[READ]])),
    "read call beside a string": dumps(calling([READ, "bash"])),
    "function a string": dumps(calling([{**READ, "function": "context_read"}])),
    "function a list": dumps(calling([{**READ, "function": ["context_read"]}])),
    "arguments an object": dumps(calling([{**READ, "function": {"name": "context_read",
                                                                 "arguments": {"handle": "ctx_0"}}}])),
    "arguments a number": dumps(calling([{**READ, "function": {"name": "context_read", "arguments": 7}}])),
    "name a list": dumps(calling([{**READ, "function": {"name": ["context_read"], "arguments": "{}"}}])),
    "id an object": dumps(calling([{**READ, "id": {"x": 1}}])),
    "choices an object": dumps({"id": "c", "choices": {"0": calling([READ])["choices"][0]}}),
    "choices a string": dumps({"id": "c", "choices": "x"}),
    "choice a string": dumps({"id": "c", "choices": ["x"]}),
    "choices missing": dumps({"id": "c", "object": "chat.completion"}),
    "body a list": dumps([calling([READ])]),
    "body a string": dumps("context_read"),
    "body null": b"null",
    "not JSON": b"<html>Bad gateway</html>",
}


CHAT_MALFORMED_STREAMS: dict[str, bytes] = {
    "delta a string": sse(OPENING, chunk("context_read"), FINISH),
    "delta a list": sse(OPENING, chunk([TC]), FINISH),
    "choice a string": sse(OPENING, {"id": "c", "choices": ["x"]}, FINISH),
    "choices an object": sse(OPENING, {"id": "c", "choices": {"index": 0, "delta": {"tool_calls": [TC]}}}, FINISH),
    "choices a string": sse(OPENING, {"id": "c", "choices": "x"}, FINISH),
    "two choices": sse(OPENING, {"id": "c", "choices": [chunk({"tool_calls": [TC]})["choices"][0]] * 2}, FINISH),
    "tool_calls an object": sse(OPENING, chunk({"tool_calls": TC}), FINISH),
    "tool_calls a string": sse(OPENING, chunk({"tool_calls": "context_read"}), FINISH),
    "a call that is a string": sse(OPENING, chunk({"tool_calls": ["context_read"]}), FINISH),
    "index a list": sse(OPENING, chunk({"tool_calls": [{**TC, "index": [0]}]}), FINISH),
    "index an object": sse(OPENING, chunk({"tool_calls": [{**TC, "index": {"i": 0}}]}), FINISH),
    "index a string": sse(OPENING, chunk({"tool_calls": [{**TC, "index": "0"}]}), FINISH),
    "function a string": sse(OPENING, chunk({"tool_calls": [{**TC, "function": "context_read"}]}), FINISH),
    "name a number": sse(OPENING, chunk({"tool_calls": [{**TC, "function": {"name": 5, "arguments": ""}}]}), FINISH),
    "arguments an object": sse(OPENING, chunk({"tool_calls": [{**TC, "function": {
        "name": "context_read", "arguments": {"handle": "ctx_0"}}}]}), FINISH),
    "id a list": sse(OPENING, chunk({"tool_calls": [{**TC, "id": ["call_r"]}]}), FINISH),
    "read call then an ill-formed call": sse(OPENING, chunk({"tool_calls": [TC]}),
                                             chunk({"tool_calls": [{**TC, "index": [1]}]}), FINISH),
    "chunk a list": sse(OPENING, [chunk({"tool_calls": [TC]})], FINISH),
    "chunk a string": sse(OPENING, "context_read", FINISH),
    "data not JSON": sse(OPENING, b"data: <html>Bad gateway</html>\n\n", FINISH),
}


CHAT_HIDDEN_FAILURES: dict[str, tuple[int, bytes, dict[str, str]]] = {
    "HTML 502 from a gateway": (502, b"<html><body>Bad gateway\n\ndata: {\"injected\": true}\n\n</body></html>",
                                {"content-type": "text/html"}),
    "HTML 200": (200, b"<html>\n\ndata: {\"choices\": [{\"delta\": {\"content\": \"injected\"}}]}\n\n</html>",
                 {"content-type": "text/html"}),
    "empty 200": (200, b"", {"content-type": "application/json"}),
    "JSON 200 with message a string": (200, dumps(completion("injected")), {}),
    "JSON 200 with choices an object": (200, dumps({"choices": {"injected": 1}}), {}),
    "JSON 200 that is an error": (200, dumps({"error": {"message": "overloaded", "type": "server_error"},
                                              "injected": True}), {}),
    "JSON 503 that is not an OpenAI error": (503, dumps({"detail": "injected"}), {}),
    "event stream with a non-JSON event": (200, sse(OPENING, b"data: <html>injected</html>\n\n",
                                                    chunk({}, "stop")), SSE),
    "event stream with a delta that is a string": (200, sse(OPENING, chunk("injected"), chunk({}, "stop")), SSE),
    "event stream with an index that is a list": (200, sse(OPENING, chunk({"tool_calls": [{**TC, "index": [0],
                                                   "id": "injected"}]}), chunk({}, "stop")), SSE),
    "event stream with a chunk that is a list": (200, sse(OPENING, [{"injected": 1}], chunk({}, "stop")), SSE),
    "event stream with an error event": (200, sse(OPENING, {"error": {"message": "overloaded", "type": "x",
                                                                     "injected": True}}), SSE),
}




def chat_first_read(handle: str, stream: bool) -> tuple[bytes, dict[str, str]]:
    return (READ_STREAM, SSE) if stream else (READ_REPLY, {})


# --------------------------------------------------------------------------- Messages' replies

def ev(data: Any, name: str | None = None) -> bytes:
    """One event as a provider frames it; `name` for data that is not an object with a type."""
    kind = name or (data["type"] if isinstance(data, dict) else "x")
    return b"event: " + kind.encode() + b"\ndata: " + (data if isinstance(data, bytes) else dumps(data)) + b"\n\n"


def message(content: Any, stop: str = "tool_use", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "id": "msg_x", "type": "message", "role": "assistant", "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 500, "output_tokens": 20},
            **extra}


def read_call(handle: str, id_: Any = "toolu_read") -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": "context_read", "input": {"handle": handle, "offset": 10}}


M_START = ev({"type": "message_start", "message": {**message([], None), "usage": {"input_tokens": 500,
                                                                                  "output_tokens": 1}}})
PING = ev({"type": "ping"})


def m_stop(reason: str = "tool_use") -> bytes:
    return (ev({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": 20}}) + ev({"type": "message_stop"}))


def streamed_call(handle: str, index: int = 0, id_: Any = "toolu_read") -> bytes:
    args = json.dumps({"handle": handle, "offset": 10})
    return (ev({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": id_, "name": "context_read", "input": {}}})
            + ev({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta",
                                                                           "partial_json": ""}})
            + ev({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta",
                                                                           "partial_json": args[:9]}})
            + ev({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta",
                                                                           "partial_json": args[9:]}})
            + ev({"type": "content_block_stop", "index": index}))


def streamed_text(text: str, index: int = 0) -> bytes:
    return (ev({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
            + ev({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})
            + ev({"type": "content_block_stop", "index": index}))


def messages_malformed_replies(h: str) -> dict[str, bytes]:
    call = read_call(h)
    return {
        "content a string": dumps(message("context_read")),
        "content an object": dumps(message(call)),
        "content null": dumps(message(None)),
        "a block that is a string": dumps(message(["context_read"])),
        "a block that is a list": dumps(message([[call]])),
        "name a list": dumps(message([{**call, "name": ["context_read"]}])),
        "id an object": dumps(message([read_call(h, {"x": 1})])),
        "id a list": dumps(message([read_call(h, ["toolu_read"])])),
        "type not message": dumps({**message([call]), "type": "completion"}),
        "type missing": dumps({k: v for k, v in message([call]).items() if k != "type"}),
        "body a list": dumps([message([call])]),
        "body a string": dumps("context_read"),
        "body null": b"null",
        "not JSON": b"<html>Bad gateway</html>",
        "empty": b"",
    }


def messages_malformed_streams(h: str) -> dict[str, bytes]:
    call = streamed_call(h)
    return {
        "content_block a string": M_START + ev({"type": "content_block_start", "index": 0,
                                               "content_block": "context_read"}) + m_stop(),
        "content_block a list": M_START + ev({"type": "content_block_start", "index": 0,
                                             "content_block": [read_call(h)]}) + m_stop(),
        "index a string": M_START + call.replace(b'"index":0', b'"index":"0"') + m_stop(),
        "index a list": M_START + call.replace(b'"index":0', b'"index":[0]') + m_stop(),
        "id a list": M_START + streamed_call(h, id_=["toolu_read"]) + m_stop(),
        "data a list": M_START + ev(dumps([read_call(h)]), "content_block_start") + m_stop(),
        "data a string": M_START + ev(b'"context_read"', "content_block_start") + m_stop(),
        "data not JSON": M_START + ev(b"<html>Bad gateway</html>", "content_block_start") + m_stop(),
        "an event of an unknown type": M_START + ev({"type": "future_event", "x": 1}) + streamed_text("hi") + m_stop(
            "end_turn"),
    }


MESSAGES_HIDDEN_FAILURES: dict[str, tuple[int, bytes, dict[str, str]]] = {
    "HTML 502 from a gateway": (502, b"<html><body>Bad gateway\n\nevent: error\ndata: {\"injected\": true}\n\n"
                                     b"</body></html>", {"content-type": "text/html"}),
    "HTML 200": (200, b"<html>\n\nevent: content_block_delta\ndata: {\"type\": \"content_block_delta\", "
                      b"\"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"injected\"}}\n\n</html>",
                 {"content-type": "text/html"}),
    "empty 200": (200, b"", {"content-type": "application/json"}),
    "JSON 200 with content a string": (200, dumps(message("injected")), {}),
    "JSON 200 that is not a message": (200, dumps({**message([{"type": "text", "text": "injected"}]),
                                                   "type": "injected"}), {}),
    "JSON 200 that is an error": (200, dumps({"type": "error", "error": {"type": "overloaded_error",
                                                                       "message": "Overloaded"},
                                              "injected": True}), {}),
    "JSON 503 that is not an Anthropic error": (503, dumps({"detail": "injected"}), {}),
    "event stream with a non-JSON event": (200, M_START + ev(b"<html>injected</html>", "content_block_delta")
                                           + m_stop("end_turn"), SSE),
    "event stream with data that is a list": (200, M_START + ev(dumps([{"injected": 1}]), "content_block_start")
                                              + m_stop("end_turn"), SSE),
    "event stream with an error event": (200, M_START + streamed_text("fine") + ev(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "injected": True}), SSE),
    "event stream cut before message_stop": (200, M_START + streamed_text("shown as it came") + ev(
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}), SSE),
    "event stream with content_block a string": (200, M_START + ev({"type": "content_block_start", "index": 0,
                                                                  "content_block": "injected"})
                                                 + m_stop("end_turn"), SSE),
    "event stream with an index that is a string": (200, M_START + streamed_text("injected").replace(
        b'"index":0', b'"index":"0"') + m_stop("end_turn"), SSE),
    "event stream with a delta that is a string": (200, M_START + ev(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        + ev({"type": "content_block_delta", "index": 0, "delta": "injected"}) + m_stop("end_turn"), SSE),
}


def messages_first_read(handle: str, stream: bool) -> tuple[bytes, dict[str, str]]:
    if stream:
        return M_START + streamed_text("Let me look.") + streamed_call(handle, 1) + m_stop(), SSE
    return dumps(message([{"type": "text", "text": "Let me look."}, read_call(handle)])), {}




# --------------------------------------------------------------------------- Gemini's replies

def gemini_answer(parts: list[dict[str, Any]], finish: bool = True) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = "STOP"
    return {"candidates": [candidate], "usageMetadata": {"promptTokenCount": 10, "totalTokenCount": 10}}


GEMINI_READ = {"functionCall": {"name": "context_read", "args": {"handle": "ctx_00000000000000000000"}}}


def gemini_sse(*chunks: Any) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\r\n\r\n"
                    for c in chunks)


def gemini_first_read(handle: str, stream: bool) -> tuple[bytes, dict[str, str]]:
    if stream:
        return gemini_sse(gemini_answer([{"text": "Reading."}], finish=False), gemini_answer([GEMINI_READ])), SSE
    return dumps(gemini_answer([GEMINI_READ])), {}


GEMINI_HIDDEN_FAILURES: dict[str, tuple[int, bytes, dict[str, str]]] = {
    "not JSON": (200, b"not json at all, injected", {}),
    "event stream with an error event": (200, gemini_sse({"error": {"code": 500, "message": "internal",
                                                                    "status": "INTERNAL"}, "injected": True}), SSE),
}


# --------------------------------------------------------------------------- the APIs: a table

@dataclass(frozen=True)
class Readback:
    """An API's side of the read-back loop: the request that gets the read tool, and the provider's replies."""

    api: Api
    body: Callable[[bool], dict[str, Any]]  # a request with tools (on Messages, a big tool result offloaded)
    learns_handle: bool  # the handle is learnt from a first request; else the replies name one that is not stored
    first_read: Callable[[str, bool], tuple[bytes, dict[str, str]]]  # a reply calling the read tool, its headers
    hidden_failures: dict[str, tuple[int, bytes, dict[str, str]]]
    call: bytes  # how a tool call looks in a reply: never shown to the client
    malformed_replies: Callable[[str], dict[str, bytes]] = lambda h: {}
    malformed_streams: Callable[[str], dict[str, bytes]] = lambda h: {}
    provider_errors: tuple[tuple[int, dict[str, Any], dict[str, Any]], ...] = ()  # status, body, the event's kind

    def send(self, p: Any, stream: bool) -> httpx.Response:
        return self.api.post(p, self.body(stream), timeout=20)


def _chat_body(stream: bool) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}


def _messages_body(stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 512, "messages": MESSAGES.big("readback"), "tools": MESSAGES_TOOLS,
            "stream": stream}


def _anthropic_error(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}, "request_id": "req_011abc"}


CHAT_RB = Readback(
    api=CHAT, body=_chat_body, learns_handle=False, first_read=chat_first_read,
    hidden_failures=CHAT_HIDDEN_FAILURES, call=b'"function":{"name":"context_read"',
    malformed_replies=lambda h: CHAT_MALFORMED_REPLIES, malformed_streams=lambda h: CHAT_MALFORMED_STREAMS,
    provider_errors=((429, {"error": {"message": "Rate limit reached for gpt-4o", "type": "requests", "param": None,
                                      "code": "rate_limit_exceeded"}}, {"code": "rate_limit_exceeded"}),),
)
MESSAGES_RB = Readback(
    api=MESSAGES, body=_messages_body, learns_handle=True, first_read=messages_first_read,
    hidden_failures=MESSAGES_HIDDEN_FAILURES, call=b'"name":"context_read"',
    malformed_replies=messages_malformed_replies, malformed_streams=messages_malformed_streams,
    provider_errors=((429, _anthropic_error("rate_limit_error", "Number of request tokens has exceeded your "
                                                                "per-minute rate limit"), {"type": "rate_limit_error"}),
                     (529, _anthropic_error("overloaded_error", "Overloaded"), {"type": "overloaded_error"})),
)
GEMINI_RB = Readback(
    api=GEMINI, body=lambda stream: GEMINI.body(stream, tools=True), learns_handle=False,
    first_read=gemini_first_read, hidden_failures=GEMINI_HIDDEN_FAILURES, call=b"functionCall",
)
READBACK = [CHAT_RB, MESSAGES_RB, GEMINI_RB]


def apis(*rbs: Readback) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("rb", rbs, ids=lambda r: r.api.name)


def cases(what: str, rbs: list[Readback] = READBACK) -> list[Any]:
    """(readback, name) for every named reply of `what` ("malformed_replies", ...) of each API."""
    out = []
    for rb in rbs:
        named = getattr(rb, what)
        for name in (named if isinstance(named, dict) else named("ctx_0")):
            out.append(pytest.param(rb, name, id=f"{rb.api.name}-{name}"))
    return out


# --------------------------------------------------------------------------- fixtures

@pytest.fixture
def rb_proxy(make_proxy, upstream, rb) -> Any:
    return start(make_proxy, rb.api, upstream.base_url, defaults=OFFLOAD)


def learn_handle(rb: Readback, p: Any, upstream: MockUpstream) -> str:
    """The handle the proxy gives the big tool result: a first request shows it; then the mock is reset."""
    if not rb.learns_handle:
        return "ctx_0"
    r = rb.send(p, stream=False)
    assert r.status_code == 200 and r.headers.get("x-ctxproxy-offloaded") == "1", (r.status_code, r.headers)
    found = HANDLE.search(upstream.requests[-1].body.decode())
    assert found, upstream.requests[-1].body[:3000]
    upstream.reset()
    return found.group(1)


@pytest.fixture
def handle(rb_proxy, upstream, rb) -> str:
    return learn_handle(rb, rb_proxy, upstream)


def hidden_request_results(upstream: MockUpstream) -> list[dict[str, Any]]:
    """The proxy's tool_result blocks in the hidden round's request (Messages)."""
    last = upstream.requests[1].json["messages"][-1]
    return [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


def frames(raw: bytes) -> list[tuple[str | None, Any]]:
    return MESSAGES.events(raw)


# --------------------------------------------------------------------------- the round, working

@pytest.mark.parametrize("stream", [False, True])
@apis(MESSAGES_RB)
def test_a_read_call_on_the_offloaded_result_is_answered_in_a_hidden_round(rb_proxy, upstream, handle, rb, stream):
    """The control: the scripted call reads the stored text back, and the client sees only the final answer."""
    upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": handle, "offset": 10}}]},
                    "line 10 says ok")
    r = rb.send(rb_proxy, stream)
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 2
    (result,) = hidden_request_results(upstream)
    assert "readback line 10: worker processed item" in result["content"]
    if stream:
        evs = frames(r.content)
        assert [n for n, _ in evs].count("message_start") == 1 and evs[-1][0] == "message_stop"
        assert not any(d.get("content_block", {}).get("type") == "tool_use" for _, d in evs)
        assert "".join(d["delta"].get("text", "") for n, d in evs if n == "content_block_delta") == \
            "line 10 says ok"
    else:
        out = r.json()
        assert out["content"] == [{"type": "text", "text": "line 10 says ok"}] and out["stop_reason"] == "end_turn"
        assert r.headers["x-ctxproxy-read-rounds"] == "1"


# --------------------------------------------------------------------------- first round: relayed untouched

@pytest.mark.parametrize("rb,name", cases("malformed_replies"))
def test_ill_formed_reply_is_relayed_as_the_provider_sent_it(rb_proxy, upstream, handle, rb, name):
    raw = rb.malformed_replies(handle)[name]
    upstream.fail_next(200, raw)
    r = rb.send(rb_proxy, stream=False)
    assert r.status_code == 200 and r.content == raw, (r.status_code, r.text)
    assert len(upstream.requests) == 1  # no hidden round on a reply the proxy cannot read


@pytest.mark.parametrize("rb,name", cases("malformed_streams"))
def test_ill_formed_stream_is_relayed_as_the_provider_sent_it(rb_proxy, upstream, handle, rb, name):
    raw = rb.malformed_streams(handle)[name]
    upstream.fail_next(200, raw, SSE)
    r = rb.send(rb_proxy, stream=True)
    assert r.status_code == 200 and r.content == raw, (r.status_code, r.content)
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
@apis(CHAT_RB)
def test_read_call_with_content_and_usage_of_odd_types_still_reads_back(rb_proxy, upstream, rb, stream):
    """Fields the loop does not need may be anything: the read is answered all the same."""
    if stream:
        odd = chunk({"tool_calls": [TC], "content": {"odd": 1}})
        upstream.fail_next(200, sse(OPENING, odd, FINISH, {"id": "c", "choices": [], "usage": "many"}), SSE)
    else:
        reply = calling([READ])
        reply["choices"][0]["message"]["content"] = 5
        upstream.fail_next(200, dumps({**reply, "usage": ["many"]}))
    upstream.script("read it")
    r = rb.send(rb_proxy, stream=stream)
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 2
    if stream:
        assert CHAT.stream_text(r.content) == "read it"
    else:
        assert r.json()["choices"][0]["message"]["content"] == "read it"


@apis(MESSAGES_RB)
def test_a_read_call_whose_streamed_input_is_garbled_is_answered_with_an_error_the_model_reads(rb_proxy, upstream,
                                                                                               handle, rb):
    """The proxy hides its call's events as they come, so a garbled one cannot be relayed as sent any more:
    the round runs on what could be read, and the model is told its arguments were unreadable."""
    first_piece = json.dumps({"handle": handle, "offset": 10})[:9]  # '{"handle"' (see streamed_call)
    garbled = streamed_call(handle).replace(
        b'"delta":{"type":"input_json_delta","partial_json":' + dumps(first_piece) + b"}", b'"delta":"injected"')
    assert garbled != streamed_call(handle)
    upstream.fail_next(200, M_START + garbled + m_stop(), SSE)
    upstream.script("sorry, again")
    r = rb.send(rb_proxy, stream=True)
    assert r.status_code == 200 and MARK not in r.content, r.content
    assert len(upstream.requests) == 2
    (result,) = hidden_request_results(upstream)
    assert result["content"].startswith("error: arguments must be")
    evs = frames(r.content)
    assert evs[-1][0] == "message_stop" and not any(d.get("content_block", {}).get("type") == "tool_use"
                                                    for _, d in evs)


# --------------------------------------------------------------------------- hidden round: one clean error

@pytest.mark.parametrize("rb,name", cases("hidden_failures"))
@pytest.mark.parametrize("stream", [False, True])
def test_unusable_answer_to_a_hidden_round_is_one_clean_error(rb_proxy, upstream, handle, rb, name, stream):
    status, raw, headers = rb.hidden_failures[name]
    upstream.fail_next(200, *rb.first_read(handle, stream))
    upstream.fail_next(status, raw, headers)
    r = rb.send(rb_proxy, stream)
    assert len(upstream.requests) == 2  # the hidden round was asked
    if rb.learns_handle:
        assert "readback line 10" in hidden_request_results(upstream)[0]["content"]
    assert MARK not in r.content, r.content
    assert rb.call not in r.content, r.content  # the proxy's call is never shown
    if stream:
        assert r.status_code == 200
        rb.api.one_error_event_at_the_end(r.content)
    else:
        rb.api.assert_error(r, status if status >= 400 else 502)


PROVIDER_ERRORS = [pytest.param(rb, status, body, kind, id=f"{rb.api.name}-{status}")
                   for rb in READBACK for status, body, kind in rb.provider_errors]


@pytest.mark.parametrize("rb,status,error,kind", PROVIDER_ERRORS)
@pytest.mark.parametrize("stream", [False, True])
def test_provider_error_in_a_hidden_round_keeps_its_status_type_and_message(rb_proxy, upstream, handle, rb, status,
                                                                           error, kind, stream):
    upstream.fail_next(200, *rb.first_read(handle, stream))
    upstream.fail_next(status, dumps(error), {"retry-after": "7"})
    r = rb.send(rb_proxy, stream)
    if stream:
        err = rb.api.one_error_event_at_the_end(r.content, kind)
        assert err["message"] == error["error"]["message"]
    else:
        assert r.status_code == status and r.json() == error and r.headers["retry-after"] == "7"


@apis(MESSAGES_RB)
def test_an_error_event_in_a_hidden_round_keeps_the_providers_error_type(rb_proxy, upstream, handle, rb):
    """Overloaded mid-stream is still `overloaded_error` to the client (Claude Code retries on it)."""
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    upstream.fail_next(200, *rb.first_read(handle, True))
    upstream.fail_next(200, M_START + ev(error), SSE)
    r = rb.send(rb_proxy, True)
    err = rb.api.one_error_event_at_the_end(r.content, {"type": "overloaded_error"})
    assert err["message"] == "Overloaded"


def _read_call_then_hang_up(conn: socket.socket, n: itertools.count, rb: Readback, handle: str,
                            stream: bool) -> None:
    """First connection: a read call; every later one: read the request and close without a word."""
    read_request(conn)
    if next(n):
        return
    raw, headers = rb.first_read(handle, stream)
    ctype = (headers.get("content-type") or "application/json").encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                 % (ctype, len(raw), raw))


@pytest.mark.parametrize("stream", [False, True])
@apis(CHAT_RB, MESSAGES_RB)
def test_transport_failure_in_a_hidden_round_is_one_clean_error(make_proxy, upstream, tmp_path, rb, stream):
    learner = start(make_proxy, rb.api, upstream.base_url, store=f"sqlite:///{tmp_path}/ctx.db", defaults=OFFLOAD)
    handle = learn_handle(rb, learner, upstream)
    n = itertools.count()
    with RawUpstream(lambda conn: _read_call_then_hang_up(conn, n, rb, handle, stream)) as raw:
        p = start(make_proxy, rb.api, raw.base_url, store=f"sqlite:///{tmp_path}/ctx.db", defaults=OFFLOAD)
        r = rb.send(p, stream)
        assert raw.connections >= 2  # the hidden round was asked (a connection closed unanswered is retried once)
    if stream:
        assert r.status_code == 200
        err = rb.api.one_error_event_at_the_end(r.content, rb.api.unreachable)
    else:
        err = rb.api.assert_error(r, 502, rb.api.unreachable)
    assert f"127.0.0.1:{raw.port}" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
@apis(CHAT_RB, MESSAGES_RB)
def test_a_proxy_bug_in_a_hidden_round_is_one_error_in_the_apis_shape(rb_proxy, upstream, handle, rb, monkeypatch,
                                                                     stream):
    """The last resort: headers are out, so an unexpected failure is said in the stream (its last event), not by
    cutting it; without a stream, a 500 in the API's shape."""
    async def broken(*args: Any) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr("proxy.rewrite.context_read.loop.answer", broken)
    upstream.fail_next(200, *rb.first_read(handle, stream))
    r = rb.send(rb_proxy, stream)
    if stream:
        assert r.status_code == 200
        err = rb.api.one_error_event_at_the_end(r.content, rb.api.internal)
    else:
        err = rb.api.assert_error(r, 500, rb.api.internal)
    assert "internal proxy error" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
@apis(MESSAGES_RB)
def test_usage_summed_over_rounds_past_64_bits_is_still_written(rb_proxy, upstream, handle, rb, stream):
    """A gateway's absurd figures: the sum of two rounds passes what orjson writes (was a 500 / an error event)."""
    most = 2 ** 64 - 1
    usage = {"input_tokens": most, "output_tokens": most}
    if stream:
        def end(reason: str) -> bytes:
            return ev({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage}) + \
                ev({"type": "message_stop"})
        upstream.fail_next(200, M_START + streamed_call(handle) + end("tool_use"), SSE)
        upstream.fail_next(200, M_START + streamed_text("read it") + end("end_turn"), SSE)
    else:
        upstream.fail_next(200, dumps({**message([read_call(handle)]), "usage": usage}))
        upstream.fail_next(200, dumps({**message([{"type": "text", "text": "read it"}], "end_turn"), "usage": usage}))
    r = rb.send(rb_proxy, stream)
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 2
    if stream:
        evs = frames(r.content)
        assert evs[-1][0] == "message_stop"
        (delta,) = [d for n, d in evs if n == "message_delta"]
        assert delta["usage"]["output_tokens"] == 2 * most
    else:
        assert r.json()["usage"]["output_tokens"] == 2 * most
        assert r.json()["content"] == [{"type": "text", "text": "read it"}]
