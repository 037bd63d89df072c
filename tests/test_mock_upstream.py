"""The mock upstream checked through the official openai SDK (no proxy involved).

If these pass, a proxy test that fails against the mock is about the proxy:
the SDK accepts every shape the mock emits, and the mock's token and cache
accounting matches an independent recomputation.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import zlib
from typing import Any

import _mock_prompt
import _mock_stream
import httpx
import mock_upstream
import openai
import pydantic
import pytest
from mock_upstream import (
    MockUpstream,
    PrefixCache,
    prompt_chunks,
    prompt_token_ids,
    render_item,
    render_message,
    responses_prompt_chunks,
    responses_prompt_token_ids,
    tokens,
)
from openai.types.responses import Response, ResponseCompactionItem, ResponseReasoningItem, ResponseStreamEvent
from sleep_spy import SleepSpy

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture
def client(upstream: MockUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=upstream.base_url, api_key="sk-test", max_retries=0)


@pytest.fixture
def aclient(upstream: MockUpstream) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=upstream.base_url, api_key="sk-test", max_retries=0)


def long_text(n_words: int, salt: str = "") -> str:
    return " ".join(f"{salt}word{i} is number {i}." for i in range(n_words))


def independent_cached(a: list[int], b: list[int]) -> int:
    """Recompute OpenAI's cached_tokens from flat token lists, without the mock's trie."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return 0 if n < 1024 else n - n % 128


def test_non_streaming_text(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.script("Hello there, friend.")
    msgs: Any = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert r.choices[0].message.content == "Hello there, friend."
    assert r.choices[0].finish_reason == "stop"
    assert (r.object, r.model, r.id) == ("chat.completion", "gpt-4o", "chatcmpl-mock1")
    assert r.system_fingerprint and r.created
    assert r.usage and r.usage.prompt_tokens == len(prompt_token_ids({"messages": msgs}))
    rec = upstream.requests[-1]
    assert (rec.method, rec.path, rec.status) == ("POST", "/v1/chat/completions", 200)
    assert rec.headers["authorization"] == "Bearer sk-test"
    assert json.loads(rec.body) == rec.json and rec.json["messages"] == msgs
    # queue empty -> default reply
    assert client.chat.completions.create(model="gpt-4o", messages=msgs) \
        .choices[0].message.content == "ok"


async def test_streaming_text_assembles(aclient: openai.AsyncOpenAI,
                                        upstream: MockUpstream) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    upstream.script(text)
    stream = await aclient.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "go"}], stream=True)
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert sum(1 for c in chunks if c.choices[0].delta.content) == len(text.split())
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.object == "chat.completion.chunk" and c.usage is None for c in chunks)


@pytest.mark.parametrize("include", [True, False])
def test_stream_usage_chunk_only_when_asked(client: openai.OpenAI, upstream: MockUpstream,
                                            include: bool) -> None:
    upstream.script("a b c")
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True,
        stream_options={"include_usage": True} if include else openai.omit)
    chunks = list(stream)
    usage_chunks = [c for c in chunks if c.usage is not None]
    if include:
        assert len(usage_chunks) == 1 and chunks[-1] is usage_chunks[0]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    else:
        assert usage_chunks == []


