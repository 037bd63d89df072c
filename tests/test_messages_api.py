"""The Anthropic Messages API through the same pipeline: what Claude Code sends is managed like chat.

Clients are the official `anthropic` SDK and raw requests shaped like Claude
Code's; the provider is the tests' mock (tests/mock_upstream.py), which caches
at `cache_control` breakpoints as Anthropic does and refuses what Anthropic refuses
(a tool_use without its tool_result, more than 4 breakpoints, a prompt too long).
"""

from __future__ import annotations

import json
import re
import uuid

import anthropic
import httpx
import orjson
import pytest
from proxy_server import InProcessProxy, make_settings

KEY = "sk-ant-test"
HANDLE = re.compile(r'context_read\(handle=\\?"(ctx_[0-9a-f]+)')
TOOLS = [{"name": "Bash", "description": "Run a shell command", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
THINKING = {"type": "thinking", "thinking": "The log is long; grep it.",
            "signature": "EqQBCkYIBxgCKkDsig+/=" + "A" * 200}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a" + "B" * 100}


def big_log(lines: int = 3000) -> str:
    return "\n".join(f"2026-11-29T12:{i % 60:02d}:00 worker[{i}] processed item {i * 7919 % 100003} ok"
                     for i in range(lines))


def config(**raw) -> dict:
    raw.setdefault("defaults", {"offload": {"tool_result_tokens": 2000}})
    return raw


def settings(upstream, tmp_path, store: str | None = None, **raw):
    return make_settings(upstream.base_url, store or f"sqlite:///{tmp_path}/m.db", **config(**raw))


pytestmark = pytest.mark.proxy_config(**config())


def client(proxy: InProcessProxy) -> anthropic.Anthropic:
    return proxy.anthropic(api_key=KEY, max_retries=0)


def sent(upstream, n: int = -1) -> dict:
    return json.loads(upstream.requests[n].body)


def post(proxy: InProcessProxy, body: dict, path: str = "/v1/messages", **headers: str) -> httpx.Response:
    return proxy.post(path, content=orjson.dumps(body), timeout=60,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                               "content-type": "application/json", **headers})


def tool_turn(output: str, *, extra_blocks: list | None = None) -> list[dict]:
    """A Claude Code-like exchange: the task, the model's thinking and call, the result and more."""
    return [{"role": "user", "content": [{"type": "text", "text": "Find the bad item in app.log."}]},
            {"role": "assistant", "content": [THINKING, REDACTED,
                                              {"type": "text", "text": "I'll read the log."},
                                              {"type": "tool_use", "id": "toolu_01", "name": "Bash",
                                               "input": {"command": "cat app.log"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": output},
                                         *(extra_blocks or [])]}]


def test_a_small_request_goes_upstream_byte_for_byte(proxy, upstream):
    raw = orjson.dumps({"model": "claude-sonnet-4-6", "max_tokens": 64, "system": "Be brief.",
                        "messages": [{"role": "user", "content": "Say hi."}], "metadata": {"user_id": "u1"}})
    r = proxy.post("/v1/messages", content=raw, headers={"x-api-key": KEY})
    assert r.status_code == 200, r.text
    assert upstream.requests[-1].path == "/v1/messages" and upstream.requests[-1].body == raw
    assert r.json()["type"] == "message" and r.headers["x-ctxproxy-route"] == "default"


def test_the_sdk_creates_streams_and_counts_through_the_proxy(proxy, upstream):
    c = client(proxy)
    msg = c.messages.create(model="claude-sonnet-4-6", max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    assert isinstance(msg, anthropic.types.Message) and msg.content[0].text == "ok"
    upstream.script("streamed words")
    with c.messages.stream(model="claude-sonnet-4-6", max_tokens=64,
                           messages=[{"role": "user", "content": "Hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed words" == final.content[0].text and final.usage.input_tokens > 0
    count = c.messages.count_tokens(model="claude-sonnet-4-6", messages=[{"role": "user", "content": "Hi"}])
    assert count.input_tokens > 0 and upstream.requests[-1].path == "/v1/messages/count_tokens"


def test_a_big_tool_result_is_offloaded_and_untouched_blocks_pass_byte_for_byte(proxy, upstream):
    future = {"type": "some_future_block", "payload": {"keep": [1, 2.50, "é"]}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    body = {"model": "claude-sonnet-4-6", "max_tokens": 512, "tools": TOOLS,
            "system": [{"type": "text", "text": "You are Claude Code."}],
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            "messages": tool_turn(big_log(), extra_blocks=[image, future, {"type": "text", "text": "go on"}])}
    r = post(proxy, body)
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-offloaded-new"] == "1"
    out = upstream.requests[-1].body
    for block in (THINKING, REDACTED, image, future):  # each in place, as the client serialized it
        assert orjson.dumps(block) in out
    got = json.loads(out)
    assert got["system"] == body["system"] and got["context_management"] == body["context_management"]
    assert got["messages"][1] == body["messages"][1]
    last = got["messages"][2]["content"]
    assert [b["type"] for b in last] == ["tool_result", "image", "some_future_block", "text", "text"]
    assert HANDLE.search(json.dumps(last[0])) and len(json.dumps(last[0])) < 3000
    assert last[-1]["text"].startswith("<agent_status>")  # the status bar: the last user turn's last block
    assert [t["name"] for t in got["tools"]] == ["Bash", "context_read"]
    assert "input_schema" in got["tools"][1] and "prompt_cache_key" not in got


def _read_call(body: dict) -> dict:
    handle = HANDLE.search(json.dumps(body["messages"]))
    assert handle, "the offloaded output should be in the request by now"
    return {"content": "Reading the stored log.",
            "tool_calls": [{"name": "context_read", "arguments": {"handle": handle.group(1), "pattern": "item 7919"}}]}


def test_a_hidden_read_round_leaves_one_valid_stream_with_every_rounds_usage(proxy, upstream):
    upstream.script(_read_call, "The bad item is 7919.")
    events = []
    with client(proxy).messages.stream(model="claude-sonnet-4-6", max_tokens=512, tools=TOOLS,
                                       messages=tool_turn(big_log())) as stream:
        for e in stream:
            events.append(e)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
    indexes = [e.index for e in events if e.type == "content_block_start"]
    assert indexes == list(range(len(indexes))) == [0, 1]  # consecutive over both rounds
    assert [b.type for b in final.content] == ["text", "text"]
    assert final.content[1].text == "The bad item is 7919." and final.stop_reason == "end_turn"
    assert len(upstream.requests) == 2
    round_two = sent(upstream)
    assert round_two["messages"][-2]["content"][-1]["name"] == "context_read"  # the model's call, sent back
    answer = round_two["messages"][-1]["content"][-1]
    assert answer["type"] == "tool_result" and "item 7919" in answer["content"]
    billed = [rq.usage for rq in upstream.requests]
    assert final.usage.output_tokens == sum(u["output_tokens"] for u in billed)
    assert final.usage.input_tokens == sum(u["input_tokens"] for u in billed)


def test_a_hidden_read_round_in_a_json_answer_is_removed_and_billed(proxy, upstream):
    upstream.script(_read_call, {"content": "Now run it.", "tool_calls": [{"name": "Bash",
                                                                           "arguments": {"command": "grep x"}}]})
    r = post(proxy, {"model": "claude-sonnet-4-6", "max_tokens": 512, "tools": TOOLS, "messages": tool_turn(big_log())})
    assert r.status_code == 200, r.text
    msg = anthropic.types.Message.model_validate(r.json())
    assert [b.type for b in msg.content] == ["text", "tool_use"] and msg.content[1].name == "Bash"
    assert msg.stop_reason == "tool_use" and r.headers["x-ctxproxy-read-rounds"] == "1"
    assert msg.usage.output_tokens == sum(rq.usage["output_tokens"] for rq in upstream.requests)


def test_a_multi_turn_streamed_tool_loop_with_the_sdk(proxy, upstream):
    """The agent's loop as users run it: stream, run the tool, send its result back; a read round hidden."""
    c = client(proxy)
    messages: list = [{"role": "user", "content": "Find the bad item in app.log."}]
    upstream.script({"tool_calls": [{"name": "Bash", "arguments": {"command": "cat app.log"}}]},
                    _read_call, "The bad item is 7919.")
    for _ in range(3):
        with c.messages.stream(model="claude-sonnet-4-6", max_tokens=512, tools=TOOLS, messages=messages) as s:
            final = s.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
        calls = [b for b in final.content if b.type == "tool_use"]
        if not calls:
            break
        assert [b.name for b in calls] == ["Bash"]  # never the proxy's own tool
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                                      "content": big_log()}]})
    assert final.content[-1].text == "The bad item is 7919."
    assert len(upstream.requests) == 3
    rows = proxy.get("/ctx/v1/sessions", headers={"x-api-key": KEY}).json()["sessions"]
    assert rows and rows[0]["requests"] >= 1


def test_claude_code_headers_are_forwarded_and_name_the_session(proxy, upstream):
    sid = str(uuid.uuid4())
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}],
            "metadata": {"user_id": f"user_abc_account_def_session_{sid}"}}
    headers = {"anthropic-beta": "claude-code-20250219,context-management-2025-06-27",
               "x-claude-code-session-id": sid, "user-agent": "claude-cli/2.0.0 (external, cli)"}
    r1 = post(proxy, body, **headers)
    r2 = post(proxy, {**body, "messages": [{"role": "user", "content": "Another first message"}]}, **headers)
    assert r1.status_code == r2.status_code == 200
    got = upstream.requests[-1].headers
    assert got["anthropic-beta"] == headers["anthropic-beta"] and got["anthropic-version"] == "2023-06-01"
    assert got["x-api-key"] == KEY and got["x-claude-code-session-id"] == sid
    assert r1.headers["x-ctxproxy-session"] == r2.headers["x-ctxproxy-session"] == sid
    r3 = post(proxy, {**body, "messages": [{"role": "user", "content": "x"}]})  # no header: metadata names it
    r4 = post(proxy, {**body, "messages": [{"role": "user", "content": "y"}]})
    assert r3.headers["x-ctxproxy-session"] == r4.headers["x-ctxproxy-session"] != sid


def test_breakpoints_never_exceed_four_counting_claude_codes_own(upstream, tmp_path):
    s = settings(upstream, tmp_path, defaults={"offload": {"tool_result_tokens": 2000},
                                               "cache_hints": {"ttl": "1h"}})
    mark = {"type": "ephemeral"}
    body = {"model": "claude-sonnet-4-6", "max_tokens": 256, "tools": TOOLS,
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": mark},
                       {"type": "text", "text": "Project rules. " * 400, "cache_control": mark}],
            "messages": tool_turn(big_log(200), extra_blocks=[{"type": "text", "text": "go", "cache_control": mark}])}
    with InProcessProxy(s) as p:
        r = post(p, body)
        assert r.status_code == 200, r.text  # the mock refuses a fifth breakpoint, as Anthropic does
        out = upstream.requests[-1].body
        assert out.count(b'"cache_control"') <= 4
        assert b'"ttl":"1h"' not in out  # a 1h mark may not follow the client's 5-minute ones
        bare = {**body, "system": "You are Claude Code. " + "Project rules. " * 400,
                "messages": tool_turn(big_log(200))}
        r = post(p, bare)
        out = json.loads(upstream.requests[-1].body)
        marks = [b for m in out["messages"] for b in m["content"] if isinstance(b, dict) and "cache_control" in b]
        assert marks and all(b["cache_control"] == {"type": "ephemeral", "ttl": "1h"} for b in marks)
        assert marks[-1]["type"] == "tool_result"  # the end of the stable prefix: before the status bar


