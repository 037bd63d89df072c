"""Bytes the proxy did not mean to change stay as they were: integers beyond 64 bits keep their digits."""

from __future__ import annotations

import json

import orjson
import pytest
from proxy_server import InProcessProxy

from proxy.request import Conversation
from proxy.wire import jsonio
from proxy.wire.chat.codec import CHAT

KEY = "sk-exact-numbers"
SEED = 123456789012345678901234567890
NEGATIVE = -98765432109876543210987
HUGE = int("7" * 400)  # past a double's range: orjson refuses the body outright
LIMIT = 18446744073709551616  # 2**64, one past what orjson reads as an int


def body(tool_text: str) -> dict:
    return {
        "model": "gpt-4o", "seed": SEED, "temperature": 0.5,
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "maximum": LIMIT, "minimum": NEGATIVE}}}}}],
        "messages": [
            {"role": "system", "content": "You are a coding agent. ünïcode"},
            {"role": "user", "content": "Count."},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function", "x_meta": {"budget": [HUGE, NEGATIVE]},
                "function": {"name": "bash", "arguments": json.dumps({"n": SEED, "cmd": "seq"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_text},
        ],
    }


pytestmark = pytest.mark.proxy_config(defaults={"offload": {"tool_result_tokens": 500}})


@pytest.mark.parametrize("style", [
    pytest.param({"separators": (",", ":"), "ensure_ascii": False}, id="compact"),
    pytest.param({}, id="spaced-ascii"),
    pytest.param({"separators": (",", ":"), "ensure_ascii": True}, id="compact-ascii"),
    pytest.param({"ensure_ascii": False}, id="spaced"),
])
@pytest.mark.parametrize("offloaded", [False, True], ids=["status-bar", "offloaded"])
def test_big_integers_reach_the_provider_with_their_exact_digits(proxy, upstream, style, offloaded):
    tool_text = "\n".join(f"line {i} of output" for i in range(2000 if offloaded else 3))
    raw = json.dumps(body(tool_text), **style).encode()
    r = proxy.post("/v1/chat/completions", content=raw,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 200, r.text
    sent = upstream.requests[-1].body
    assert sent != raw  # rewritten: the read tool added, a status bar, maybe an offload
    out = json.loads(sent)  # the standard library reads integers exactly
    assert out["seed"] == SEED and str(SEED).encode() in sent
    props = out["tools"][0]["function"]["parameters"]["properties"]["n"]
    assert props == {"type": "integer", "maximum": LIMIT, "minimum": NEGATIVE}
    call = out["messages"][2]["tool_calls"][0]
    assert call["x_meta"] == {"budget": [HUGE, NEGATIVE]}
    assert json.loads(call["function"]["arguments"])["n"] == SEED
    assert out["temperature"] == 0.5
    assert ("context_read" in out["messages"][3]["content"]) is offloaded
    # written in the client's own style
    if style.get("separators") == (",", ":"):
        assert b'"seed":' + str(SEED).encode() in sent
    else:
        assert b'"seed": ' + str(SEED).encode() in sent
    assert (b"\\u00fc" in sent) is style.get("ensure_ascii", True)


def test_the_same_body_is_rewritten_into_the_same_bytes(proxy, upstream):
    raw = json.dumps(body("short"), separators=(",", ":"), ensure_ascii=False).encode()
    sent = []
    for _ in range(2):
        r = proxy.post("/v1/chat/completions", content=raw,
                       headers={"authorization": f"Bearer {KEY}", "x-session-id": "exact-numbers-stable"})
        assert r.status_code == 200, r.text
        sent.append(upstream.requests[-1].body)
    assert sent[0] == sent[1] and str(HUGE).encode() in sent[0]


def test_bodies_without_big_integers_keep_the_orjson_reading():
    raw = orjson.dumps({"model": "m", "seed": 2**64 - 1, "low": -(2**63), "t": 1.5e300,
                        "ns": "1700000000000000000 and 12345678901234567890123 in text",
                        "messages": [{"role": "user", "content": "x"}]})
    assert jsonio.loads(raw) == orjson.loads(raw)
    # refused as orjson refuses them, with orjson's message
    for bad in (b'{"a": NaN, "b": 123456789012345678901234567890}', b'{"a": "\\ud800", "b": 123456789012345678901}',
                b'{"a": 1e400, "b": -12345678901234567890123}', b'\xef\xbb\xbf{"b": 123456789012345678901234}'):
        with pytest.raises(orjson.JSONDecodeError):
            jsonio.loads(bad)
    assert jsonio.loads(b'{"a": "\\ud83d\\ude00", "b": 123456789012345678901234}') == {
        "a": "\U0001f600", "b": 123456789012345678901234}


def test_a_long_body_of_long_digit_runs_parses_exactly():
    """Its speed against orjson is measured by `python -m bench.exact_json`, not asserted here (timed tests flake)."""
    msgs = [{"role": "tool", "tool_call_id": f"c{i}", "content": 1700000000000000000 + i * 10**21} for i in range(300)]
    raw = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})[:-1] + b',"x":' + \
        json.dumps([m["content"] for m in msgs]).encode() + b"}"
    conv = Conversation.parse(raw, CHAT)
    assert conv.body["x"] == [m["content"] for m in msgs]  # beyond 64 bits, every digit kept


def test_big_integers_survive_compaction_and_its_replay(upstream, tmp_path):
    """The summarizer call, the stored compaction and every later request keep the digits (and never fail)."""
    import test_compress as tc

    with InProcessProxy(tc.settings(upstream, f"sqlite:///{tmp_path}/c.db")) as p:
        run = tc.agent_run(16)
        run[0] = {**run[0], "x_budget": SEED}  # in the pinned head, stored with the compaction
        tools = [{**tc.TOOLS[0], "function": {**tc.TOOLS[0]["function"], "x_max": LIMIT}}]
        upstream.script(*[tc.responder] * 64)
        for i in range(4, len(run) + 1, 2):
            r = p.post("/v1/chat/completions", timeout=30, headers={"authorization": "Bearer sk-a"},
                           json={"model": tc.MODEL, "messages": run[:i], "tools": tools})
            assert r.status_code == 200, r.text
    summaries = [q for q in upstream.requests if tc.is_summary_call(q.json)]
    chats = tc.chat_requests(upstream)
    assert summaries
    assert len(chats[-1].json["messages"]) < len(run)  # compacted, replayed from the store
    for q in chats + [s for s in summaries if tc.is_cached_shape(s.json)]:
        assert str(LIMIT).encode() in q.body
    for q in chats:
        assert q.json["messages"][0]["x_budget"] == SEED
