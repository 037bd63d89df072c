"""Work the proxy did is counted once, by the request that first sends it, whichever request wrote it.

Claude Code asks `count_tokens` before it sends a turn. The proxy answers for
what it would send, so that count may be the request that writes a compaction
or stores an offload; the `messages.create` that follows replays them. That turn
is the first to send them upstream: it carries the headers, and the timeline,
the session, `/ctx/v1/stats` and `/metrics` count them, once.
"""

from __future__ import annotations

import json
import uuid

import pytest
from test_figures import metric

MODEL = "claude-test-16k"
TOOLS = [{"name": "Bash", "description": "Run a shell command", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]


def config(**defaults) -> dict:
    return {"models": {MODEL: {"context_window": 16_000}},
            "defaults": {"compress": {"precompute": None, "summary": False}, **defaults}}


pytestmark = pytest.mark.proxy_config(**config(offload={"enabled": False}))


def history(turns: int, lines: int = 120) -> list[dict]:
    """A Claude Code-like history: each turn one Bash call whose result is ~2k tokens."""
    messages: list[dict] = [{"role": "user", "content": "Port the project to Rust."}]
    for i in range(turns):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {i}: reading module {i}."},
            {"type": "tool_use", "id": f"toolu_{i:03d}", "name": "Bash", "input": {"command": f"cat mod{i}.py"}}]})
        out = "\n".join(f"def f{i}_{j}(x): return x * {j} + {i}  # module {i} line {j}" for j in range(lines))
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i:03d}",
                                                      "content": out}]})
    return messages


def figures(proxy, key: str, session: str) -> tuple[list[dict], dict, dict]:
    auth = {"x-api-key": key}
    data = proxy.get(f"/ctx/v1/sessions/{session}", headers=auth).json()
    return data["requests"], data["summary"], proxy.get("/ctx/v1/stats", headers=auth).json()["totals"]["all"]


def test_a_compaction_written_by_count_tokens_is_counted_by_the_turn_that_sends_it(proxy, upstream):
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"count-{uuid.uuid4().hex[:8]}"
    client = proxy.anthropic(api_key=key, default_headers={"x-session-id": session})
    msgs = history(8)
    counted = client.messages.count_tokens(model=MODEL, messages=msgs, tools=TOOLS)
    assert "cleared tool result" in upstream.requests[-1].body.decode()  # the count wrote the compaction
    turns = [client.messages.with_raw_response.create(model=MODEL, max_tokens=1024, messages=msgs, tools=TOOLS)
             for _ in range(2)]
    first, again = (t.headers for t in turns)
    assert first["x-ctxproxy-compaction"] == again["x-ctxproxy-compaction"] == "1"
    assert first["x-ctxproxy-compacted"] == "clear"
    before, after = int(first["x-ctxproxy-tokens-before"]), int(first["x-ctxproxy-tokens-after"])
    assert before > after > 0 and counted.input_tokens > 0
    assert "x-ctxproxy-compacted" not in again and "x-ctxproxy-tokens-before" not in again  # counted once

    timeline, summary, totals = figures(proxy, key, session)
    assert [e["kind"] for e in timeline] == ["count", "turn", "turn"]  # the count is in the timeline, as a count
    assert [e["compactions"] for e in timeline] == [0, 1, 0] and timeline[1]["compacted"] == "clear"
    assert (timeline[1]["tokens_before"], timeline[1]["tokens_after"]) == (before, after)
    assert summary["compactions"] == totals["compactions"] == 1
    text = proxy.get("/metrics").text
    assert metric(text, "ctxproxy_compactions_total", layer="clear") == 1


def test_an_offload_stored_by_count_tokens_is_new_in_the_turn_that_sends_it(make_proxy, upstream):
    proxy = make_proxy(**config(offload={"tool_result_tokens": 1000}))
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"count-{uuid.uuid4().hex[:8]}"
    client = proxy.anthropic(api_key=key, default_headers={"x-session-id": session})
    msgs = history(1)
    client.messages.count_tokens(model=MODEL, messages=msgs, tools=TOOLS)
    assert "stored whole" in json.dumps(upstream.requests[-1].json)  # the count stored the offload
    turns = [client.messages.with_raw_response.create(model=MODEL, max_tokens=1024, messages=msgs, tools=TOOLS)
             for _ in range(2)]
    assert [t.headers["x-ctxproxy-offloaded-new"] for t in turns] == ["1", "0"]
    assert [t.headers["x-ctxproxy-offloaded"] for t in turns] == ["1", "1"]
    timeline, summary, totals = figures(proxy, key, session)
    assert [e["offloaded_new"] for e in timeline] == [0, 1, 0]
    assert summary["offloads"] == totals["offloads"] == 1
    assert metric(proxy.get("/metrics").text, "ctxproxy_offloads_total") == 1


def test_a_compaction_written_by_an_overflow_retry_is_counted_once_by_that_turn(make_proxy, upstream):
    """The proxy thinks claude-* has 200k; this provider's has 16k: the refused turn is rewritten and sent again."""
    proxy = make_proxy(defaults={"compress": {"precompute": None, "summary": False}, "offload": {"enabled": False}})
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"retry-{uuid.uuid4().hex[:8]}"
    client = proxy.anthropic(api_key=key, default_headers={"x-session-id": session})
    answers = [client.messages.with_raw_response.create(model="claude-sonnet-4-6-16k", max_tokens=1024, tools=TOOLS,
                                                        messages=history(n)) for n in range(1, 13)]
    retried = [a.headers for a in answers if "x-ctxproxy-window-learned" in a.headers]
    assert len(retried) == 1 and retried[0]["x-ctxproxy-compacted"]  # the retry compacted, and says so
    versions = max(int(a.headers.get("x-ctxproxy-compaction", 0)) for a in answers)
    carried = sum(1 for a in answers if "x-ctxproxy-compacted" in a.headers)
    timeline, summary, totals = figures(proxy, key, session)
    assert sum(e["compactions"] for e in timeline) == summary["compactions"] == totals["compactions"] == versions
    assert carried <= versions  # a turn that wrote two (its first run's and its retry's) carries them once
    assert metric(proxy.get("/metrics").text, "ctxproxy_compactions_total") == versions
