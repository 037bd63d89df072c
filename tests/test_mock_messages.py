"""The mock upstream's Anthropic Messages API, checked through the official anthropic SDK (no proxy involved).

If these pass, the SDK accepts every object, event and error the mock sends
(validated against its types, with no field it does not know), and the
mock's token and cache figures are the ones Anthropic's documented rules give
for the mock's rendering.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import _mock_stream
import anthropic
import httpx
import mock_upstream
import pydantic
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from mock_upstream import (
    MockUpstream,
    messages_error_body,
    messages_prompt_chunks,
    messages_prompt_token_ids,
    messages_prompt_tokens,
    min_cacheable_tokens,
    render_block,
    tokens,
)
from sleep_spy import SleepSpy

MODEL = "claude-opus-4-7"
EPH = {"type": "ephemeral"}
WEATHER = {"name": "get_weather", "description": "Current weather for a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
STREAM_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


@pytest.fixture
def client(upstream: MockUpstream) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=upstream.base_url[:-3], api_key="k", max_retries=0)


def long_text(n_words: int, salt: str = "") -> str:
    return " ".join(f"{salt}word{i} is number {i}." for i in range(n_words))


def ends(body: dict[str, Any]) -> list[int]:
    """Token position after each block of the mock's rendering (where a cached prefix can end)."""
    out, pos = [], 0
    for chunk in messages_prompt_chunks(body):
        pos += len(chunk)
        out.append(pos)
    return out


def cache(r: Message) -> tuple[int, int, int]:
    """(cache read, cache creation, uncached input) as billed."""
    return r.usage.cache_read_input_tokens or 0, r.usage.cache_creation_input_tokens or 0, r.usage.input_tokens


def known_fields_only(obj: Any, where: str = "") -> None:
    """Fail on any field the SDK's types do not declare (its models accept extras silently)."""
    if isinstance(obj, pydantic.BaseModel):
        assert not obj.model_extra, f"{where}: fields unknown to the SDK: {sorted(obj.model_extra)}"
        for name in type(obj).model_fields:
            known_fields_only(getattr(obj, name), f"{where}.{name}")
    elif isinstance(obj, list):
        for i, x in enumerate(obj):
            known_fields_only(x, f"{where}.{i}")


def sse_frames(raw: str) -> list[tuple[str, str]]:
    """(event name, data text) of each `event: <type>\\ndata: <json>\\n\\n` frame; fails on any other framing."""
    assert raw.endswith("\n\n")
    frames = []
    for block in raw[:-2].split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        frames.append((name[len("event: "):], data[len("data: "):]))
    return frames


def post(client: anthropic.Anthropic, body: dict[str, Any], path: str = "/v1/messages") -> Message:
    """Send `body` as it is (the SDK's typed create would refuse a malformed one before sending)."""
    return client.post(path, body=body, cast_to=Message)


# --------------------------------------------------------------------------- messages and streams

