"""Offload: big tool results leave the prompt, stay readable by handle, and are rewritten the same way every time."""

from __future__ import annotations

import json
import re
import uuid

import openai
import pytest
from proxy_server import InProcessProxy, make_settings

KEY = "sk-tenant-a"
HANDLE = re.compile(r'context_read\(handle="(ctx_[0-9a-f]+)"')
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a shell command",
                                           "parameters": {"type": "object",
                                                          "properties": {"cmd": {"type": "string"}}}}}]


def big_log(lines: int = 3000) -> str:
    return "\n".join(f"2026-11-29T12:{i % 60:02d}:00 worker[{i}] processed item {i * 7919 % 100003} ok"
                     for i in range(lines))


def history(tool_text: str) -> list[dict]:
    return [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Find the failing item in the log."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "bash", "arguments": '{"cmd": "cat app.log"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_text}]


def offload_config(**offload) -> dict:
    return {"defaults": {"offload": {"tool_result_tokens": 2000, **offload}}}


def offload_settings(upstream, store: str, **offload) -> object:
    return make_settings(upstream.base_url, store, **offload_config(**offload))


pytestmark = pytest.mark.proxy_config(**offload_config())


def client(proxy: InProcessProxy, key: str = KEY) -> openai.OpenAI:
    return proxy.openai("/v1", api_key=key, max_retries=0)


def sent_messages(upstream) -> list[dict]:
    return json.loads(upstream.requests[-1].body)["messages"]


def test_big_tool_result_is_replaced_by_a_bounded_preview(proxy, upstream):
    text = big_log()
    raw = client(proxy).chat.completions.with_raw_response.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    tool_msg = sent_messages(upstream)[3]
    assert tool_msg["tool_call_id"] == "call_1" and tool_msg["role"] == "tool"
    preview = tool_msg["content"]
    assert HANDLE.search(preview) and "tool result of bash" in preview
    assert preview.splitlines()[1] == text.splitlines()[0]  # first lines shown
    assert preview.splitlines()[-2] == text.splitlines()[-1]  # last lines shown
    assert len(preview) < len(text) / 10
    assert raw.headers["x-ctxproxy-offloaded"] == "1" and int(raw.headers["x-ctxproxy-tokens-saved"]) > 20_000
    # The rest of the history is untouched.
    assert sent_messages(upstream)[:3] == history(text)[:3]


def test_few_enormous_lines_still_give_a_small_preview(proxy, upstream):
    text = ("x" * 200_000) + "\n" + ("y" * 200_000)
    client(proxy).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    preview = sent_messages(upstream)[3]["content"]
    assert len(preview) < 2000 and "+199,800 chars" in preview


def test_read_tool_is_appended_after_client_tools_and_renamed_on_collision(proxy, upstream):
    client(proxy).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history("short"))
    tools = json.loads(upstream.requests[-1].body)["tools"]
    assert tools[:1] == TOOLS and tools[1]["function"]["name"] == "context_read" and len(tools) == 2
    theirs = TOOLS + [{"type": "function", "function": {"name": "context_read", "parameters": {"type": "object"}}}]
    client(proxy).chat.completions.create(model="gpt-4o", tools=theirs, messages=history(big_log()))
    body = json.loads(upstream.requests[-1].body)
    assert body["tools"][:2] == theirs and body["tools"][2]["function"]["name"] == "ctxproxy_context_read"
    assert 'ctxproxy_context_read(handle="ctx_' in body["messages"][3]["content"]


def test_offload_without_client_tools_still_gives_the_model_the_read_tool(proxy, upstream):
    msgs = [m for m in history(big_log()) if m["role"] in ("system", "user")]
    msgs.append({"role": "user", "content": big_log()})  # ~71k tokens: over the 50k user-message limit
    client(proxy).chat.completions.create(model="gpt-4o", messages=msgs)
    body = json.loads(upstream.requests[-1].body)
    assert HANDLE.search(body["messages"][-1]["content"])
    assert [t["function"]["name"] for t in body["tools"]] == ["context_read"]


def test_plain_chat_without_tools_is_forwarded_byte_for_byte(proxy, upstream):
    sent = []
    c = proxy.openai("/v1", api_key=KEY, max_retries=0,
                     http_client=proxy.http_client(event_hooks={"request": [sent.append]}))
    c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert upstream.requests[-1].body == sent[-1].content


