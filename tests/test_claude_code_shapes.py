"""Claude Code as it ships (2.1.x) through the proxy: its request fields reach the provider as it sent them.

Every turn of Claude Code carries `thinking: {"type": "adaptive"}` (with a
`display`), `output_config: {"effort": ...}`, `context_management` with its
`clear_thinking_20251015` edit keeping every earlier thinking block,
`max_tokens: 32000` and a `metadata.user_id` that is a JSON string, on
`POST /v1/messages?beta=true` with its `anthropic-beta` list. The proxy rewrites
such a turn (offload, status bar, cache breakpoints) without touching any of
them, counts tokens for it the same way, and its own summary call repeats what
decides how the cached messages are rendered. The client is the official
`anthropic` SDK; the provider the tests' mock.
"""

from __future__ import annotations

import json
import re

import orjson
import pytest
from proxy_server import InProcessProxy, make_settings
from test_messages_api import TOOLS, _fresh, _long_session, big_log, tool_turn

KEY = "sk-ant-claude-code"
BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27",
         "prompt-caching-scope-2026-01-05", "effort-2025-11-24"]
FIELDS = {"thinking": {"type": "adaptive", "display": "updates"}, "output_config": {"effort": "high"},
          "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}
SYSTEM = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.294; cc_entrypoint=cli;"},
          {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
           "cache_control": {"type": "ephemeral"}}]
USER_ID = json.dumps({"device_id": "4f1c" * 16, "account_uuid": "", "session_id": "2d7b6d0e-5d3a-4c1e-9f7e-0c5b"})


def config(**raw: object) -> dict:
    return {"defaults": {"offload": {"tool_result_tokens": 2000}}, **raw}


pytestmark = pytest.mark.proxy_config(**config())


def turn(messages: list[dict], **over: object) -> dict:
    """A Claude Code turn: its model, budget, system blocks, tools, metadata and the fields above."""
    return {"model": "claude-opus-4-7", "max_tokens": 32000, "system": SYSTEM, "tools": TOOLS,
            "messages": messages, "metadata": {"user_id": USER_ID}, **FIELDS, **over}


def post(p: InProcessProxy, body: dict, path: str = "/v1/messages?beta=true"):  # noqa: ANN201
    return p.post(path, content=orjson.dumps(body), timeout=60,
                  headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": ",".join(BETAS),
                           "content-type": "application/json"})


def without_clock(body: bytes) -> bytes:
    return re.sub(rb"elapsed: [^\\]+|time: [0-9T:-]+Z", b"", body)


def test_a_rewritten_claude_code_turn_keeps_every_field_as_sent(proxy, upstream):
    body = turn(tool_turn(big_log()))
    c = proxy.anthropic(api_key=KEY, max_retries=0)
    with c.beta.messages.stream(**body, betas=BETAS) as stream:
        final = stream.get_final_message()
    assert final.content[-1].text == "ok"
    got = upstream.requests[-1]
    up = json.loads(got.body)
    assert got.headers["anthropic-beta"] == ",".join(BETAS)
    assert "ctx_" in json.dumps(up["messages"][-1]) and "<agent_status>" in json.dumps(up["messages"][-1])
    for key in ("thinking", "output_config", "context_management", "max_tokens", "metadata", "system", "tools"):
        assert up[key] == body[key] or key == "tools" and up[key][:-1] == body[key], key
    for key in ("thinking", "output_config", "context_management", "metadata"):
        assert orjson.dumps({key: body[key]})[1:-1] in got.body, key  # byte for byte
    raw = orjson.dumps({**body, "stream": True})
    sent = []
    for _ in range(2):  # as Claude Code posts it, twice: the same turn, the same bytes
        assert post(proxy, body | {"stream": True}).status_code == 200
        assert upstream.requests[-1].query == "beta=true"
        sent.append(without_clock(upstream.requests[-1].body))
    assert sent[0] == sent[1] and sent[0] != raw


def test_count_tokens_passes_claude_codes_fields_untouched(proxy, upstream):
    body = {k: v for k, v in turn(tool_turn(big_log())).items() if k not in ("max_tokens", "metadata")}
    c = proxy.anthropic(api_key=KEY, max_retries=0)
    count = c.beta.messages.count_tokens(**body, betas=BETAS)
    up = json.loads(upstream.requests[-1].body)
    assert upstream.requests[-1].path == "/v1/messages/count_tokens" and count.input_tokens > 0
    assert {k: up[k] for k in FIELDS} == FIELDS and up["system"] == SYSTEM
    assert "ctx_" in json.dumps(up["messages"])  # what the proxy would send: the offloaded turn


def test_the_summary_call_repeats_claude_codes_thinking_and_context_edits(upstream, tmp_path):
    """The cached shape re-sends the agent's messages: how the provider renders them (earlier thinking kept by
    `clear_thinking` with keep: all) must be what it cached, so the summary call carries the same settings."""
    model = "claude-test-16k"
    s = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/s.db", models={model: {"context_window": 16000}},
                      **config(defaults={"offload": {"tool_result_tokens": 2000}, "compress": {"precompute": None}}))
    _fresh(upstream)
    with InProcessProxy(s) as p:
        for msgs in _long_session(40):
            r = post(p, turn(msgs, model=model, max_tokens=1024), "/v1/messages")
            assert r.status_code == 200, r.text
    calls = [rq for rq in upstream.requests if b"compacting it" in rq.body]
    assert calls, "the session should have been compacted with a cached-shape summary"
    for rq in calls:
        assert {k: rq.json.get(k) for k in ("thinking", "context_management")} == \
            {k: FIELDS[k] for k in ("thinking", "context_management")}
        assert rq.json["system"] == SYSTEM
    assert sum(rq.usage["cache_read_input_tokens"] for rq in calls) > 0