def test_stream_wire_format(upstream: MockUpstream) -> None:
    upstream.script("one two")
    with httpx.stream("POST", upstream.base_url + "/chat/completions", json={
            "model": "m", "messages": [], "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw()).decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert json.loads(events[-3][6:])["choices"] == []


def test_tool_call_round_trip(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.script({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
                    "It is sunny in Paris.")
    msgs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[WEATHER_TOOL])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    call = msg.tool_calls[0]
    assert (call.id, call.function.name) == ("call_1", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    msgs += [msg.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    r2 = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[WEATHER_TOOL])
    assert r2.choices[0].message.content == "It is sunny in Paris."
    assert upstream.requests[-1].json["messages"][-1]["tool_call_id"] == "call_1"


def test_streamed_tool_call_assembles(client: openai.OpenAI, upstream: MockUpstream) -> None:
    args = {"city": "San Francisco, California", "units": "celsius"}
    upstream.script({"tool_calls": [{"name": "get_weather", "arguments": args},
                                    {"name": "noop", "arguments": "{}"}]})
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for c in client.chat.completions.create(model="gpt-4o", tools=[WEATHER_TOOL], stream=True,
                                            messages=[{"role": "user", "content": "sf"}]):
        finish = c.choices[0].finish_reason or finish
        for tc in c.choices[0].delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            slot["name"] += (tc.function.name or "") if tc.function else ""
            slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == args
    assert calls[1] == {"id": "call_2", "name": "noop", "arguments": "{}"}


def test_callable_script_sees_request(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.script(lambda req: f"you said {req['messages'][-1]['content']}")
    r = client.chat.completions.create(model="gpt-4o",
                                       messages=[{"role": "user", "content": "banana"}])
    assert r.choices[0].message.content == "you said banana"


def test_cached_tokens_from_real_prefix(client: openai.OpenAI, upstream: MockUpstream) -> None:
    system = {"role": "system", "content": long_text(400)}
    body1: dict[str, Any] = {"messages": [system, {"role": "user", "content": "first"}]}
    body2: dict[str, Any] = {"messages": body1["messages"] + [
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}]}
    assert len(prompt_token_ids(body1)) > 1024
    r1 = client.chat.completions.create(model="gpt-4o", **body1)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    r2 = client.chat.completions.create(model="gpt-4o", **body2)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    expected = independent_cached(prompt_token_ids(body1), prompt_token_ids(body2))
    assert cached == expected and cached > 0 and cached % 128 == 0
    assert r2.usage.prompt_tokens == len(prompt_token_ids(body2))
    # Scope is (Authorization, model): another key or model starts cold.
    other = openai.OpenAI(base_url=upstream.base_url, api_key="sk-other", max_retries=0)
    assert other.chat.completions.create(model="gpt-4o", **body2) \
        .usage.prompt_tokens_details.cached_tokens == 0
    assert client.chat.completions.create(model="gpt-4o-mini", **body2) \
        .usage.prompt_tokens_details.cached_tokens == 0


def test_cached_tokens_need_1024_and_respect_ttl(client: openai.OpenAI,
                                                 upstream: MockUpstream) -> None:
    short: Any = [{"role": "user", "content": long_text(20)}]
    for _ in range(2):
        r = client.chat.completions.create(model="gpt-4o", messages=short)
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # identical but < 1024 tokens
    now = [1000.0]
    upstream.clock, upstream.cache_ttl = (lambda: now[0]), 60.0
    long: Any = [{"role": "user", "content": long_text(400)}]
    client.chat.completions.create(model="gpt-4o", messages=long)
    now[0] += 30
    assert client.chat.completions.create(model="gpt-4o", messages=long) \
        .usage.prompt_tokens_details.cached_tokens > 0
    now[0] += 61
    assert client.chat.completions.create(model="gpt-4o", messages=long) \
        .usage.prompt_tokens_details.cached_tokens == 0


def test_prefix_trie_matches_flat_lcp_and_does_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """300 turns growing to ~100k tokens: same answers as a flat LCP, and linear work.

    Linear work, counted rather than timed: each turn compares tokens only for its one new
    message (one token-by-token comparison per turn, against the single follower there),
    and remembers one new prefix per message it adds.
    """
    compared: list[int] = []
    real_lcp = _mock_prompt.common_prefix_len

    def counting_lcp(a: Any, b: Any) -> int:
        compared.append(len(a))
        return real_lcp(a, b)

    monkeypatch.setattr(_mock_prompt, "common_prefix_len", counting_lcp)
    cache, msgs, prev = PrefixCache(), [{"role": "system", "content": "sys"}], None
    filler = long_text(60)  # ~300+ tokens per turn
    for turn in range(300):
        msgs = msgs + [{"role": "user", "content": f"turn {turn}: {filler}"}]
        body = {"messages": msgs}
        chunks = prompt_chunks(body)
        before = len(compared)
        got = cache.match_and_store(("k", "m"), chunks, 0.0, None)
        assert len(compared) - before <= 1, f"turn {turn}: {len(compared) - before} token-by-token comparisons"
        if compared[before:]:
            assert compared[-1] == len(chunks[-1])  # the comparison was of the new message only
        if prev is not None and turn % 50 == 0:
            ids = prompt_token_ids(body)
            assert got == len(prev)
            assert independent_cached(prev, ids) == got - got % 128
        prev = prompt_token_ids(body) if turn % 50 == 49 else None
    assert len(prompt_token_ids({"messages": msgs})) > 100_000
    assert len(cache._next) <= len(prompt_chunks({"messages": msgs})) + 1  # one prefix per chunk ever sent


def test_context_length_exceeded(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.windows["tiny"] = 100
    msgs: Any = [{"role": "user", "content": long_text(50)}]
    n = len(prompt_token_ids({"messages": msgs}))
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="tiny", messages=msgs)
    assert ei.value.status_code == 400 and ei.value.code == "context_length_exceeded"
    assert ei.value.body == {
        "message": f"This model's maximum context length is 100 tokens. However, your messages "
                   f"resulted in {n} tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}
    # A completion budget counts against the window too.
    small: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="maximum context length is 100 tokens"):
        client.chat.completions.create(model="tiny", messages=small, max_tokens=95)
    assert upstream.window_for("foo-32k") == 32_000
    assert upstream.window_for("unknown") == 128_000


def test_report_cached_false_omits_details(client: openai.OpenAI,
                                          upstream: MockUpstream) -> None:
    upstream.report_cached = False
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    usage = json.loads(raw.text)["usage"]
    assert "prompt_tokens_details" not in usage and usage["prompt_tokens"] > 0
    assert raw.parse().usage.prompt_tokens_details is None
    assert upstream.requests[-1].usage["prompt_tokens_details"] == {"cached_tokens": 0}


def test_embeddings_and_models(client: openai.OpenAI, upstream: MockUpstream) -> None:
    e = client.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"])
    assert [len(d.embedding) for d in e.data] == [8, 8]
    assert upstream.requests[-1].json["encoding_format"] == "base64"  # SDK default
    f = client.embeddings.create(model="text-embedding-3-small", input="alpha",
                                 encoding_format="float")
    assert f.data[0].embedding == pytest.approx(e.data[0].embedding, abs=1e-6)
    assert e.data[0].embedding != e.data[1].embedding and e.usage.prompt_tokens > 0
    upstream.windows["custom-model"] = 1000
    ids = {m.id for m in client.models.list()}
    assert {"gpt-4o-mini", "custom-model"} <= ids


def test_fail_next(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.fail_next(429, {"error": {"message": "slow down", "type": "rate_limit_exceeded",
                                       "param": None, "code": "rate_limit_exceeded"}},
                       headers={"retry-after": "1"})
    upstream.fail_next(503, b"upstream sad")
    msgs: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.RateLimitError) as ei:
        client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert ei.value.status_code == 429 and ei.value.response.headers["retry-after"] == "1"
    with pytest.raises(openai.InternalServerError) as ei2:
        client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert ei2.value.status_code == 503 and ei2.value.response.content == b"upstream sad"
    assert client.chat.completions.create(model="gpt-4o", messages=msgs).choices
    assert [r.status for r in upstream.requests] == [429, 503, 200]


# --------------------------------------------------------------------------- Responses API

RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather for a city.",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"], "additionalProperties": False},
                  "strict": True}
STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def sse_frames(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each `event: <type>\\ndata: <json>` frame; fails on any other framing."""
    assert raw.endswith("\n\n")
    frames = []
    for block in raw[:-2].split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        frames.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return frames


def test_responses_parse_strictly_with_sdk_types(client: openai.OpenAI, upstream: MockUpstream) -> None:
    """Both modes: every object and event validates against the SDK's pydantic types (not just its lenient parse)."""
    upstream.script("Hello there, friend.", "The quick brown fox.")
    raw = client.responses.with_raw_response.create(model="gpt-4o", input="hi", instructions="Be brief.",
                                                    temperature=0.2, metadata={"k": "v"})
    r = Response.model_validate(json.loads(raw.text))
    assert r.output_text == "Hello there, friend." and r.status == "completed"
    assert (r.object, r.model, r.instructions, r.temperature, r.metadata) == (
        "response", "gpt-4o", "Be brief.", 0.2, {"k": "v"})
    assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_") and r.output[0].role == "assistant"
    assert r.usage.input_tokens == len(responses_prompt_token_ids(
        {"instructions": "Be brief.", "input": "hi"})) and r.usage.output_tokens == len(tokens(r.output_text))
    assert upstream.requests[-1].usage == r.usage.model_dump(exclude_none=True)
    events = list(client.responses.create(model="gpt-4o", input="go", stream=True))
    for e in events:
        STREAM_EVENT.validate_python(e.model_dump(exclude_unset=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "The quick brown fox."
    done = events[-1].response
    assert done.output_text == "The quick brown fox." and done.usage.total_tokens > 0
    assert events[0].response.status == "in_progress" and events[0].response.usage is None
    with client.responses.stream(model="gpt-4o", input="again") as stream:
        assert stream.get_final_response().output_text == "ok"  # script empty -> default reply


def test_responses_stream_framing_and_sequence(upstream: MockUpstream) -> None:
    upstream.script("one two")
    with httpx.stream("POST", upstream.base_url + "/responses",
                      json={"model": "gpt-4o", "input": "x", "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = sse_frames(b"".join(r.iter_raw()).decode())
    assert all(name == data["type"] for name, data in frames)
    assert [data["sequence_number"] for _, data in frames] == list(range(len(frames)))
    assert [name for name, _ in frames] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    item_id = frames[-1][1]["response"]["output"][0]["id"]
    assert all(d["item_id"] == item_id for _, d in frames[3:8])
    assert frames[2][1]["item"] == {"id": item_id, "type": "message", "status": "in_progress",
                                    "role": "assistant", "content": []}


def test_responses_tool_call_stream_parses_into_function_calls(client: openai.OpenAI,
                                                               upstream: MockUpstream) -> None:
    args = {"city": "San Francisco, California"}
    upstream.script({"tool_calls": [{"name": "get_weather", "arguments": args},
                                    {"name": "get_weather", "arguments": {"city": "Oslo"}}]},
                    {"content": "Checking.", "tool_calls": [{"name": "get_weather", "arguments": "{}"}]})
    with client.responses.stream(model="gpt-4o", input="sf and oslo", tools=[RESPONSES_TOOL]) as stream:
        deltas: dict[int, str] = {}
        for e in stream:
            if e.type == "response.function_call_arguments.delta":
                deltas[e.output_index] = deltas.get(e.output_index, "") + e.delta
        final = stream.get_final_response()
    assert [(o.type, o.call_id, o.name, o.status) for o in final.output] == [
        ("function_call", "call_1", "get_weather", "completed"),
        ("function_call", "call_2", "get_weather", "completed")]
    assert final.output[0].parsed_arguments == args and json.loads(deltas[0]) == args
    assert len(set(o.id for o in final.output)) == 2 and final.output[0].id.startswith("fc_")
    # text and a call: a message item, then the function_call item
    events = list(client.responses.create(model="gpt-4o", input="x", tools=[RESPONSES_TOOL], stream=True))
    out = events[-1].response.output
    assert [o.type for o in out] == ["message", "function_call"] and out[0].content[0].text == "Checking."
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]


def _run_turns(client: openai.OpenAI, mode: str) -> list[tuple[int, int, int, int]]:
    """Three turns of one conversation, resent in full or chained by previous_response_id.

    Returns per turn: (cached_tokens, input_tokens) as billed, then the cached
    tokens and prompt length recomputed from the whole conversation's tokens.
    """
    instructions = long_text(400)
    full: list[Any] = []  # the conversation so far, as a client resending it would hold it
    prev_ids: list[int] | None = None
    previous: str | None = None
    out = []
    for turn in range(3):
        new = [{"role": "user", "content": f"question {turn}: {long_text(30, salt=str(turn))}"}]
        if mode == "chain":
            r = client.responses.create(model="gpt-4o", instructions=instructions, input=new,
                                        previous_response_id=previous or openai.omit)
        else:
            r = client.responses.create(model="gpt-4o", instructions=instructions, input=full + new)
        full += new + [o.model_dump(exclude_none=True) for o in r.output]
        ids = responses_prompt_token_ids({"instructions": instructions, "input": full[:-len(r.output)]})
        out.append((r.usage.input_tokens_details.cached_tokens, r.usage.input_tokens,
                    independent_cached(prev_ids, ids) if prev_ids else 0, len(ids)))
        prev_ids, previous = ids, r.id
    return out


@pytest.mark.parametrize("mode", ["resend", "chain"])
def test_responses_cached_tokens_grow_with_the_conversation(client: openai.OpenAI, upstream: MockUpstream,
                                                            mode: str) -> None:
    """A chain renders as its stored history + new input, so it bills and caches like a full resend."""
    turns = _run_turns(client, mode)
    assert [t[1] for t in turns] == [t[3] for t in turns]  # input tokens: the whole conversation
    assert [t[0] for t in turns] == [t[2] for t in turns]  # cached: the real common token prefix
    assert 0 == turns[0][0] < turns[1][0] < turns[2][0]
    assert all(t[0] % 128 == 0 for t in turns)
    write = upstream.requests[-1].usage["input_tokens_details"]["cache_write_tokens"]
    assert write == turns[2][1] - turns[2][1] % 128 - turns[2][0]


def test_responses_share_the_chat_prefix_cache_rules(client: openai.OpenAI, upstream: MockUpstream) -> None:
    """Same scope (key, model, shard) and per-item chunks: a changed item ends the match there, keys pick shards."""
    upstream.shards = 4
    body: dict[str, Any] = {"input": [{"role": "user", "content": long_text(400)}, {"role": "user", "content": "a"}]}
    other = {"input": body["input"][:1] + [{"role": "user", "content": "b"}]}
    client.responses.create(model="gpt-4o", prompt_cache_key="k1", **body)
    r = client.responses.create(model="gpt-4o", prompt_cache_key="k1", **other)
    assert r.usage.input_tokens_details.cached_tokens == independent_cached(
        responses_prompt_token_ids(body), responses_prompt_token_ids(other)) > 0
    keys = [k for k in (f"x{i}" for i in range(50)) if zlib.crc32(k.encode()) % 4 != zlib.crc32(b"k1") % 4]
    r = client.responses.create(model="gpt-4o", prompt_cache_key=keys[0], **other)
    assert r.usage.input_tokens_details.cached_tokens == 0  # another cache machine


def test_responses_context_window_400(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.windows["tiny"] = 100
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="tiny", input=long_text(50))
    assert ei.value.status_code == 400 and ei.value.code == "context_length_exceeded"
    assert ei.value.body == {
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}
    n = len(responses_prompt_token_ids({"input": "hi"}))
    with pytest.raises(openai.BadRequestError, match="exceeds the context window"):
        client.responses.create(model="tiny", input="hi", max_output_tokens=101 - n)
    assert client.responses.create(model="tiny", input="hi", max_output_tokens=100 - n).status == "completed"


def test_responses_orphan_tool_output_400(client: openai.OpenAI, upstream: MockUpstream) -> None:
    orphan = {"type": "function_call_output", "call_id": "call_nope", "output": "sunny"}
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o", input=[{"role": "user", "content": "x"}, orphan])
    assert ei.value.body == {"message": "No tool call found for function call output with call_id call_nope.",
                             "type": "invalid_request_error", "param": "input", "code": None}
    call = {"type": "function_call", "call_id": "call_nope", "name": "get_weather", "arguments": "{}"}
    assert client.responses.create(model="gpt-4o", input=[call, orphan]).status == "completed"
    # the call may come from the stored chain: the answer to a scripted tool call is accepted
    upstream.script({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]})
    r1 = client.responses.create(model="gpt-4o", input="weather?", tools=[RESPONSES_TOOL])
    answer = {"type": "function_call_output", "call_id": r1.output[0].call_id, "output": "sunny"}
    r2 = client.responses.create(model="gpt-4o", input=[answer], previous_response_id=r1.id)
    assert r2.status == "completed"
    with pytest.raises(openai.BadRequestError, match="with call_id call_1"):
        client.responses.create(model="gpt-4o", input=[answer])  # without the chain it is an orphan


def test_responses_store_previous_id_and_retrieve(client: openai.OpenAI, upstream: MockUpstream) -> None:
    r = client.responses.create(model="gpt-4o", input="keep me")
    assert client.responses.retrieve(r.id).model_dump() == r.model_dump()
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o", input="x", previous_response_id="resp_unknown")
    assert ei.value.body == {"message": "Previous response with id 'resp_unknown' not found.",
                             "type": "invalid_request_error", "param": "previous_response_id",
                             "code": "previous_response_not_found"}
    gone = client.responses.create(model="gpt-4o", input="forget me", store=False)
    assert gone.store is False
    with pytest.raises(openai.BadRequestError, match=f"Previous response with id '{gone.id}' not found"):
        client.responses.create(model="gpt-4o", input="x", previous_response_id=gone.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)
    other = openai.OpenAI(base_url=upstream.base_url, api_key="sk-other", max_retries=0)
    with pytest.raises(openai.BadRequestError):  # stored per API key
        other.responses.create(model="gpt-4o", input="x", previous_response_id=r.id)


def test_responses_input_tokens_and_compact(client: openai.OpenAI, upstream: MockUpstream) -> None:
    r = client.responses.create(model="gpt-4o", input="first", instructions="sys")
    count = client.responses.input_tokens.count(model="gpt-4o", input="second", previous_response_id=r.id)
    expected = {"input": [{"role": "user", "content": "first"}, r.output[0].model_dump(),
                          {"role": "user", "content": "second"}]}
    assert (count.object, count.input_tokens) == ("response.input_tokens",
                                                  len(responses_prompt_token_ids(expected)))
    raw = client.responses.with_raw_response.compact(model="gpt-4o", input="second", previous_response_id=r.id)
    c = raw.parse()
    assert (c.object, c.id[:5], c.usage.input_tokens) == ("response.compaction", "resp_", count.input_tokens)
    output = json.loads(raw.text)["output"]  # Codex reads only this list and replays it as the history
    compaction = ResponseCompactionItem.model_validate(output[-1])
    assert compaction.type == "compaction" and compaction.encrypted_content
    assert output[:-1] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]}
                           for t in ("first", "second")]
    # replayed as the next input, the ciphertext is billed as opaque text
    nxt = client.responses.create(model="gpt-4o", input=output)
    assert nxt.usage.input_tokens == len(responses_prompt_token_ids({"input": output})) \
        > len(tokens(compaction.encrypted_content))


def test_responses_reasoning_item(client: openai.OpenAI) -> None:
    r = client.responses.create(model="gpt-4o", input="think", reasoning={"effort": "low"},
                                include=["reasoning.encrypted_content"])
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.reasoning.effort == "low"
    reasoning = ResponseReasoningItem.model_validate(r.output[0].model_dump())
    assert reasoning.id.startswith("rs_") and reasoning.encrypted_content
    plain = client.responses.create(model="gpt-4o", input="think", reasoning={"effort": "low"})
    assert plain.output[0].encrypted_content is None
    assert client.responses.create(model="gpt-4o", input="think").output[0].type == "message"
    # sent back, the reasoning it carries is part of the prompt: billed as the decrypted reasoning (3/16 of
    # the ciphertext's length in tokens), not as the ciphertext's own text
    items = [{"role": "user", "content": "think"}, r.output[0].model_dump(exclude_none=True)]
    billed = client.responses.input_tokens.count(model="gpt-4o", input=items).input_tokens
    assert billed >= len(reasoning.encrypted_content) * 3 // 16 + len(responses_prompt_token_ids({"input": "think"}))


def test_responses_rendering_rules() -> None:
    """Per-item chunks; ids/status are not prompt text; function calls render as chat renders them."""
    assert responses_prompt_token_ids({"input": "hi"}) == prompt_token_ids(
        {"messages": [{"role": "user", "content": "hi"}]})
    sent = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "yes", "annotations": []}]}
    assert render_item(sent) == render_item({"role": "assistant", "content": "yes"})
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}
    assert render_item(call) == render_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
    output = {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "ok"}]}
    assert render_item(output) == render_message({"role": "tool", "tool_call_id": "c1", "content": "ok"})
    custom = {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "*** diff"}
    assert render_item(custom) == "<|assistant|>\n\n<custom_tool_call id=c2>patch\n*** diff<|end|>\n"
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
                 "encrypted_content": "gAAA" * 8}
    assert render_item(reasoning) == "<|reasoning|>\ns\n<encrypted>" + " reasoning" * 6 + "<|end|>\n"
    other = {"type": "web_search_call", "status": "completed", "id": "ws_1"}
    assert render_item(other) == ('<|web_search_call|>\n{"id": "ws_1", "status": "completed", '
                                  '"type": "web_search_call"}<|end|>\n')
    body = {"instructions": "sys", "tools": [RESPONSES_TOOL], "input": [sent, call, output]}
    assert responses_prompt_chunks(body) == [
        tokens(render_message({"role": "system", "content": "sys"})),
        tokens("<|tools|>" + json.dumps([RESPONSES_TOOL])),
        tokens(render_item(sent)), tokens(render_item(call)), tokens(render_item(output))]
    assert responses_prompt_chunks({"input": [call]}, history=[sent]) == responses_prompt_chunks(
        {"input": [sent, call]})