def test_create_returns_a_valid_message(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    upstream.script("Hello there, friend.")
    body: dict[str, Any] = {"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]}
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=100, **body)
    m = Message.model_validate(json.loads(raw.http_response.text))
    known_fields_only(m, "message")
    assert isinstance(raw.parse(), Message) and raw.parse() == m
    assert (m.type, m.role, m.model, m.stop_reason, m.stop_sequence) == ("message", "assistant", MODEL, "end_turn",
                                                                        None)
    assert m.id.startswith("msg_mock") and [b.type for b in m.content] == ["text"]
    assert m.content[0].text == "Hello there, friend."
    assert m.usage.input_tokens == messages_prompt_tokens(body) == len(messages_prompt_token_ids(body)) > 0
    assert m.usage.output_tokens == len(tokens("Hello there, friend."))
    assert cache(m)[:2] == (0, 0) and m.usage.service_tier == "standard"
    assert m.usage.cache_creation.ephemeral_5m_input_tokens == m.usage.cache_creation.ephemeral_1h_input_tokens == 0
    rec = upstream.requests[-1]
    assert (rec.method, rec.path, rec.status) == ("POST", "/v1/messages", 200)
    assert rec.headers["authorization"] == "Bearer k" and rec.json["max_tokens"] == 100  # how SDK 2.x sends a key
    assert rec.usage == json.loads(raw.http_response.text)["usage"]
    assert raw.headers["request-id"].startswith("req_mock")
    assert client.messages.create(model=MODEL, max_tokens=10, **body).content[0].text == "ok"  # queue empty


def test_rendering_rules() -> None:
    """Block by block; a string is one text block; same-role messages are one turn; cache_control is not text."""
    one = {"messages": [{"role": "user", "content": "hi"}]}
    assert messages_prompt_chunks(one) == [tokens("<|user|>\nhi\n")]
    assert messages_prompt_chunks(one) == messages_prompt_chunks(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": EPH}]}]})
    a, b = {"type": "text", "text": "a"}, {"type": "text", "text": "b"}
    split = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [b]}]}
    joined = {"messages": [{"role": "user", "content": [a, b]}]}
    assert messages_prompt_chunks(split) == messages_prompt_chunks(joined) == [tokens("<|user|>\na\n"), tokens("b\n")]
    body = {"tools": [dict(WEATHER, cache_control=EPH)],
            "system": [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2", "cache_control": EPH}],
            "messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                            "input": {"city": "Oslo"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                                       "content": [{"type": "text", "text": "down"},
                                                                   {"type": "image", "source": {}}]}]}]}
    assert messages_prompt_chunks(body) == [tokens(t) for t in (
        f"<|tool|>{json.dumps(WEATHER)}\n", "<|system|>\ns1\n", "s2\n", "<|user|>\nq\n",
        '<|assistant|>\n<tool_use id=t1>get_weather({"city": "Oslo"})\n',
        "<|user|>\n<tool_result id=t1 error>down\n[image]\n")]
    unknown = {"type": "search_result", "title": "T", "cache_control": EPH, "source": "s"}
    assert render_block(unknown) == '{"source": "s", "title": "T", "type": "search_result"}'
    assert render_block({"type": "thinking", "thinking": "hmm", "signature": "x"}) == "<thinking>hmm"