def test_cache_reads_are_accounted_as_a_share_of_all_input(proxy, upstream):
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": "Project rules. " * 600, "cache_control": mark}]
    for n in range(2):
        r = post(proxy, {"model": "claude-sonnet-4-6", "max_tokens": 64, "system": system,
                         "messages": [{"role": "user", "content": f"question {n}"}]}, **{"x-session-id": "acct"})
        assert r.status_code == 200
    usage = upstream.requests[-1].usage
    assert usage["cache_read_input_tokens"] > 1000
    import time
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        totals = proxy.get("/ctx/v1/sessions/acct", headers={"x-api-key": KEY}).json()["summary"]
        if totals.get("requests") == 2:
            break
        time.sleep(0.05)
    prompt = sum(rq.usage["input_tokens"] + rq.usage["cache_read_input_tokens"]
                 + rq.usage["cache_creation_input_tokens"] for rq in upstream.requests)
    assert totals["prompt"] == prompt and totals["cached"] == usage["cache_read_input_tokens"]


def test_count_tokens_counts_what_the_proxy_would_send_unless_raw(upstream, tmp_path):
    body = {"model": "claude-sonnet-4-6", "tools": TOOLS, "messages": tool_turn(big_log())}
    with InProcessProxy(settings(upstream, tmp_path)) as p:
        rewritten = post(p, body, "/v1/messages/count_tokens")
        sent_body = sent(upstream)
    raw_cfg = settings(upstream, tmp_path, routes=[{"name": "default", "count_tokens": "raw"}])
    with InProcessProxy(raw_cfg) as p:
        raw = post(p, body, "/v1/messages/count_tokens")
        assert upstream.requests[-1].body == orjson.dumps(body)
    assert rewritten.status_code == raw.status_code == 200
    assert rewritten.json()["input_tokens"] < raw.json()["input_tokens"] / 3  # the room the proxy made
    assert HANDLE.search(json.dumps(sent_body)) and "<agent_status>" not in json.dumps(sent_body)


