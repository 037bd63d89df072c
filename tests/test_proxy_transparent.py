"""The proxy with no transform active: clients and providers notice nothing but the base URL."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import openai
import pytest

KEY = "sk-test-client-key-123"
# Offload off: no transform applies, so the proxy must be invisible.
TRANSPARENT = {"defaults": {"offload": {"enabled": False}, "context_read": {"enabled": False},
                            "status_bar": {"enabled": False}}}
pytestmark = pytest.mark.proxy_config(**TRANSPARENT)


def sdk(proxy, recorder: list | None = None, path: str = "/v1") -> openai.OpenAI:
    hooks = {"request": [lambda r: recorder.append(r)]} if recorder is not None else {}
    return proxy.openai(path, api_key=KEY, http_client=proxy.http_client(event_hooks=hooks))


TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def test_chat_completion_reaches_provider_byte_for_byte(proxy, upstream):
    sent: list[httpx.Request] = []
    client = sdk(proxy, sent)
    upstream.script("Bonjour, monde ✓")
    out = client.chat.completions.create(
        model="gpt-4o-mini", temperature=0.2,
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "héllo 世界"}],
        extra_body={"unknown_field": {"nested": [1, 2]}, "reasoning_effort": "low"})
    assert out.choices[0].message.content == "Bonjour, monde ✓"
    assert upstream.requests[-1].body == sent[-1].content
    assert upstream.requests[-1].path == "/v1/chat/completions"


def test_handwritten_body_keeps_key_order_escapes_and_unknown_fields(proxy, upstream):
    raw = (b'{ "messages" : [{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00", "x-extra": null}],'
           b' "model": "gpt-4o", "zzz": 1.50, "aaa": [true, false]}')
    r = proxy.post("/v1/chat/completions", content=raw,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert upstream.requests[-1].body == raw


def test_streaming_passes_chunks_through_as_they_arrive(make_proxy, upstream):
    # The transport is the subject (ASGITransport buffers a response), so a real server. The provider holds
    # its stream open until the client has read every word: a proxy that buffered the stream until the
    # provider ended it would leave the provider waiting. Told without a clock.
    proxy = make_proxy(real=True, **TRANSPARENT)
    upstream.script("one two three four five six")
    upstream.stream_gate = gate = threading.Event()
    parts = []
    for chunk in sdk(proxy).chat.completions.create(model="gpt-4o-mini", stream=True,
                                                    messages=[{"role": "user", "content": "count"}]):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
            if "".join(parts) == "one two three four five six":
                gate.set()  # the whole text arrived while the provider still held its stream open
    assert "".join(parts) == "one two three four five six"
    assert upstream.stream_released == [True]


def test_stream_with_usage_and_tools_matches_direct_call(proxy, upstream):
    def run(base) -> list:
        client = (openai.OpenAI(base_url=base, api_key=KEY, max_retries=0) if isinstance(base, str)
                  else base.openai(api_key=KEY))
        upstream.script({"tool_calls": [{"name": "read_file", "arguments": {"path": "/etc/hosts"}}]})
        chunks = list(client.chat.completions.create(
            model="gpt-4o-mini", stream=True, stream_options={"include_usage": True}, tools=TOOLS,
            messages=[{"role": "user", "content": "read hosts"}]))
        return [c.model_dump(exclude={"id", "created"}) for c in chunks]

    direct = run(upstream.base_url)
    upstream.reset()
    via = run(proxy)
    assert via == direct
    assert via[-1]["usage"]["prompt_tokens"] > 0


def test_tool_call_round_trip_with_sdk(proxy, upstream):
    client = sdk(proxy)
    upstream.script({"tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]}, "done")
    msgs = [{"role": "user", "content": "open a.py"}]
    first = client.chat.completions.create(model="gpt-4o-mini", tools=TOOLS, messages=msgs)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "read_file" and json.loads(call.function.arguments) == {"path": "a.py"}
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "print(1)"}]
    second = client.chat.completions.create(model="gpt-4o-mini", tools=TOOLS, messages=msgs)
    assert second.choices[0].message.content == "done"
    assert json.loads(upstream.requests[-1].body)["messages"][-1]["content"] == "print(1)"


async def test_async_client_concurrent_requests(proxy, upstream):
    client = proxy.async_openai(api_key=KEY)
    outs = await asyncio.gather(*[client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"n{i}"}]) for i in range(10)])
    assert all(o.choices[0].message.content == "ok" for o in outs)
    stream = await client.chat.completions.create(model="gpt-4o-mini", stream=True,
                                                  messages=[{"role": "user", "content": "s"}])
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "ok"
    await client.close()


def test_models_and_embeddings_pass_through(proxy, upstream):
    via, direct = sdk(proxy), openai.OpenAI(base_url=upstream.base_url, api_key=KEY, max_retries=0)
    assert [m.id for m in via.models.list()] == [m.id for m in direct.models.list()]
    e1 = via.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    e2 = direct.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert e1.model_dump() == e2.model_dump()


def test_responses_stream_passes_through(proxy, upstream):
    client = sdk(proxy)
    events = [e.type for e in client.responses.create(model="gpt-4o-mini", input="hello there", stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert "response.output_text.delta" in events


def test_other_requests_keep_method_query_headers_and_status(proxy, upstream):
    r = proxy.request("PATCH", "/v1/echo/things?a=1&b=%C3%A9", content=b"\x00\x01raw",
                      headers={"authorization": f"Bearer {KEY}", "x-custom": "yes", "x-ctx-route": "default",
                               "connection": "keep-alive, x-hop", "x-hop": "drop-me"})
    assert r.status_code == 200 and r.headers["x-mock-echo"] == "1"
    rec = upstream.requests[-1]
    assert (rec.method, rec.path, rec.query, rec.body) == ("PATCH", "/v1/echo/things", "a=1&b=%C3%A9", b"\x00\x01raw")
    assert rec.headers["x-custom"] == "yes" and rec.headers["authorization"] == f"Bearer {KEY}"
    assert "x-ctx-route" not in rec.headers and "x-hop" not in rec.headers


def test_provider_error_reaches_client_unchanged(proxy, upstream):
    body = {"error": {"message": "Rate limit reached for gpt-4o", "type": "requests", "param": None,
                      "code": "rate_limit_exceeded"}}
    upstream.fail_next(429, body, headers={"retry-after": "7"})
    r = proxy.post("/v1/chat/completions", json={"model": "m", "messages": []},
                   headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 429 and r.json() == body and r.headers["retry-after"] == "7"
    with pytest.raises(openai.BadRequestError) as exc:
        sdk(proxy).chat.completions.create(model="tiny-1k", messages=[{"role": "user", "content": "x " * 3000}])
    assert exc.value.code == "context_length_exceeded"


def test_provider_cookies_never_ride_along_on_later_requests(proxy, upstream):
    upstream.fail_next(200, {"object": "list", "data": []}, headers={"set-cookie": "__cf_bm=SECRET-A; Path=/"})
    a = proxy.get("/v1/models", headers={"authorization": "Bearer sk-tenant-a"})
    assert "__cf_bm=SECRET-A" in a.headers.get("set-cookie", "")  # the client that got it sees it
    proxy.post("/v1/chat/completions", headers={"authorization": "Bearer sk-tenant-b"},
               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    proxy.get("/v1/models", headers={"authorization": "Bearer sk-tenant-b"})
    assert all("cookie" not in r.headers for r in upstream.requests[1:])


def test_provider_headers_reach_the_client_byte_for_byte(proxy, upstream):
    """Passed on as the provider sent them: a UTF-8 value is not decoded and encoded again as Latin-1."""
    utf8 = "caf\u00e9 \u2713".encode()  # what the provider puts on the wire
    body = {"error": {"message": "slow down", "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
    for path in ("/v1/chat/completions", "/v1/models"):
        upstream.fail_next(429, body, headers={"x-note": utf8.decode("latin-1")})  # the mock's server: Latin-1
        r = proxy.request("POST" if "chat" in path else "GET", path, headers={"authorization": f"Bearer {KEY}"},
                          json={"model": "m", "messages": []} if "chat" in path else None)
        assert r.status_code == 429
        assert [v for k, v in r.headers.raw if k.lower() == b"x-note"] == [utf8], path