def test_stream_wire_format(upstream: MockUpstream) -> None:
    """The exact frames: named events, the API's order, usage split between message_start and message_delta."""
    upstream.script("one two")
    body = {"model": MODEL, "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with httpx.stream("POST", upstream.base_url + "/messages", json=body, headers={"x-api-key": "k"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw()).decode()
    frames = sse_frames(raw)
    assert [name for name, _ in frames] == [
        "message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"]
    assert 'event: ping\ndata: {"type": "ping"}\n\n' in raw
    events = [json.loads(data) for _, data in frames]
    assert all(name == e["type"] for (name, _), e in zip(frames, events))
    for e in events:
        if e["type"] != "ping":
            known_fields_only(STREAM_EVENT.validate_python(e), e["type"])
    start, delta = events[0]["message"], events[-2]
    n = messages_prompt_tokens(body)
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["output_tokens"] == 1 and start["usage"]["input_tokens"] == n
    assert events[1]["content_block"] == {"type": "text", "text": ""}
    assert [e["delta"] for e in events[3:5]] == [{"type": "text_delta", "text": "one"},
                                                 {"type": "text_delta", "text": " two"}]
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"] == {"input_tokens": n, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                              "output_tokens": len(tokens("one two"))}


def test_sdk_stream_assembles_text(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    upstream.script(text, text)
    msgs: Any = [{"role": "user", "content": "go"}]
    with client.messages.stream(model=MODEL, max_tokens=100, messages=msgs) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text and len(pieces) == len(text.split())
    assert final.content[0].text == text and final.stop_reason == "end_turn"
    assert final.usage.model_dump(exclude_none=True) == upstream.requests[-1].usage
    plain = client.messages.create(model=MODEL, max_tokens=100, messages=msgs)
    assert [(b.type, b.text) for b in plain.content] == [(b.type, b.text) for b in final.content]
    assert plain.usage == final.usage


def test_streamed_tool_use_and_thinking(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    args = {"city": "San Francisco, California", "units": "celsius"}
    upstream.script({"content": "Checking.", "thinking": "The user wants weather.",
                     "tool_calls": [{"name": "get_weather", "arguments": args},
                                    {"name": "get_weather", "arguments": {"city": "Oslo"}}]})
    partial: dict[int, str] = {}
    kinds: list[str] = []
    with client.messages.stream(model=MODEL, max_tokens=2000, tools=[WEATHER],
                                thinking={"type": "enabled", "budget_tokens": 1024},
                                messages=[{"role": "user", "content": "weather in sf and oslo"}]) as stream:
        for e in stream:
            if e.type == "content_block_delta":
                kinds.append(e.delta.type)
                if e.delta.type == "input_json_delta":
                    partial[e.index] = partial.get(e.index, "") + e.delta.partial_json
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, call1, call2 = final.content
    assert thinking.thinking == "The user wants weather." and thinking.signature and text.text == "Checking."
    assert (call1.id, call1.name, call1.input) == ("toolu_mock1", "get_weather", args)
    assert (call2.id, call2.input) == ("toolu_mock2", {"city": "Oslo"})
    assert json.loads(partial[2]) == args and final.stop_reason == "tool_use"
    assert kinds.count("signature_delta") == 1 and kinds.count("input_json_delta") > 4
    assert final.usage.output_tokens == sum(len(tokens(t)) for t in (
        "The user wants weather.", "Checking.", "get_weather" + json.dumps(args), 'get_weather{"city": "Oslo"}'))
    # the same reply unstreamed: identical blocks, the signature deterministic
    upstream.script({"content": "Checking.", "thinking": "The user wants weather.",
                     "tool_calls": [{"name": "get_weather", "arguments": args}]})
    r = client.messages.create(model=MODEL, max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 1024},
                               messages=[{"role": "user", "content": "weather in sf"}])
    assert [b.type for b in r.content] == ["thinking", "text", "tool_use"] and r.content[0].signature
    plain = client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert [b.type for b in plain.content] == ["text"]  # no thinking unless the request enables it


def test_tool_loop(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    upstream.script({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}, "Sunny in Paris.")
    msgs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    r1 = client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER], messages=msgs)
    assert r1.stop_reason == "tool_use" and [b.type for b in r1.content] == ["tool_use"]
    call = r1.content[0]
    msgs += [r1.to_param(), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 24C"}]}]
    r2 = client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER], messages=msgs)
    assert r2.content[0].text == "Sunny in Paris." and r2.stop_reason == "end_turn"
    sent = upstream.requests[-1].json
    assert sent["messages"][2]["content"][0]["tool_use_id"] == call.id == "toolu_mock1"
    assert r2.usage.input_tokens == messages_prompt_tokens({"tools": [WEATHER], "messages": sent["messages"]})
    assert r2.usage.input_tokens > r1.usage.input_tokens