def test_errors_on_the_messages_path_take_anthropics_shape(proxy, upstream):
    c = client(proxy)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="claude-sonnet-4-6", max_tokens=64, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}])
    assert e.value.body["type"] == "error" and "toolu_x" in e.value.body["error"]["message"]
    r = post(proxy, {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: Field required"}}
    assert not upstream.requests  # refused before anything went upstream
    r = post(proxy, {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
             "/r/nowhere/v1/messages")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_provider_errors_reach_the_client_unchanged(proxy, upstream):
    from mock_upstream import messages_error_body

    overloaded = messages_error_body("overloaded_error", "Overloaded")
    upstream.fail_next(529, overloaded)
    with pytest.raises(anthropic.APIStatusError) as e:
        client(proxy).messages.create(model="claude-sonnet-4-6", max_tokens=64,
                                      messages=[{"role": "user", "content": "Hi"}])
    assert e.value.status_code == 529 and e.value.body == overloaded


def test_a_route_named_for_the_wrong_api_is_refused_with_the_route_to_use(upstream, tmp_path):
    s = settings(upstream, tmp_path, routes=[
        {"name": "oai", "upstream": {"base_url": upstream.base_url, "api": "openai"}},
        {"name": "claude", "upstream": {"base_url": upstream.base_url, "api": "anthropic"}}])
    with InProcessProxy(s) as p:
        body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        r = post(p, body, "/r/oai/v1/messages")
        assert r.status_code == 400 and "use route 'claude'" in r.json()["error"]["message"]
        chat = p.post("/r/claude/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
        assert chat.status_code == 400 and "does not translate between APIs" in chat.json()["error"]["message"]


def _summary_or_ok(body: dict) -> str:
    """The summarizer's answer when the proxy asks for one, else "ok"."""
    last = json.dumps(body["messages"][-1])
    if "compacting it" not in last and "<transcript>" not in last:
        return "ok"
    from proxy.rewrite.compress.summarizer import SECTIONS
    return "\n".join(f"## {s}\n- the agent ported module {i} to Rust" for i, s in enumerate(SECTIONS))


def _long_session(turns: int) -> list[list[dict]]:
    """The requests of a Claude Code-like session: each turn one Bash call whose result is ~2k tokens."""
    messages: list[dict] = [{"role": "user", "content": "Port the project to Rust."}]
    requests = []
    for i in range(turns):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {i}: reading module {i}."},
            {"type": "tool_use", "id": f"toolu_{i:03d}", "name": "Bash", "input": {"command": f"cat mod{i}.py"}}]})
        out = "\n".join(f"def f{i}_{j}(x): return x * {j} + {i}  # module {i} line {j}" for j in range(120))
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i:03d}",
                                                      "content": out}]})
        requests.append(json.loads(json.dumps(messages)))
    return requests