def test_big_user_message_and_text_parts_are_offloaded_images_kept(upstream, tmp_path):
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db",
                             defaults={"offload": {"user_message_tokens": 3000}})
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with InProcessProxy(settings) as p:
        client(p).chat.completions.create(model="gpt-4o", messages=[
            {"role": "user", "content": [{"type": "text", "text": big_log(2000)}, image,
                                         {"type": "text", "text": "What failed?"}]}])
    parts = sent_messages(upstream)[0]["content"]
    assert parts[1] == image and len(parts) == 2 and HANDLE.search(parts[0]["text"])
    assert "user message" in parts[0]["text"]


def test_model_reads_back_and_client_sees_only_the_final_answer(proxy, upstream):
    text = big_log()
    client(proxy).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    handle = HANDLE.search(sent_messages(upstream)[3]["content"]).group(1)
    upstream.reset()
    upstream.script({"tool_calls": [{"name": "context_read",
                                     "arguments": {"handle": handle, "offset": 100, "limit": 3}}]},
                    "item 700 failed")
    out = client(proxy).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    assert out.choices[0].message.content == "item 700 failed" and not out.choices[0].message.tool_calls
    assert len(upstream.requests) == 2
    follow = sent_messages(upstream)
    assert follow[-2]["tool_calls"][0]["function"]["name"] == "context_read"
    assert follow[-1]["role"] == "tool" and "\n".join(text.splitlines()[100:103]) in follow[-1]["content"]


def test_streamed_read_back_is_hidden_too(proxy, upstream):
    text = big_log()
    client(proxy).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    handle = HANDLE.search(sent_messages(upstream)[3]["content"]).group(1)
    upstream.script({"tool_calls": [{"name": "context_read",
                                     "arguments": {"handle": handle, "pattern": "worker\\[42\\]"}}]},
                    "found worker 42")
    chunks = list(client(proxy).chat.completions.create(model="gpt-4o", tools=TOOLS, stream=True,
                                                        messages=history(text)))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "found worker 42"
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "42: " + text.splitlines()[42] in sent_messages(upstream)[-1]["content"]


@pytest.mark.parametrize("stream", [False, True])
def test_mixed_calls_return_only_client_calls_renumbered(proxy, upstream, stream):
    upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": "ctx_0"}},
                                    {"name": "bash", "arguments": {"cmd": "ls"}}]})
    c = client(proxy)
    if stream:
        chunks = list(c.chat.completions.create(model="gpt-4o", tools=TOOLS, stream=True, messages=history("x")))
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        assert {d.index for d in deltas} == {0}
        assert "".join(d.function.name or "" for d in deltas) == "bash"
        assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"cmd": "ls"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    else:
        out = c.chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history("x"))
        calls = out.choices[0].message.tool_calls
        assert [tc.function.name for tc in calls] == ["bash"] and out.choices[0].finish_reason == "tool_calls"
    assert len(upstream.requests) == 1


def test_read_rounds_are_bounded(upstream, tmp_path):
    cfg = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", defaults={"context_read": {"rounds": 2}})
    with InProcessProxy(cfg) as p:
        loop = {"tool_calls": [{"name": "context_read", "arguments": {"handle": "ctx_0"}}]}
        upstream.script(loop, loop, loop, loop)
        out = client(p).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history("x"))
    assert len(upstream.requests) == 3
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason == "stop"


def test_handles_are_scoped_to_the_api_key(proxy, upstream):
    text = big_log()
    client(proxy).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    handle = HANDLE.search(sent_messages(upstream)[3]["content"]).group(1)
    own = proxy.get(f"/ctx/v1/blobs/{handle}", headers={"authorization": f"Bearer {KEY}"})
    assert own.status_code == 200 and own.text == text
    other = proxy.get(f"/ctx/v1/blobs/{handle}", headers={"authorization": "Bearer sk-tenant-b"})
    assert other.status_code == 404 and other.json()["error"]["code"] == "handle_not_found"
    assert proxy.get(f"/ctx/v1/blobs/{handle}").status_code == 401
    upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": handle}}]}, "done")
    client(proxy, "sk-tenant-b").chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history("small"))
    answer = sent_messages(upstream)[-1]["content"]
    assert answer.startswith("error: no stored content") and "worker" not in answer