def test_count_tokens(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    """The same count as a create bills; no max_tokens needed; nothing cached, no script entry used."""
    body: dict[str, Any] = {"system": [{"type": "text", "text": long_text(300), "cache_control": EPH}],
                            "tools": [WEATHER], "messages": [{"role": "user", "content": "hello"}]}
    upstream.script("scripted")
    count = client.messages.count_tokens(model=MODEL, **body)
    assert isinstance(count, MessageTokensCount) and count.input_tokens == messages_prompt_tokens(body) > 1024
    assert upstream.requests[-1].path == "/v1/messages/count_tokens"
    r = client.messages.create(model=MODEL, max_tokens=10, **body)
    assert r.content[0].text == "scripted" and cache(r)[0] == 0 and cache(r)[1] > 0
    assert sum(cache(r)) == count.input_tokens
    with pytest.raises(anthropic.BadRequestError, match="messages: Field required"):
        post(client, {"model": MODEL}, "/v1/messages/count_tokens")


# --------------------------------------------------------------------------- errors

TOOL_USE = {"type": "tool_use", "id": "toolu_X", "name": "get_weather", "input": {}}
ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("no max_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
    ("no messages", {"model": MODEL, "max_tokens": 5}, "messages: Field required"),
    ("no model", {"max_tokens": 5, "messages": []}, "model: Field required"),
    ("bad max_tokens", {"model": MODEL, "max_tokens": "5", "messages": []},
     "max_tokens: Input should be a valid integer"),
    ("negative max_tokens", {"model": MODEL, "max_tokens": -1, "messages": []},
     "max_tokens: Input should be greater than or equal to 0"),
    ("messages not a list", {"model": MODEL, "max_tokens": 5, "messages": "hi"},
     "messages: Input should be a valid list"),
    ("no message", {"model": MODEL, "max_tokens": 5, "messages": []}, "messages: at least one message is required"),
    ("system role", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
     "messages.0.role: Input should be 'user' or 'assistant'"),
    ("orphan tool_result", {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_X", "content": "r"}]}]},
     "messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_X. Each `tool_result` "
     "block must have a corresponding `tool_use` block in the previous message."),
    ("unanswered tool_use", {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
        {"role": "assistant", "content": [TOOL_USE]}, {"role": "user", "content": "d"}]},
     "messages.3: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_X. Each "
     "`tool_use` block must have a corresponding `tool_result` block in the next message."),
    ("empty content", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": []}]},
     "messages.0: all messages must have non-empty content except for the optional final assistant message"),
    ("empty text block", {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "text", "text": ""}]}]},
     "messages: text content blocks must be non-empty"),
    ("trailing whitespace", {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is "}]},
     "messages: final assistant content cannot end with trailing whitespace"),
    ("bad ttl", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "10m"}}]}]},
     "messages.0.content.0.text.cache_control.ephemeral.ttl: Input should be '5m' or '1h'"),
    ("system block not text", {"model": MODEL, "max_tokens": 5, "system": [{"type": "image"}],
                                "messages": [{"role": "user", "content": "x"}]},
     "system.0.type: Input should be 'text'"),
    ("five breakpoints", {"model": MODEL, "max_tokens": 5, "cache_control": EPH,
                          "tools": [dict(WEATHER, cache_control=EPH)],
                          "system": [{"type": "text", "text": "s", "cache_control": EPH}],
                          "messages": [{"role": "user", "content": [
                                           {"type": "text", "text": "a", "cache_control": EPH}]},
                                       {"role": "assistant", "content": [TOOL_USE]},
                                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_X",
                                                                     "content": [{"type": "text", "text": "b",
                                                                                  "cache_control": EPH}]}]}]},
     "A maximum of 4 blocks with cache_control may be provided. Found 5."),
]


@pytest.mark.parametrize(("body", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_validation_errors(client: anthropic.Anthropic, upstream: MockUpstream, body: dict[str, Any],
                           message: str) -> None:
    upstream.script("not consumed")
    with pytest.raises(anthropic.BadRequestError) as ei:
        post(client, body)
    err = ei.value
    assert err.status_code == 400 and upstream.requests[-1].status == 400
    ErrorResponse.model_validate(err.body)
    assert err.body == {"type": "error", "error": {"type": "invalid_request_error", "message": message},
                        "request_id": err.request_id}
    assert err.request_id and err.request_id.startswith("req_mock") and err.api_message == message
    assert client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]) \
        .content[0].text == "not consumed"


def test_accepted_shapes(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    """What the API accepts that a stricter mock might refuse, billed as the combined turns they are."""
    same_role: Any = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                      {"role": "assistant", "content": "c"}, {"role": "assistant", "content": "d"},
                      {"role": "user", "content": "e"}]
    r = client.messages.create(model=MODEL, max_tokens=5, messages=same_role)
    combined = [{"role": "user", "content": [{"type": "text", "text": t} for t in "ab"]},
                {"role": "assistant", "content": [{"type": "text", "text": t} for t in "cd"]},
                {"role": "user", "content": "e"}]
    assert r.usage.input_tokens == messages_prompt_tokens({"messages": combined})
    # the tool_use and its answer may sit in any message of their turns
    split_turns: Any = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [TOOL_USE]},
                        {"role": "assistant", "content": "more"},
                        {"role": "user", "content": "note"},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_X"}]}]
    assert client.messages.create(model=MODEL, max_tokens=5, messages=split_turns).stop_reason == "end_turn"
    prefill: Any = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}]
    assert client.messages.create(model=MODEL, max_tokens=5, messages=prefill).content
    unknown = {"type": "search_result", "source": "s", "title": "T", "content": [{"type": "text", "text": "x"}]}
    body: Any = {"messages": [{"role": "user", "content": [unknown, {"type": "text", "text": "?"}]}]}
    r = client.messages.create(model=MODEL, max_tokens=5, **body)
    assert r.usage.input_tokens == len(tokens("<|user|>\n" + json.dumps(unknown, sort_keys=True) + "\n")) + \
        len(tokens("?\n"))