def _send_turns(proxy_of, upstream, model: str, key: str, requests: list[list[dict]], max_tokens: int = 1024) -> None:
    for n, msgs in enumerate(requests):
        body = {"model": model, "max_tokens": max_tokens, "tools": TOOLS, "messages": msgs}
        r = proxy_of(n).post("/v1/messages", timeout=60, content=orjson.dumps(body),
                       headers={"x-api-key": key, "x-session-id": "long-run", "content-type": "application/json"})
        assert r.status_code == 200, r.text


def _bodies(upstream) -> list[bytes]:
    """What went upstream, less the status bar's clock (elapsed seconds, the minute)."""
    return [re.sub(rb"elapsed: [^\\]+|time: [0-9T:-]+Z", b"", rq.body) for rq in upstream.requests]


def _fresh(upstream) -> None:
    upstream.reset()
    upstream.script(*[_summary_or_ok] * 400)


def test_a_session_longer_than_the_window_survives_with_pairs_intact(upstream, tmp_path):
    model = "claude-test-16k"
    s = settings(upstream, tmp_path, models={model: {"context_window": 16000}},
                 defaults={"compress": {"precompute": None}})
    _fresh(upstream)
    with InProcessProxy(s) as p:
        _send_turns(lambda n: p, upstream, model, KEY, _long_session(40))
    assert all(rq.status == 200 for rq in upstream.requests)  # the mock refuses a broken pair or an overflow
    bodies = [json.loads(b) for b in _bodies(upstream)]
    summaries = [b for b in bodies if "compacting it" in json.dumps(b) or "<transcript>" in json.dumps(b)]
    assert summaries and all(b["max_tokens"] > 0 and b["messages"][-1]["role"] == "user" for b in summaries)
    agent = [b for b in bodies if b not in summaries]
    assert len(agent) == 40 and "<context_summary>" in json.dumps(agent[-1])
    unbroken = sum(len(json.dumps(m)) for m in _long_session(40)[-1]) // 4
    assert unbroken > 16000  # the session really is longer than the window


