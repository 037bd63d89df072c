"""Compression: long runs never overflow, the rewritten prefix stays byte-stable, failures never fail a request."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest
from proxy_server import InProcessProxy, make_settings

from proxy.engine.routing import tenant_id
from proxy.rewrite.compress import transform as compress
from proxy.rewrite.compress.history import pairing_is_valid
from proxy.rewrite.compress.record import CompactionLog
from proxy.rewrite.compress.summarizer import COMPACTION_OPEN, SYSTEM_PROMPT
from proxy.store import open_store
from proxy.wire.chat.codec import CHAT

SALT = "ctxproxy-tenant-v1"
WINDOW = 6000
MODEL = "small-agent-model"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {
    "cmd": {"type": "string"}}}}}]


def agent_run(turns: int) -> list[dict]:
    """A synthetic coding-agent trajectory: every turn cats a file and gets ~350 tokens back."""
    msgs = [{"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": "Fix the crash in src/app/core.py reported at https://example.com/issues/4242"}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": f"Looking at module {i}.", "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat src/app/module_{i}.py"})}}]})
        body = "\n".join(f"def f_{i}_{j}(x):  # rev {i:04x}{j:04x}beef\n    return x * {j}" for j in range(25))
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": body})
    return msgs


def is_cached_shape(req: dict) -> bool:
    return str(req["messages"][-1].get("content")).startswith(COMPACTION_OPEN)


def is_summary_call(req: dict) -> bool:
    return req["messages"][0].get("content") in (SYSTEM_PROMPT,) or "Answer one question" in str(req["messages"][0]) \
        or is_cached_shape(req)


# What a model asked for the seven headings writes (the proxy refuses a summary missing most of them).
SUMMARY = ("## Goal and constraints\nFix the crash in src/app/core.py reported in issue 4242; keep the public API.\n"
           "## Decisions and why\nRead every module before editing, since the crash may come from an import.\n"
           "## Files and artifacts\nRead the modules under src/app/ one by one; nothing edited yet.\n"
           "## Verified state\nEach module defines small f_i_j helpers returning x * j; none raises.\n"
           "## Open TODOs\nFind the module that the crash trace points to.\n"
           "## Approaches that failed\nNone so far.\n## Next step\nKeep reading modules.")


def responder(req: dict) -> str:
    if is_summary_call(req):
        return SUMMARY
    return "ok"


def config(**compress) -> dict:
    return {"models": {MODEL: {"context_window": WINDOW}},
            "defaults": {"offload": {"enabled": False}, "status_bar": {"enabled": False},
                         "compress": {"keep_recent_tokens": 1200, **compress}}}


def settings(upstream, store: str, **compress):
    upstream.windows[MODEL] = WINDOW
    return make_settings(upstream.base_url, store, **config(**compress))


def post(proxy: InProcessProxy, messages: list[dict], key: str = "sk-a", **extra) -> httpx.Response:
    return proxy.post("/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {key}"},
                      json={"model": MODEL, "messages": messages, "tools": TOOLS, **extra})


def chat_requests(upstream) -> list:
    return [r for r in upstream.requests if not is_summary_call(r.json)]


def replay(proxy, upstream, turns: int, key: str = "sk-a") -> list[httpx.Response]:
    run = agent_run(turns)
    upstream.script(*[responder] * (4 * turns))
    out = []
    for i in range(4, len(run) + 1, 2):  # each turn sends the history so far, ending with a tool result
        out.append(post(proxy, run[:i], key))
    return out


pytestmark = pytest.mark.proxy_config(**config())


@pytest.fixture(autouse=True)
def model_window(upstream):
    upstream.windows[MODEL] = WINDOW


def test_long_run_never_overflows_and_keeps_identifiers(proxy, upstream):
    responses = replay(proxy, upstream, 40)
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200][:1]
    compactions = [r.headers["x-ctxproxy-compacted"] for r in responses if "x-ctxproxy-compacted" in r.headers]
    # Rare and large: each one buys (trigger - target) x window / tokens per turn ≈ 5 turns here.
    assert compactions and len(compactions) <= 10
    assert all(pairing_is_valid(CHAT, r.json["messages"]) for r in chat_requests(upstream))
    last = upstream.requests[-1].body.decode()
    for ident in ("src/app/core.py", "https://example.com/issues/4242", "src/app/module_0.py", "src/app/module_39.py"):
        assert ident in last, ident


def test_prefix_is_byte_identical_between_compactions(proxy, upstream):
    responses = replay(proxy, upstream, 40)
    reqs = chat_requests(upstream)
    first = next(i for i, r in enumerate(responses) if "x-ctxproxy-compacted" in r.headers)
    version = responses[first].headers["x-ctxproxy-compaction"]
    same = [i for i in range(first, len(responses)) if responses[i].headers.get("x-ctxproxy-compaction") == version]
    assert len(same) >= 3
    kept = None
    for i in same:
        msgs = reqs[i].json["messages"]
        summary_at = next(j for j, m in enumerate(msgs)
                          if "compacted" in str(m.get("content")) or "cleared" in str(m.get("content")))
        prefix = json.dumps(msgs[:summary_at + 1])
        kept = kept or prefix
        assert prefix == kept
    # ...and the provider's cache hits on every request after the compacting one.
    assert all(reqs[i].usage["prompt_tokens_details"]["cached_tokens"] > 0 for i in same[1:])


def test_summary_has_sections_identifiers_and_a_readable_archive(upstream, tmp_path):
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000)) as proxy:
        replay(proxy, upstream, 40)
        _check_summary(proxy, upstream)


def _check_summary(proxy, upstream):
    summaries = [m for r in chat_requests(upstream) for m in r.json["messages"]
                 if "<context_summary>" in str(m.get("content"))]
    assert summaries, "no summary reached the provider"
    text = summaries[-1]["content"]
    assert "## Goal and constraints" in text and "## Identifiers" in text and "src/app/module_1.py" in text
    # Rolling: each archive holds the previous summary, whose handle leads further back.
    seen, handle = "", text.split('context_read(handle="')[1].split('"')[0]
    for _ in range(20):
        raw = proxy.get(f"/ctx/v1/blobs/{handle}", headers={"authorization": "Bearer sk-a"})
        assert raw.status_code == 200
        seen += raw.text
        if 'context_read(handle="' not in raw.text:
            break
        handle = raw.text.split('context_read(handle="')[1].split('"')[0]
    assert "cat src/app/module_0.py" in seen and "cat src/app/module_30.py" in seen


def _bodies(settings_obj, upstream, key: str) -> list[bytes]:
    upstream.reset()
    with InProcessProxy(settings_obj) as p:
        replay(p, upstream, 30, key)
    return [r.body for r in chat_requests(upstream)]


def test_same_history_same_bytes_after_restart_and_across_redis_replicas(upstream, tmp_path):
    store = f"sqlite:///{tmp_path}/c.db"
    a = _bodies(settings(upstream, store), upstream, "sk-a")
    b = _bodies(settings(upstream, store), upstream, "sk-a")  # restart: records replayed, no new summaries
    assert a == b
    assert not any(is_summary_call(r.json) for r in upstream.requests)
    assert_replicas_send_one_proxys_bytes(upstream, "redis://127.0.0.1:6379/14", f"sqlite:///{tmp_path}/d.db")


def assert_replicas_send_one_proxys_bytes(upstream: Any, shared: str, alone: str) -> None:
    """One agent session alternating between two replicas on store `shared` reaches the provider in the bytes
    one proxy on store `alone` sends, and no replica degraded on the way."""
    key = f"sk-{uuid.uuid4()}"
    upstream.reset()
    with InProcessProxy(settings(upstream, shared)) as p1, InProcessProxy(settings(upstream, shared)) as p2:
        run = agent_run(30)
        upstream.script(*[responder] * 200)
        for n, i in enumerate(range(4, len(run) + 1, 2)):
            assert "x-ctxproxy-degraded" not in post(p1 if n % 2 else p2, run[:i], key).headers
    via_two = [r.body for r in chat_requests(upstream)]
    upstream.reset()
    with InProcessProxy(settings(upstream, alone)) as p:
        run = agent_run(30)
        upstream.script(*[responder] * 200)
        for i in range(4, len(run) + 1, 2):
            post(p, run[:i], key)
    assert via_two == [r.body for r in chat_requests(upstream)]


def test_failing_summarizer_never_fails_the_request(upstream, tmp_path):
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000)) as p:
        run = agent_run(20)
        upstream.fail_next(500, {"error": {"message": "summarizer down", "type": "server_error"}})
        r = post(p, run)
        assert r.status_code == 200 and r.headers["x-ctxproxy-compacted"] in ("clear", "archive")
        assert json.loads(upstream.requests[-1].body)["messages"][-1] == run[-1]
        # The breaker is open: the next compaction does not call the summarizer again.
        n = len(upstream.requests)
        r2 = post(p, agent_run(26))
        assert r2.status_code == 200
        assert not any(is_summary_call(x.json) for x in upstream.requests[n:])


def test_an_archived_span_keeps_its_identifiers_in_the_note(upstream, tmp_path):
    """When no summary can be had, the archive note still lists the span's paths verbatim (code-written), so the
    names the agent acted on are not lost with the messages."""
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000)) as p:
        upstream.fail_next(500, {"error": {"message": "summarizer down", "type": "server_error"}})
        r = post(p, agent_run(20))
        assert r.status_code == 200 and r.headers["x-ctxproxy-compacted"] == "archive"
    note = next(m["content"] for m in json.loads(upstream.requests[-1].body)["messages"]
                if isinstance(m.get("content"), str) and "were archived" in m["content"])
    assert "## Identifiers (verbatim from the compacted messages)" in note
    assert "src/app/module_3.py" in note  # a file the agent read inside the archived span


def test_hanging_summarizer_times_out_into_a_fallback(upstream, tmp_path):
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", summary_timeout=0.3,
                              min_clear_tokens=100_000)) as p:
        upstream.delay_for = lambda req: 1.0 if is_summary_call(req) else 0.0  # only the summary call hangs
        r = post(p, agent_run(20))
    assert r.status_code == 200 and r.headers["x-ctxproxy-compacted"] in ("clear", "archive")


def test_concurrent_requests_of_a_session_summarize_once(upstream, tmp_path):
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000)) as p:
        upstream.script(*[responder] * 20)
        upstream.delay = 0.3
        run = agent_run(24)

        async def go() -> list:
            async with p.async_http_client() as c:
                return await asyncio.gather(*[c.post("/v1/chat/completions",
                                                     headers={"authorization": "Bearer sk-a"},
                                                     json={"model": MODEL, "messages": run, "tools": TOOLS})
                                              for _ in range(3)])
        responses = asyncio.run(go())
    assert all(r.status_code == 200 for r in responses)
    assert sum(is_summary_call(r.json) for r in upstream.requests) == 1
    assert len({r.body for r in chat_requests(upstream)}) == 1


def test_a_holder_killed_mid_compaction_frees_the_session_within_seconds(upstream, tmp_path, monkeypatch):
    """kill -9 during a summary call leaves the session's lock behind; the next request waits out its short
    lease and compacts, rather than waiting the summary timeout (130 s) and going upstream over the window."""
    monkeypatch.setattr(compress, "LOCK_LEASE_S", 1.0)  # the lease shortened (5 s in a server): the same wait
    store_url = f"sqlite:///{tmp_path}/c.db"
    session = f"killed-{uuid.uuid4().hex}"
    lock = CompactionLog(open_store(store_url), tenant_id("sk-a", SALT), session, "default", None).lock_name

    async def left_by_the_killed_process() -> str | None:
        # taken as a holder takes it, then never renewed: the holder is gone. Its own connection waits up to 5 s
        # for the file's write lock, which the proxy starting beside it may hold for a moment on a loaded machine
        store = open_store(store_url, 5.0)
        try:
            return await store.acquire_lock(lock, compress.LOCK_LEASE_S)
        finally:
            await store.close()

    with InProcessProxy(settings(upstream, store_url, min_clear_tokens=100_000)) as p:
        assert asyncio.run(left_by_the_killed_process())
        upstream.script(*[responder] * 5)
        # The client gives up a few seconds after the dead holder's lease runs out: waiting the summary
        # timeout (130 s) instead fails the test as a ReadTimeout, which the in-process bridge enforces.
        bound = compress.LOCK_LEASE_S + 5
        try:
            r = p.post("/v1/chat/completions", timeout=bound,
                       headers={"authorization": "Bearer sk-a", "x-session-id": session},
                       json={"model": MODEL, "messages": agent_run(20), "tools": TOOLS})
        except httpx.ReadTimeout:
            pytest.fail(f"no answer {bound:g}s in: the request waited on a dead holder's lock past its lease")
    assert r.status_code == 200 and r.headers.get("x-ctxproxy-compacted") == "summary"


def test_a_live_holder_keeps_the_lock_past_its_lease_so_nobody_summarizes_twice(upstream, tmp_path, monkeypatch):
    monkeypatch.setattr(compress, "LOCK_LEASE_S", 0.5)
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000)) as p:
        upstream.script(*[responder] * 20)
        upstream.delay_for = lambda req: 1.5 if is_summary_call(req) else 0.0  # the summary call takes three leases
        run = agent_run(24)

        async def go() -> list:
            async with p.async_http_client(timeout=60) as c:
                def send() -> Any:
                    return c.post("/v1/chat/completions", headers={"authorization": "Bearer sk-a"},
                                  json={"model": MODEL, "messages": run, "tools": TOOLS})
                first = asyncio.ensure_future(send())
                await asyncio.sleep(0.75)  # a lease and a half into the first request's summary call
                second = asyncio.ensure_future(send())
                return [await first, await second]
        responses = asyncio.run(go())
    assert all(r.status_code == 200 for r in responses)
    assert sum(is_summary_call(r.json) for r in upstream.requests) == 1
    assert responses[0].headers.get("x-ctxproxy-compacted") == "summary"
    assert responses[1].headers.get("x-ctxproxy-compaction") == responses[0].headers.get("x-ctxproxy-compaction")
    assert len({r.body for r in chat_requests(upstream)}) == 1


def test_dangling_tool_call_gets_a_synthetic_result(proxy, upstream):
    run = agent_run(20)
    run.insert(10, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "lost", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]})
    run.append({"role": "user", "content": "continue"})
    upstream.script(*[responder] * 4)
    assert post(proxy, run).status_code == 200
    assert pairing_is_valid(CHAT, json.loads(upstream.requests[-1].body)["messages"])


def test_facts_strategy_asks_each_question_concurrently(upstream, tmp_path):
    facts = ["Which files changed?", "What failed?"]
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", strategy="facts", facts=facts,
                              min_clear_tokens=100_000)) as p:
        upstream.script(*[lambda req: "answer" if is_summary_call(req) else "ok"] * 10)
        r = post(p, agent_run(24))
    assert r.status_code == 200 and r.headers["x-ctxproxy-compacted"] == "summary"
    assert sum(is_summary_call(x.json) for x in upstream.requests) == 2
    content = json.dumps(json.loads(upstream.requests[-1].body)["messages"])
    assert "## Which files changed?" in content and "## What failed?" in content


def test_unknown_window_is_learned_from_the_provider_and_remembered(upstream, tmp_path):
    """A local model the proxy knows nothing about: the first overflow teaches it the window."""
    store = f"sqlite:///{tmp_path}/c.db"
    cfg = make_settings(upstream.base_url, store, defaults={"offload": {"enabled": False},
                                                            "status_bar": {"enabled": False},
                                                            "compress": {"keep_recent_tokens": 800}})
    upstream.windows["my-local-coder"] = 4000
    upstream.script(*[responder] * 20)
    run = agent_run(16)  # ~6k tokens: over the real window, far under the assumed 128k

    def ask(p):
        return p.post("/v1/chat/completions", headers={"authorization": "Bearer k"}, timeout=30,
                          json={"model": "my-local-coder", "messages": run, "tools": TOOLS})

    with InProcessProxy(cfg) as p:
        first = ask(p)
        assert first.status_code == 200, first.text
        assert first.headers["x-ctxproxy-window-learned"] == "4000" and "x-ctxproxy-compacted" in first.headers
        statuses = [r.status for r in upstream.requests if not is_summary_call(r.json)]
        assert statuses == [400, 200]
    upstream.reset()
    upstream.script(*[responder] * 20)
    with InProcessProxy(cfg) as p:  # after a restart the window is still known: no failed attempt
        assert ask(p).status_code == 200
    assert all(r.status == 200 for r in upstream.requests)


# ---- the summarizer's cached shape: the agent's own prefix plus one instruction

BIG = 20_000  # room for the cached shape: prefix at the trigger + instruction + answer fit the window


def big_settings(upstream, store: str, **compress):
    upstream.windows[MODEL] = BIG
    return make_settings(upstream.base_url, store, models={MODEL: {"context_window": BIG}},
                         defaults={"offload": {"enabled": False}, "status_bar": {"enabled": True},
                                   "compress": {"keep_recent_tokens": 1500, "summary_max_tokens": 500, **compress}})


def test_summarizer_call_is_the_agents_cached_prefix_plus_an_instruction(upstream, tmp_path):
    with InProcessProxy(big_settings(upstream, f"sqlite:///{tmp_path}/c.db")) as p:
        replay(p, upstream, 60)
    reqs = upstream.requests
    calls = [i for i, r in enumerate(reqs) if is_summary_call(r.json)]
    assert calls and all(is_cached_shape(reqs[i].json) for i in calls)
    for i in calls:
        call, before = reqs[i].json, reqs[i - 1].json  # the agent request the provider saw just before
        assert not is_summary_call(before)
        prefix = call["messages"][:-1]
        # byte-identical to the start of what the provider last saw (re-inserted statuses included) ...
        assert json.dumps(prefix) == json.dumps(before["messages"][:len(prefix)])
        assert len(prefix) > 2 and call["tools"] == before["tools"]  # ... with the same tools, read tool included
        assert [t["function"]["name"] for t in call["tools"]] == ["bash", "context_read"]
        # so the provider bills it from its cache (the mock compares token prefixes)
        usage = reqs[i].usage
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.8 * usage["prompt_tokens"]
    # and the summary it wrote is what the agent gets
    summaries = [m["content"] for r in chat_requests(upstream) for m in r.json["messages"]
                 if "<context_summary>" in str(m.get("content"))]
    assert summaries and "## Goal and constraints" in summaries[-1]


def test_other_summary_model_uses_the_transcript_shape(upstream, tmp_path):
    with InProcessProxy(big_settings(upstream, f"sqlite:///{tmp_path}/c.db", summary_model="cheap-model")) as p:
        replay(p, upstream, 60)
    calls = [r.json for r in upstream.requests if is_summary_call(r.json)]
    assert calls and all(c["model"] == "cheap-model" and c["messages"][0]["content"] == SYSTEM_PROMPT
                         and not is_cached_shape(c) for c in calls)


def test_cached_shape_answered_with_a_tool_call_falls_back_to_the_transcript(upstream, tmp_path):
    def stubborn(req: dict):
        if is_cached_shape(req):
            return {"tool_calls": [{"name": "bash", "arguments": json.dumps({"cmd": "ls"})}]}
        return responder(req)

    with InProcessProxy(big_settings(upstream, f"sqlite:///{tmp_path}/c.db")) as p:
        run = agent_run(60)
        upstream.script(*[stubborn] * 400)
        rs = [post(p, run[:i]) for i in range(4, len(run) + 1, 2)]
    assert all(r.status_code == 200 for r in rs)
    kinds = [("cached" if is_cached_shape(r.json) else "transcript") for r in upstream.requests
             if is_summary_call(r.json)]
    assert kinds and kinds[0] == "cached" and kinds[1] == "transcript"
    assert any(r.headers.get("x-ctxproxy-compacted") == "summary" for r in rs)


def test_cached_shape_carries_the_agents_cache_key(upstream, tmp_path):
    """A provider that routes by prompt_cache_key must see the summarizer on the agent's shard."""
    upstream.windows[MODEL] = BIG
    with InProcessProxy(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/k.db",
                                   models={MODEL: {"context_window": BIG}},
                                   defaults={"offload": {"enabled": False},
                                             "cache": {"prompt_cache_key": "session"},
                                             "compress": {"keep_recent_tokens": 1500,
                                                          "summary_max_tokens": 500}})) as p:
        replay(p, upstream, 60)
    reqs = upstream.requests
    calls = [i for i, r in enumerate(reqs) if is_cached_shape(r.json)]
    assert calls
    for i in calls:
        key = reqs[i].json.get("prompt_cache_key")
        assert key and key.startswith("ctx-") and key == reqs[i - 1].json["prompt_cache_key"]


def test_cached_shape_refused_for_length_falls_back_to_the_transcript(upstream, tmp_path):
    """The provider's window is smaller than the proxy believes: the cached shape (prefix + a large answer
    budget) is refused with a 400, and the transcript shape, much smaller, still summarizes."""
    # no precompute: at 0.7 of the window the prefix is small enough for the cached shape after all
    settings_obj = big_settings(upstream, f"sqlite:///{tmp_path}/c.db", summary_max_tokens=3500, precompute=None)
    upstream.windows[MODEL] = 18_500  # agent requests (<= 0.85 x 20,000) fit; prefix + 3,500 does not
    with InProcessProxy(settings_obj) as p:
        rs = replay(p, upstream, 60)
    assert all(r.status_code == 200 for r in rs)
    calls = [r for r in upstream.requests if is_summary_call(r.json)]
    shapes = [(("cached" if is_cached_shape(r.json) else "transcript"), r.status) for r in calls]
    assert ("cached", 400) in shapes and ("transcript", 200) in shapes
    assert any(r.headers.get("x-ctxproxy-compacted") == "summary" for r in rs)