def test_auth_not_found_and_overloaded(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(upstream.base_url + "/messages", json=body)
    assert r.status_code == 401 and r.headers["request-id"] == r.json()["request_id"]
    assert r.json()["error"] == {"type": "authentication_error", "message": "x-api-key header is required"}
    ErrorResponse.model_validate(r.json())
    assert httpx.post(upstream.base_url + "/messages", json=body,
                      headers={"authorization": "Bearer tok"}).status_code == 200  # OAuth-style
    # the key is the cache scope, however it is sent: as x-api-key or (as the SDK sends it) a Bearer token
    cached = dict(cached_body(), model=MODEL, max_tokens=5)
    client.messages.create(**cached)
    r = httpx.post(upstream.base_url + "/messages", json=cached, headers={"x-api-key": "k"})
    assert r.status_code == 200 and r.json()["usage"]["cache_read_input_tokens"] == messages_prompt_tokens(cached)
    with pytest.raises(anthropic.NotFoundError) as nf:
        post(client, body, "/v1/messages/nope")
    assert nf.value.body["error"] == {"type": "not_found_error", "message": "Not Found"}
    upstream.fail_next(529, messages_error_body("overloaded_error", "Overloaded", "req_busy"))
    with pytest.raises(anthropic.OverloadedError) as ov:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert ov.value.status_code == 529 and ov.value.type == "overloaded_error"
    ErrorResponse.model_validate(ov.value.body)
    assert client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]).content


def test_prompt_too_long(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    upstream.windows["claude-tiny"] = 100
    msgs: Any = [{"role": "user", "content": long_text(50)}]
    n = messages_prompt_tokens({"messages": msgs})
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model="claude-tiny", max_tokens=5, messages=msgs)
    assert ei.value.body["error"] == {"type": "invalid_request_error",
                                      "message": f"prompt is too long: {n} tokens > 100 maximum"}
    # the prompt alone is compared with the window, whatever max_tokens asks for
    short: Any = [{"role": "user", "content": "hi"}]
    assert client.messages.create(model="claude-tiny", max_tokens=10_000, messages=short).content
    assert upstream.window_for(MODEL) == 200_000 and upstream.window_for("claude-x-32k") == 32_000
    assert upstream.window_for("gpt-unknown") == 128_000


# --------------------------------------------------------------------------- prompt caching

def cached_body(salt: str = "", cc: Any = EPH) -> dict[str, Any]:
    return {"system": [{"type": "text", "text": long_text(250, salt)}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "question", "cache_control": cc}]}]}


def test_breakpoint_caching_reads_what_it_wrote(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    body = cached_body()
    total = messages_prompt_tokens(body)
    assert total > 1024
    r1 = client.messages.create(model=MODEL, max_tokens=5, **body)
    assert cache(r1) == (0, total, 0) and r1.usage.cache_creation.ephemeral_5m_input_tokens == total
    r2 = client.messages.create(model=MODEL, max_tokens=5, **body)
    assert cache(r2) == (total, 0, 0)
    assert upstream.requests[-1].usage["cache_read_input_tokens"] == total
    # a changed last block: the breakpoint's prefix is new, and nothing earlier was written
    other = cached_body()
    other["messages"][0]["content"][0]["text"] = "another question"
    assert cache(client.messages.create(model=MODEL, max_tokens=5, **other)) == (0, messages_prompt_tokens(other), 0)
    # scope: API key and model
    k2 = anthropic.Anthropic(base_url=upstream.base_url[:-3], api_key="k2", max_retries=0)
    assert cache(k2.messages.create(model=MODEL, max_tokens=5, **body))[0] == 0
    assert cache(client.messages.create(model="claude-sonnet-4-6", max_tokens=5, **body))[0] == 0
    assert cache(client.messages.create(model=MODEL, max_tokens=5, **body))[0] == total
    upstream.reset()
    assert cache(client.messages.create(model=MODEL, max_tokens=5, **body))[0] == 0


def test_moved_breakpoint_reads_the_old_prefix_through_the_lookback(client: anthropic.Anthropic,
                                                                    upstream: MockUpstream) -> None:
    body1 = cached_body()
    client.messages.create(model=MODEL, max_tokens=5, **body1)
    written = ends(body1)[1]  # system block + the question
    body2: dict[str, Any] = {"system": body1["system"], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "question"}]},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": [{"type": "text", "text": "follow-up", "cache_control": EPH}]}]}
    r = client.messages.create(model=MODEL, max_tokens=5, **body2)
    assert cache(r) == (written, ends(body2)[3] - written, 0)

    def notes(k: int) -> dict[str, Any]:  # the question, then k more blocks, the last one marked
        blocks = [{"type": "text", "text": "question"}] + [{"type": "text", "text": f"note {i}"} for i in range(k)]
        blocks[-1] = dict(blocks[-1], cache_control=EPH)
        return {"system": body1["system"], "messages": [{"role": "user", "content": blocks}]}

    far = notes(21)  # the old breakpoint is 21 blocks before the new one: out of reach
    assert cache(client.messages.create(model=MODEL, max_tokens=5, **far)) == (0, ends(far)[-1], 0)
    near = notes(20)  # 20 blocks before: found
    assert cache(client.messages.create(model=MODEL, max_tokens=5, **near)) == (written, ends(near)[-1] - written, 0)