def test_the_same_session_is_the_same_bytes_across_a_restart_and_two_replicas_on_redis(upstream, tmp_path):
    model, key = "claude-test-16k", f"sk-{uuid.uuid4()}"
    requests = _long_session(30)

    def cfg(store: str):  # noqa: ANN202
        return settings(upstream, tmp_path, store, models={model: {"context_window": 16000}},
                        defaults={"compress": {"precompute": None}})

    _fresh(upstream)
    with InProcessProxy(cfg(f"sqlite:///{tmp_path}/one.db")) as p:
        _send_turns(lambda n: p, upstream, model, key, requests)
    via_one = _bodies(upstream)
    assert any(b"<context_summary>" in b for b in via_one)  # it compacted: there was something to agree on

    _fresh(upstream)
    with InProcessProxy(cfg(f"sqlite:///{tmp_path}/two.db")) as p:
        _send_turns(lambda n: p, upstream, model, key, requests[:15])
    with InProcessProxy(cfg(f"sqlite:///{tmp_path}/two.db")) as p:  # restarted on the same store
        _send_turns(lambda n: p, upstream, model, key, requests[15:])
    assert _bodies(upstream) == via_one

    _fresh(upstream)
    redis = "redis://127.0.0.1:6379/14"
    with InProcessProxy(cfg(redis)) as p1, InProcessProxy(cfg(redis)) as p2:
        _send_turns(lambda n: (p1, p2)[n % 2], upstream, model, key, requests)
    assert _bodies(upstream) == via_one


def test_anthropics_prompt_too_long_teaches_the_window_and_the_turn_is_retried(upstream, tmp_path):
    """The proxy thinks claude-* has 200k; this provider's model has 16k and says so the Anthropic way."""
    model = "claude-sonnet-4-6-16k"
    _fresh(upstream)
    learned = []
    with InProcessProxy(settings(upstream, tmp_path, defaults={"compress": {"precompute": None}})) as p:
        for msgs in _long_session(30):
            r = p.post("/v1/messages", timeout=60, headers={"x-api-key": KEY, "x-session-id": "learn"},
                           content=orjson.dumps({"model": model, "max_tokens": 1024, "tools": TOOLS, "messages": msgs}))
            assert r.status_code == 200, r.text  # the client never sees the overflow
            learned += [int(r.headers["x-ctxproxy-window-learned"])] if "x-ctxproxy-window-learned" in r.headers else []
    rejected = [rq for rq in upstream.requests if rq.status == 400]
    assert len(rejected) == 1
    assert len(learned) == 1 and 14_000 < learned[0] <= 16_000


def test_claude_code_moving_its_breakpoint_is_not_a_cache_break(proxy, upstream):
    """Each turn Claude Code marks its newest block and unmarks the one before; the cache ignores the marker."""
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are Claude Code. " + "Rules. " * 900, "cache_control": mark}]
    turns = _long_session(4)
    for msgs in turns:
        msgs = json.loads(json.dumps(msgs))
        msgs[-1]["content"][-1]["cache_control"] = mark
        r = post(proxy, {"model": "claude-sonnet-4-6", "max_tokens": 256, "system": system, "tools": TOOLS,
                         "messages": msgs}, **{"x-session-id": "moving-mark"})
        assert r.status_code == 200, r.text
        assert "x-ctxproxy-cache-break" not in r.headers, r.headers["x-ctxproxy-cache-break"]
    assert upstream.requests[-1].usage["cache_read_input_tokens"] > 0


