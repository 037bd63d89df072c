"""Recorded decisions belong to the route that made them: one route's thresholds never rewrite another's requests.

A `small-*` route offloads tool results over 500 tokens; the `default` route only those over 8,000. The same
results, same API key, sent to each: each route rewrites them by its own policy, and each keeps its own bytes
from request to request, across a restart and across replicas sharing one store. The text a handle names is
stored once per tenant and reads back on every route.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import httpx
import openai
from proxy_server import InProcessProxy, make_settings
from test_compress import agent_run

KEY = "sk-route-decisions"
SALT = "ctxproxy-tenant-v1"  # the built-in tenant salt
HANDLE = re.compile(r'context_read\(handle="(ctx_[0-9a-f]+)"')
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a shell command",
                                           "parameters": {"type": "object",
                                                          "properties": {"cmd": {"type": "string"}}}}}]
ROUTES = {"defaults": {"offload": {"tool_result_tokens": 8000}, "status_bar": {"enabled": False}},
          "routes": [{"name": "small", "match": {"model": "small-*"}, "offload": {"tool_result_tokens": 500}}]}


def result(i: int, lines: int = 150) -> str:
    """A tool result of about 2,000 tokens: over the small route's threshold, well under the default's."""
    return "\n".join(f"{i}: 2026-11-29T12:{n % 60:02d}:00 worker[{n}] processed item {n * 7919 % 100003} ok"
                     for n in range(lines))


def six_results() -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "You are a coding agent."},
                        {"role": "user", "content": "Look through the six logs."}]
    for i in range(6):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "bash",
                                                                 "arguments": f'{{"cmd": "cat {i}.log"}}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": result(i)})
    return msgs


def send(p: InProcessProxy, model: str, session: str | None = None, key: str = KEY) -> tuple[dict, openai.APIResponse]:
    c = p.openai("/v1", api_key=key, max_retries=0)
    headers = {"x-session-id": session} if session else {}
    raw = c.chat.completions.with_raw_response.create(model=model, tools=TOOLS, messages=six_results(),
                                                      extra_headers=headers)
    return raw.headers, raw


def test_a_result_offloaded_on_one_route_is_sent_whole_on_a_route_that_does_not_offload_it(upstream, tmp_path):
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", **ROUTES)
    with InProcessProxy(settings) as p:
        small, _ = send(p, "small-model")
        assert (small["x-ctxproxy-route"], small["x-ctxproxy-offloaded"], small["x-ctxproxy-offloaded-new"]) \
            == ("small", "6", "6")
        small_body = upstream.requests[-1].body
        big, _ = send(p, "gpt-4o", session=f"new-{uuid.uuid4().hex}")
        assert big["x-ctxproxy-route"] == "default"
        assert (big.get("x-ctxproxy-offloaded", "0"), big.get("x-ctxproxy-offloaded-new", "0")) == ("0", "0")
        sent = json.loads(upstream.requests[-1].body)["messages"]
        assert sent == six_results()  # as the client sent them
        again, _ = send(p, "small-model")  # the small route keeps its own decisions
        assert again["x-ctxproxy-offloaded"] == "6" and again["x-ctxproxy-offloaded-new"] == "0"
        assert upstream.requests[-1].body == small_body


def test_stored_text_is_shared_between_routes_and_reads_back_on_either(upstream, tmp_path):
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", **ROUTES)
    with InProcessProxy(settings) as p:
        send(p, "small-model")
        handle = HANDLE.search(json.loads(upstream.requests[-1].body)["messages"][3]["content"]).group(1)
        upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": handle, "limit": 3}}]},
                        "read it")
        c = p.openai("/v1", api_key=KEY, max_retries=0)
        c.chat.completions.create(model="gpt-4o", tools=TOOLS, messages=[{"role": "user", "content": "go"}])
    assert "\n".join(result(0).splitlines()[:3]) in json.loads(upstream.requests[-1].body)["messages"][-1]["content"]


def handles(body: bytes) -> list[str]:
    return [h for m in json.loads(body)["messages"] for h in HANDLE.findall(m.get("content") or "")]


def _bodies(settings, upstream) -> dict[str, bytes]:
    with InProcessProxy(settings) as p:
        out = {}
        for model in ("small-model", "gpt-4o"):
            send(p, model, session=f"s-{model}")
            out[model] = upstream.requests[-1].body
    return out


def test_each_route_keeps_its_bytes_across_a_restart(upstream, tmp_path):
    store = f"sqlite:///{tmp_path}/c.db"
    first = _bodies(make_settings(upstream.base_url, store, **ROUTES), upstream)
    second = _bodies(make_settings(upstream.base_url, store, **ROUTES), upstream)
    assert first == second
    assert len(handles(first["small-model"])) == 6 and not handles(first["gpt-4o"])


def test_replicas_on_one_redis_agree_per_route(upstream):
    store = "redis://127.0.0.1:6379/14"
    key = f"sk-{uuid.uuid4()}"  # a fresh tenant: nothing recorded before
    settings = make_settings(upstream.base_url, store, **ROUTES)
    with InProcessProxy(settings) as a, InProcessProxy(settings) as b:
        seen: dict[str, set[bytes]] = {"small-model": set(), "gpt-4o": set()}
        for p, model in ((a, "gpt-4o"), (b, "small-model"), (b, "gpt-4o"), (a, "small-model")):
            send(p, model, session=f"s-{model}", key=key)
            seen[model].add(upstream.requests[-1].body)
    assert len(seen["small-model"]) == 1 and len(seen["gpt-4o"]) == 1
    assert not handles(seen["gpt-4o"].pop()) and len(handles(seen["small-model"].pop())) == 6


# --------------------------------------------------------------------------- records of before routes had their own

def _legacy_offload(store_url: str, key: str, text: str, placeholder: str, tokens: int) -> None:
    """What the code before per-route decisions recorded for an offloaded result: keyed by tenant and content."""
    from proxy.engine.routing import tenant_id
    from proxy.store import open_store
    from proxy.store.archive import Archive, content_handle

    async def write() -> None:
        store = open_store(store_url)
        try:
            tenant = tenant_id(key, SALT)
            handle = content_handle("tool:tool result of bash", text)
            await Archive(store, tenant).put_text(handle, text)
            await store.put_json(f"t:{tenant}:decision:offload:{handle}",
                                 {"placeholder": placeholder, "tokens": tokens, "preview_tokens": 20})
        finally:
            await store.close()
    asyncio.run(write())


def test_an_old_record_is_replayed_where_the_route_offloads_it_and_ignored_where_it_does_not(upstream, tmp_path):
    """After an upgrade a running session keeps its bytes on the route whose policy offloaded its result; the
    route whose threshold the result does not pass sends it whole, old record or not."""
    store = f"sqlite:///{tmp_path}/c.db"
    legacy = "[an offload recorded before routes had their own decisions]"
    _legacy_offload(store, KEY, result(0), legacy, tokens=2400)
    with InProcessProxy(make_settings(upstream.base_url, store, **ROUTES)) as p:
        send(p, "small-model", session="running")
        assert json.loads(upstream.requests[-1].body)["messages"][3]["content"] == legacy
        send(p, "gpt-4o", session="running")
        assert json.loads(upstream.requests[-1].body)["messages"] == six_results()
    # Adopted, the old record is the small route's own now: it stands even after its threshold is raised,
    # like the decisions the route made itself.
    raised = {**ROUTES, "routes": [{**ROUTES["routes"][0], "offload": {"tool_result_tokens": 5000}}]}
    with InProcessProxy(make_settings(upstream.base_url, store, **raised)) as p:
        send(p, "small-model", session="running")
        sent = json.loads(upstream.requests[-1].body)["messages"]
    assert sent[3]["content"] == legacy and HANDLE.search(sent[5]["content"])


WINDOW, MODEL = 6000, "agent-model"
# Two routes on one model: `archive` compacts by archiving the middle span (no summary call), `default`
# by its own policy (clearing tool results first).
COMPACTING = {"models": {MODEL: {"context_window": WINDOW}},
              "defaults": {"offload": {"enabled": False}, "status_bar": {"enabled": False},
                           "compress": {"keep_recent_tokens": 1200}},
              "routes": [{"name": "archive", "compress": {"summary": False, "min_clear_tokens": 100_000}}]}


def _compact(p: InProcessProxy, upstream, route: str, session: str) -> tuple[httpx.Response, bytes]:
    path = "/v1/chat/completions" if route == "default" else f"/r/{route}/v1/chat/completions"
    r = p.post(path, headers={"authorization": f"Bearer {KEY}", "x-session-id": session},
               json={"model": MODEL, "messages": agent_run(20), "tools": TOOLS})
    assert r.status_code == 200, r.text
    return r, upstream.requests[-1].body


def test_one_session_id_on_two_routes_gets_each_routes_own_compaction(upstream, tmp_path):
    upstream.windows[MODEL] = WINDOW
    with InProcessProxy(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", **COMPACTING)) as p:
        first, _ = _compact(p, upstream, "archive", "one-id")
        assert first.headers["x-ctxproxy-compacted"] == "archive"
        other, _ = _compact(p, upstream, "default", "one-id")
        assert other.headers.get("x-ctxproxy-compacted") == "clear"  # its own, not the archive route's replayed


def test_a_compaction_recorded_before_routes_had_their_own_is_still_replayed(upstream, tmp_path):
    """A session compacted by the old code (its record keyed by session only) keeps its bytes after the upgrade."""
    from proxy.engine.routing import tenant_id
    from proxy.store import open_store

    upstream.windows[MODEL] = WINDOW
    store_url = f"sqlite:///{tmp_path}/c.db"
    with InProcessProxy(make_settings(upstream.base_url, store_url, **COMPACTING)) as p:
        first, before = _compact(p, upstream, "archive", "running")
        assert first.headers["x-ctxproxy-compacted"] == "archive"

    async def as_the_old_code_kept_it() -> None:
        store = open_store(store_url)
        try:
            head = f"t:{tenant_id(KEY, SALT)}:s:running:"
            keys = await store.keys(head + "r:archive:compaction")
            assert keys
            for k in keys:
                await store.put(k.replace(head + "r:archive:", head), await store.get(k) or b"")
                await store.delete(k)
        finally:
            await store.close()
    asyncio.run(as_the_old_code_kept_it())
    with InProcessProxy(make_settings(upstream.base_url, store_url, **COMPACTING)) as p:
        again, after = _compact(p, upstream, "archive", "running")
    assert "x-ctxproxy-compacted" not in again.headers and again.headers["x-ctxproxy-compaction"] == "1"
    assert after == before


SUMMARY = ("## Goal and constraints\nFix the crash in src/app/core.py.\n## Decisions and why\nRead modules first.\n"
           "## Files and artifacts\nsrc/app/module_*.py read.\n## Verified state\nNo module raises.\n"
           "## Open TODOs\nFind the crashing module.\n## Approaches that failed\nNone.\n## Next step\nKeep reading.")


def test_a_span_summarized_on_one_route_is_summarized_again_by_another_routes_summarizer(upstream, tmp_path):
    upstream.windows[MODEL] = WINDOW
    summarizing = {**COMPACTING, "routes": [{"name": "a", "compress": {"min_clear_tokens": 100_000}},
                                            {"name": "b", "compress": {"min_clear_tokens": 100_000,
                                                                       "summary_max_tokens": 300}}]}
    with InProcessProxy(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", **summarizing)) as p:
        upstream.script(SUMMARY, "ok", SUMMARY, "ok")
        a, _ = _compact(p, upstream, "a", "on-a")
        b, _ = _compact(p, upstream, "b", "on-b")
    assert a.headers["x-ctxproxy-compacted"] == b.headers["x-ctxproxy-compacted"] == "summary"
    assert len(upstream.requests) == 4  # each route's own summary call, then the turn