def test_no_breakpoint_no_cache_and_the_minimum(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    plain = cached_body(cc=None)
    del plain["messages"][0]["content"][0]["cache_control"]
    for _ in range(2):
        r = client.messages.create(model=MODEL, max_tokens=5, **plain)
        assert cache(r) == (0, 0, messages_prompt_tokens(plain))
    short: Any = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": long_text(20), "cache_control": EPH}]}]}
    assert messages_prompt_tokens(short) < 1024
    for _ in range(2):
        assert cache(client.messages.create(model=MODEL, max_tokens=5, **short)) == (
            0, 0, messages_prompt_tokens(short))
    body = cached_body()  # ~1.5k tokens: enough for Opus, not for Haiku (2048)
    n = messages_prompt_tokens(body)
    assert min_cacheable_tokens("claude-haiku-4-5") == 2048 > n > min_cacheable_tokens(MODEL) == 1024
    for _ in range(2):
        assert cache(client.messages.create(model="claude-haiku-4-5", max_tokens=5, **body)) == (0, 0, n)
    client.messages.create(model=MODEL, max_tokens=5, **body)
    assert cache(client.messages.create(model=MODEL, max_tokens=5, **body)) == (n, 0, 0)


def test_ttl_expiry_refresh_and_1h(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    now = [1000.0]
    upstream.clock = lambda: now[0]
    body = cached_body()
    n = messages_prompt_tokens(body)

    def at(t: float, b: dict[str, Any]) -> tuple[int, int, int]:
        now[0] = 1000.0 + t
        return cache(client.messages.create(model=MODEL, max_tokens=5, **b))

    assert at(0, body) == (0, n, 0)
    assert at(299, body) == (n, 0, 0)  # warm; the read refreshes the 5 minutes
    assert at(598, body) == (n, 0, 0)  # only warm because of that refresh
    assert at(899, body) == (0, n, 0)  # 301 s idle: gone, written again
    # a prefix found through the lookback (not at a breakpoint of the request) is refreshed too
    base = cached_body(salt="r")
    moved = {"system": base["system"], "messages": [{"role": "user", "content": [
        {"type": "text", "text": "question"}, {"type": "text", "text": "more", "cache_control": EPH}]}]}
    first = ends(base)[1]
    assert at(2000, base) == (0, first, 0)
    assert at(2200, moved) == (first, ends(moved)[2] - first, 0)
    assert at(2450, base) == (first, 0, 0)  # written at 2000: warm at 2450 only through the refresh at 2200
    hour = cached_body(salt="h", cc={"type": "ephemeral", "ttl": "1h"})
    m = messages_prompt_tokens(hour)
    now[0] = 5000.0
    r = client.messages.create(model=MODEL, max_tokens=5, **hour)
    assert (r.usage.cache_creation.ephemeral_1h_input_tokens, r.usage.cache_creation.ephemeral_5m_input_tokens) \
        == (m, 0)
    assert at(4000 + 3599, hour) == (m, 0, 0)
    assert at(4000 + 3599 + 3601, hour) == (0, m, 0)


def test_several_breakpoints_split_by_ttl(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    tool = dict(WEATHER, description=long_text(250), cache_control={"type": "ephemeral", "ttl": "1h"})
    body: dict[str, Any] = {"tools": [tool], "system": [{"type": "text", "text": "Be brief.", "cache_control": EPH}],
                            "messages": [{"role": "user", "content": "first question"}]}
    e = ends(body)  # tool, system, message
    assert e[0] > 1024
    r1 = client.messages.create(model=MODEL, max_tokens=5, **body)
    assert cache(r1) == (0, e[1], e[2] - e[1])  # the last message is after the last breakpoint
    assert (r1.usage.cache_creation.ephemeral_1h_input_tokens,
            r1.usage.cache_creation.ephemeral_5m_input_tokens) == (e[0], e[1] - e[0])
    nxt = dict(body, messages=[{"role": "user", "content": [
        {"type": "text", "text": "second question", "cache_control": EPH}]}])
    e2 = ends(nxt)
    r2 = client.messages.create(model=MODEL, max_tokens=5, **nxt)
    assert cache(r2) == (e[1], e2[2] - e[1], 0) and r2.usage.cache_creation.ephemeral_1h_input_tokens == 0


def test_automatic_caching_and_the_limit(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    body = cached_body(cc=None)
    del body["messages"][0]["content"][0]["cache_control"]
    n = messages_prompt_tokens(body)
    assert cache(client.messages.create(model=MODEL, max_tokens=5, cache_control=EPH, **body)) == (0, n, 0)
    assert cache(client.messages.create(model=MODEL, max_tokens=5, cache_control=EPH, **body)) == (n, 0, 0)
    four: Any = {"system": [{"type": "text", "text": f"s{i}", "cache_control": EPH} for i in range(3)],
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": EPH}]}]}
    assert client.messages.create(model=MODEL, max_tokens=5, **four).content
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control may be "
                                                        "provided. Found 5."):
        client.messages.create(model=MODEL, max_tokens=5, cache_control=EPH, **four)


def test_max_tokens_zero_prewarms(client: anthropic.Anthropic, upstream: MockUpstream) -> None:
    """As the SDK documents: max_tokens 0 fills the cache and generates nothing."""
    upstream.script("kept")
    body = cached_body()
    n = messages_prompt_tokens(body)
    warm = client.messages.create(model=MODEL, max_tokens=0, **body)
    assert (warm.content, warm.stop_reason, warm.usage.output_tokens) == ([], "max_tokens", 0)
    assert cache(warm) == (0, n, 0)
    r = client.messages.create(model=MODEL, max_tokens=5, **body)
    assert cache(r) == (n, 0, 0) and r.content[0].text == "kept"


def test_stream_respects_delays(client: anthropic.Anthropic, upstream: MockUpstream,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`delay` before the first event, `chunk_delay` between events, and the events really streamed.

    What the mock waits is read from its sleeps; that it streams, from ordering: before each
    pause between events the mock waits until the client holds the first event, which it
    could not if the body were sent in one piece at the end.
    """
    got_first = threading.Event()
    spy = SleepSpy(before_each=lambda: got_first.wait(10) if spy.slept[1:] else None)
    monkeypatch.setattr(mock_upstream, "asyncio", spy)
    monkeypatch.setattr(_mock_stream, "asyncio", spy)
    upstream.delay, upstream.chunk_delay = 0.1, 0.03
    upstream.script("w1 w2 w3 w4")
    events = 0
    with client.messages.stream(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]) as s:
        for _ in s:
            events += 1
            got_first.set()
    pauses = len(spy.slept) - 1
    assert events >= 5 and pauses >= 8  # the SDK folds some wire events; the mock sent 10 after the first
    assert spy.slept == [0.1] + [0.03] * pauses  # a pause before each event after the first
    assert spy.hooked == [None] + [True] * pauses, spy.hooked  # the client had the first event before them


@pytest.mark.parametrize("bad", [["x"], {"a": 1}, 7, None])
def test_a_tool_id_that_is_not_a_string_is_a_400(upstream, bad):
    import httpx

    for messages in ([{"role": "user", "content": "go"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": bad, "name": "Bash", "input": {}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}],
                     [{"role": "user", "content": "go"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": bad, "content": "x"}]}]):
        r = httpx.post(upstream.base_url + "/messages", headers={"x-api-key": "k"},
                       json={"model": "claude-x", "max_tokens": 8, "messages": messages})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