def test_raw_bytes_echo_404_and_validation(upstream: MockUpstream) -> None:
    body = b'{ "model" : "gpt-4o",\n  "messages": [ ] }'
    r = httpx.post(upstream.base_url + "/chat/completions", content=body,
                   headers={"content-type": "application/json", "X-Custom": "Yes"})
    assert r.status_code == 200 and upstream.requests[-1].body == body
    assert upstream.requests[-1].headers["x-custom"] == "Yes"
    e = httpx.put(upstream.base_url + "/echo/a/b?x=1&y=2", content=b"12345",
                  headers={"x-test": "t"})
    assert e.headers["x-mock-echo"] == "1"
    assert {k: e.json()[k] for k in ("method", "path", "query", "body_length")} == {
        "method": "PUT", "path": "/v1/echo/a/b", "query": "x=1&y=2", "body_length": 5}
    assert e.json()["headers"]["x-test"] == "t"
    nf = httpx.post(upstream.base_url + "/nope", json={})
    assert nf.status_code == 404
    assert nf.json()["error"]["message"] == "Invalid URL (POST /v1/nope)"
    for bad, param in ((b"not json", None), (b'{"model": "m"}', "messages"),
                       (b'{"messages": []}', "model")):
        resp = httpx.post(upstream.base_url + "/chat/completions", content=bad)
        assert resp.status_code == 400
        err = resp.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param
        assert set(err) == {"message", "type", "param", "code"}