def _bodies_through(settings, upstream, turns: int = 2) -> list[bytes]:
    with InProcessProxy(settings) as p:
        for _ in range(turns):
            client(p).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(big_log()))
    return [r.body for r in upstream.requests]


def test_same_history_same_bytes_across_restart_even_with_new_settings(upstream, tmp_path):
    store = f"sqlite:///{tmp_path}/c.db"
    first = _bodies_through(offload_settings(upstream, store), upstream)
    upstream.reset()
    changed = offload_settings(upstream, store, preview_head_lines=3, preview_tail_lines=1, tool_result_tokens=5000)
    second = _bodies_through(changed, upstream)
    assert first[0] == first[1] == second[0] == second[1]
    assert HANDLE.search(json.loads(first[0])["messages"][3]["content"])


def test_two_proxies_sharing_redis_rewrite_identically(upstream):
    store = "redis://127.0.0.1:6379/14"
    salt_key = f"sk-{uuid.uuid4()}"  # a fresh tenant: nothing recorded before
    a = offload_settings(upstream, store)
    b = offload_settings(upstream, store, preview_head_lines=2)
    with InProcessProxy(a) as pa, InProcessProxy(b) as pb:
        for p in (pa, pb, pa, pb):
            client(p, salt_key).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(big_log()))
    bodies = {r.body for r in upstream.requests}
    assert len(bodies) == 1 and HANDLE.search(json.loads(bodies.pop())["messages"][3]["content"])


def test_store_down_forwards_unmodified_and_says_so(upstream):
    with InProcessProxy(offload_settings(upstream, "redis://127.0.0.1:1/0")) as p:
        raw = client(p).chat.completions.with_raw_response.create(model="gpt-4o", tools=TOOLS,
                                                                  messages=history(big_log()))
    assert raw.headers["x-ctxproxy-degraded"] == "store-unavailable"
    assert json.loads(upstream.requests[-1].body)["messages"] == history(big_log())


def test_a_replayed_offload_never_tokenizes_the_original(upstream, tmp_path, monkeypatch):
    from proxy.tokens.counter import default_counter
    from proxy.tokens.encodings import get_encoding

    store, text = f"sqlite:///{tmp_path}/c.db", big_log()
    with InProcessProxy(offload_settings(upstream, store)) as p:  # decides, and records the decision
        client(p).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    enc, seen = get_encoding("o200k_base"), []
    real = enc.encode_ordinary
    monkeypatch.setattr(enc, "encode_ordinary", lambda t: seen.append(len(t)) or real(t))
    default_counter.clear()
    with InProcessProxy(offload_settings(upstream, store)) as p:  # a restart: replays it
        client(p).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    assert HANDLE.search(sent_messages(upstream)[3]["content"])
    # The rewrite replays the decision without counting the original; the figures count the client's own
    # prompt once after a restart (tokens saved = client's tokens - sent), and never again for that content.
    assert seen and sum(1 for n in seen if n >= len(text) // 10) <= 1
    seen.clear()
    with InProcessProxy(offload_settings(upstream, store)) as p:
        for _ in range(2):
            client(p).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history(text))
    assert sum(1 for n in seen if n >= len(text) // 10) <= 1


def test_an_error_in_the_middle_of_a_long_log_shows_in_its_preview(proxy, upstream):
    """Line 5,000 of 10,000 fails: the preview shows it with its line number, so no read-back is needed."""
    lines = [f"2026-11-29T12:{i % 60:02d}:00 worker[{i}] processed item {i * 7919 % 100003} ok" for i in range(10_000)]
    lines[5000] = "Traceback (most recent call last):"
    lines[5001] = "ValueError: item 4242 has no owner"
    client(proxy).chat.completions.create(model="gpt-4o", tools=TOOLS, messages=history("\n".join(lines)))
    preview = sent_messages(upstream)[3]["content"]
    assert "5000: Traceback (most recent call last):" in preview
    assert "5001: ValueError: item 4242 has no owner" in preview
    assert "matching the error pattern: 2 of 2 shown" in preview
    assert len(preview) < 6000  # still a preview


def test_error_pattern_must_be_re2(upstream, tmp_path):
    from proxy.config import ConfigError
    with pytest.raises(ConfigError, match="error_pattern"):
        make_settings(upstream.base_url, f"sqlite:///{tmp_path}/x.db",
                      defaults={"offload": {"error_pattern": r"(a)\1"}})
