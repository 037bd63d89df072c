"""Cache hints: session cache keys and breakpoints make a sharded, marker-honouring provider hit."""

from __future__ import annotations

import json

from proxy_server import InProcessProxy, make_settings

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def run(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are an agent. " + "Rules. " * 400},
            {"role": "user", "content": "do the task"}]
    for i in range(turns):
        msgs += [{"role": "assistant", "content": f"step {i}", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"i": i})}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " * 80}]
    return msgs


def cfg(upstream, tmp_path, **cache):
    return make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db",
                         defaults={"cache": cache, "status_bar": {"mode": "append"}})


def replay(p, model: str, turns: int = 12, key: str = "sk-a", session: str | None = None) -> None:
    full = run(turns)
    for end in range(4, len(full) + 1, 2):
        headers = {"authorization": f"Bearer {key}", **({"x-session-id": session} if session else {})}
        r = p.post("/v1/chat/completions", headers=headers, timeout=30,
                       json={"model": model, "messages": full[:end], "tools": TOOLS})
        assert r.status_code == 200, r.text


def hit_rate(upstream) -> float:
    prompt = sum(r.usage["prompt_tokens"] for r in upstream.requests)
    return sum(r.usage["prompt_tokens_details"]["cached_tokens"] for r in upstream.requests) / prompt


def test_one_session_one_cache_key_and_a_clients_own_key_is_kept(upstream, tmp_path):
    with InProcessProxy(cfg(upstream, tmp_path, prompt_cache_key="session")) as p:
        replay(p, "gpt-4o", turns=3, session="a")
        replay(p, "gpt-4o", turns=3, session="b")
        r = p.post("/v1/chat/completions", headers={"authorization": "Bearer k"},
                       json={"model": "gpt-4o", "messages": run(1), "prompt_cache_key": "mine"})
        assert r.status_code == 200
    keys = [r.json.get("prompt_cache_key") for r in upstream.requests]
    assert len(set(keys[:3])) == 1 and len(set(keys[3:6])) == 1 and keys[0] != keys[3]
    assert keys[-1] == "mine"


def test_cache_key_raises_hit_rate_on_a_sharded_provider(upstream, tmp_path):
    rates = {}
    for mode in ("off", "session"):
        upstream.reset()
        upstream.shards = 4
        with InProcessProxy(cfg(upstream, tmp_path / mode, prompt_cache_key=mode)) as p:
            replay(p, "gpt-4o", turns=16)
        rates[mode] = hit_rate(upstream)
    assert rates["session"] > rates["off"] + 0.15, rates  # measured here: about 0.60 → 0.87


def test_breakpoints_make_a_marker_only_provider_cache(upstream, tmp_path):
    rates = {}
    for mode in ("none", "anthropic"):
        upstream.reset()
        upstream.breakpoint_models = ["claude*"]
        with InProcessProxy(cfg(upstream, tmp_path / mode, breakpoints=mode)) as p:
            replay(p, "claude-sonnet-4", turns=12)
        rates[mode] = hit_rate(upstream)
    assert rates["none"] == 0 and rates["anthropic"] > 0.8, rates


def test_breakpoints_sit_at_the_stable_prefix_within_the_limit(upstream, tmp_path):
    with InProcessProxy(cfg(upstream, tmp_path, breakpoints="auto")) as p:
        replay(p, "claude-sonnet-4", turns=3)
        msgs = json.loads(upstream.requests[-1].body)["messages"]
        marked = [i for i, m in enumerate(msgs) if isinstance(m["content"], list)
                  and any("cache_control" in part for part in m["content"])]
        assert msgs[-1]["content"].startswith("<agent_status>")  # the status bar stays after the marker
        assert marked == [0, len(msgs) - 2]  # after the system prompt, and just before the status
        # A client that already set four markers gets none added, and its request stays valid.
        own = run(4)
        for i in (0, 1, 3, 5):
            own[i] = {**own[i], "content": [{"type": "text", "text": own[i]["content"],
                                             "cache_control": {"type": "ephemeral"}}]}
        r = p.post("/v1/chat/completions", headers={"authorization": "Bearer k"},
                       json={"model": "claude-sonnet-4", "messages": own, "tools": TOOLS})
        assert r.status_code == 200
    sent = json.loads(upstream.requests[-1].body)["messages"]
    count = sum(1 for m in sent if isinstance(m["content"], list) for part in m["content"] if "cache_control" in part)
    assert count == 4


def test_marker_moves_are_not_reported_as_prefix_breaks(upstream, tmp_path):
    with InProcessProxy(cfg(upstream, tmp_path, breakpoints="anthropic")) as p:
        full = run(6)
        for end in range(4, len(full) + 1, 2):
            r = p.post("/v1/chat/completions", headers={"authorization": "Bearer k"},
                           json={"model": "claude-sonnet-4", "messages": full[:end], "tools": TOOLS})
            assert "x-ctxproxy-cache-break" not in r.headers


def test_retention_is_passed_when_configured(upstream, tmp_path):
    with InProcessProxy(cfg(upstream, tmp_path, retention="24h")) as p:
        replay(p, "gpt-4o", turns=1)
    assert upstream.requests[-1].json["prompt_cache_retention"] == "24h"