def test_delays(client: openai.OpenAI, upstream: MockUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """`delay` is waited before answering, `chunk_delay` between stream events, and a stream really streams.

    What the mock waits is read from its sleeps (not a clock); that the events arrive one by
    one, not as one buffered body, from the stream gate: the client has the first events in
    hand while the mock is still holding back the last one.
    """
    spy = SleepSpy()
    monkeypatch.setattr(mock_upstream, "asyncio", spy)
    monkeypatch.setattr(_mock_stream, "asyncio", spy)
    upstream.delay = 0.2
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert spy.slept == [0.2]
    spy.slept.clear()
    upstream.delay, upstream.chunk_delay = 0.1, 0.05
    upstream.script("w1 w2 w3 w4 w5")
    gate = threading.Event()
    upstream.stream_gate = gate
    released_when_read: list[list[bool]] = []
    chunks = 0
    for _ in client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}],
                                            stream=True):
        chunks += 1
        released_when_read.append(list(upstream.stream_released))
        gate.set()  # the first event is in hand: let the mock send the rest
    assert chunks >= 5
    assert released_when_read[0] == []  # the first event arrived while the last was still held back
    assert upstream.stream_released == [True]
    assert spy.slept[0] == 0.1 and spy.slept[1:] == [0.05] * (len(spy.slept) - 1) and len(spy.slept) >= 5


