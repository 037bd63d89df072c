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
import time
from typing import Any

import httpx
import openai
import pytest
from mock_upstream import MockUpstream, PrefixCache, prompt_chunks, prompt_token_ids

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


def test_prefix_trie_matches_flat_lcp_and_is_fast() -> None:
    """300 turns growing to ~100k tokens: linear work, same answers as a flat LCP."""
    cache, msgs, prev = PrefixCache(), [{"role": "system", "content": "sys"}], None
    filler = long_text(60)  # ~300+ tokens per turn
    t0 = time.perf_counter()
    for turn in range(300):
        msgs = msgs + [{"role": "user", "content": f"turn {turn}: {filler}"}]
        body = {"messages": msgs}
        got = cache.match_and_store(("k", "m"), prompt_chunks(body), 0.0, None)
        if prev is not None and turn % 50 == 0:
            ids = prompt_token_ids(body)
            assert got == len(prev)
            assert independent_cached(prev, ids) == got - got % 128
        prev = prompt_token_ids(body) if turn % 50 == 49 else None
    assert len(prompt_token_ids({"messages": msgs})) > 100_000
    assert time.perf_counter() - t0 < 10


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


def test_responses_api(client: openai.OpenAI) -> None:
    r = client.responses.create(model="gpt-4o", input="hello mock world")
    assert r.output_text == "hello mock world" and r.status == "completed"
    events = list(client.responses.create(model="gpt-4o", input="a b c", stream=True))
    types = [e.type for e in events]
    assert types == ["response.created"] + ["response.output_text.delta"] * 3 \
        + ["response.completed"]
    assert "".join(e.delta for e in events[1:-1]) == "a b c"
    assert events[-1].response.output_text == "a b c"


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


def test_delays(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.delay = 0.2
    t0 = time.perf_counter()
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert time.perf_counter() - t0 >= 0.2
    upstream.delay, upstream.chunk_delay = 0.1, 0.05
    upstream.script("w1 w2 w3 w4 w5")
    t0 = time.perf_counter()
    arrivals = [time.perf_counter() - t0 for _ in client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True)]
    assert arrivals[0] >= 0.1
    assert arrivals[-1] - arrivals[0] >= 0.05 * 5  # really streamed, not one buffered body


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


def test_no_per_request_stall(client: openai.OpenAI) -> None:
    """Guards the TCP_NODELAY fix: with Nagle on, each request took ~44 ms."""
    msgs: Any = [{"role": "user", "content": "x"}]
    client.chat.completions.create(model="gpt-4o", messages=msgs)
    t0 = time.perf_counter()
    for _ in range(30):
        client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert (time.perf_counter() - t0) / 30 < 0.02


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
        print(",".join(sorted(n for n in sys.modules if n == "proxy" or n.startswith("proxy."))))
    """)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(tests_dir)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the mock loaded proxy modules: {out.stdout.strip()}"