def test_a_summary_call_in_the_cached_shape_reads_the_agents_cache(upstream, tmp_path):
    """Anthropic reads its cache only at breakpoints: the summary call carries one at the end of its prefix."""
    model = "claude-test-16k"
    s = settings(upstream, tmp_path, models={model: {"context_window": 16000}},
                 defaults={"compress": {"precompute": None}})
    _fresh(upstream)
    with InProcessProxy(s) as p:
        _send_turns(lambda n: p, upstream, model, KEY, _long_session(40))
    calls = [rq for rq in upstream.requests if b"compacting it" in rq.body]
    assert calls, "the session should have been compacted with a cached-shape summary"
    assert all(rq.body.count(b'"cache_control"') >= 1 for rq in calls)
    assert sum(rq.usage["cache_read_input_tokens"] for rq in calls) > 0


def test_an_unusable_claude_code_session_header_is_ignored_not_refused(proxy, upstream):
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    r = post(proxy, body, **{"x-claude-code-session-id": "x" * 500})
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-session"].startswith("s-")  # derived, as without the header
    bad = post(proxy, body, **{"x-session-id": "x" * 500})  # the client's explicit X-Session-Id stays strict
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_models_passes_through_on_the_route_that_speaks_anthropic(upstream, tmp_path):
    s = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/m.db", routes=[
        {"name": "default", "upstream": {"base_url": upstream.base_url, "api": "openai"}},
        {"name": "claude", "upstream": {"base_url": upstream.base_url, "api": "anthropic"}}])
    with InProcessProxy(s) as p:
        r = p.get("/v1/models", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
        assert r.status_code == 200 and r.headers["x-ctxproxy-route"] == "claude"  # the Anthropic client's route
        r = p.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.headers["x-ctxproxy-route"] == "default"


def test_mid_conversation_system_messages_pass_as_sent(proxy, upstream):
    """Claude Code puts `role: system` messages after a user turn (the API's mid-conversation system messages):
    forwarded in place, also between a tool_use and its tool_result's turn boundary, and counted."""
    messages = [*tool_turn(big_log()),
                {"role": "system", "content": "The user prefers terse answers."},
                {"role": "assistant", "content": "Item 7919 is bad."},
                {"role": "user", "content": "Thanks. Which line?"},
                {"role": "system", "content": [{"type": "text", "text": "Answer with a line number."}]}]
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "tools": TOOLS, "messages": messages}
    r = post(proxy, body)
    assert r.status_code == 200, r.text
    got = sent(upstream)["messages"]
    assert [m["role"] for m in got] == [m["role"] for m in messages]  # nothing after the last (no status bar)
    assert got[3] == messages[3] and got[6] == messages[6]
    assert r.headers["x-ctxproxy-status-bar"] == "skipped: the request ends with a system message"
    assert post(proxy, body, "/v1/messages/count_tokens").status_code == 200
    first = post(proxy, {**body, "messages": [{"role": "system", "content": "x"}, *messages]})
    assert first.status_code == 400 and "top-level `system`" in first.json()["error"]["message"]


def test_count_tokens_after_a_compaction_counts_what_the_next_turn_sends(upstream, tmp_path):
    """Claude Code asks count_tokens how full its window is. Right after a compaction the count must be of the
    prompt the next turn sends (the compaction replayed), not of the client's whole history: a count body has no
    max_tokens, and the compaction's trigger counted the turns' reserve (here a large one, as Claude Code's)."""
    model = "claude-test-16k"
    s = settings(upstream, tmp_path, models={model: {"context_window": 16000}},
                 defaults={"compress": {"precompute": None}})
    _fresh(upstream)
    requests = _long_session(5)
    with InProcessProxy(s) as p:
        _send_turns(lambda n: p, upstream, model, KEY, requests[:-1], max_tokens=8000)
        assert any("<context_summary>" in json.dumps(json.loads(b)) for b in _bodies(upstream))  # it compacted
        counted = p.post("/v1/messages/count_tokens", timeout=60,
                         content=orjson.dumps({"model": model, "tools": TOOLS, "messages": requests[-1]}),
                         headers={"x-api-key": KEY, "x-session-id": "long-run", "content-type": "application/json"})
        assert counted.status_code == 200, counted.text
        _send_turns(lambda n: p, upstream, model, KEY, requests[-1:], max_tokens=8000)
    turn = upstream.requests[-1]
    assert turn.path == "/v1/messages" and turn.usage is not None
    sent_tokens = turn.usage["input_tokens"] + turn.usage.get("cache_read_input_tokens", 0) + \
        turn.usage.get("cache_creation_input_tokens", 0)
    assert abs(counted.json()["input_tokens"] - sent_tokens) <= 0.05 * sent_tokens, (counted.json(), sent_tokens)