def test_reset_clears_state(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.script("x")
    upstream.fail_next(500, {})
    upstream.delay, upstream.report_cached = 5.0, False
    upstream.windows["tmp"] = 1
    long: Any = [{"role": "user", "content": long_text(400)}]
    upstream.reset()
    assert upstream.requests == [] and "tmp" not in upstream.windows
    r = client.chat.completions.create(model="gpt-4o", messages=long)
    assert r.choices[0].message.content == "ok" and r.id == "chatcmpl-mock1"
    upstream.reset()
    r = client.chat.completions.create(model="gpt-4o", messages=long)
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_standalone_start_stop() -> None:
    with MockUpstream() as m:
        assert m.base_url.startswith("http://127.0.0.1:") and m.base_url.endswith("/v1")
        assert httpx.get(m.base_url + "/models").status_code == 200
        port = int(m.base_url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_no_per_request_stall(upstream: MockUpstream) -> None:
    """Guards the TCP_NODELAY fix: with Nagle on, each request took ~44 ms. Checked on the socket itself."""
    with httpx.Client(base_url=upstream.base_url) as c:  # keep-alive: the connection stays open for the check
        assert c.post("/chat/completions", json={"model": "gpt-4o", "messages": [
            {"role": "user", "content": "x"}]}).status_code == 200
        assert upstream._server is not None
        conns = list(upstream._server.server_state.connections)
        assert conns, "no open server-side connection to inspect"
        for conn in conns:
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), "Nagle is on: requests stall ~40 ms"


def test_mock_imports_no_proxy_code() -> None:
    """The mock is a second implementation of the provider's rules; sharing proxy code would share its bugs."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    script = textwrap.dedent("""
        import sys
        import httpx
        import tests.mock_upstream as mu
        with mu.MockUpstream() as m:
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}]}
            r = httpx.post(m.base_url + "/chat/completions", json=body)
            assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(mu.prompt_token_ids(body))
            body = {"model": "gpt-4o", "input": "hi", "stream": True}
            r = httpx.post(m.base_url + "/responses", json=body)
            assert r.status_code == 200 and "response.completed" in r.text
            body = {"model": "claude-opus-4-7", "max_tokens": 5, "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(m.base_url + "/messages", json=body, headers={"x-api-key": "k"})
            assert r.status_code == 200 and "event: message_stop" in r.text
        print(",".join(sorted(n for n in sys.modules if n == "proxy" or n.startswith("proxy."))))
    """)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(tests_dir)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the mock loaded proxy modules: {out.stdout.strip()}"
