"""Exact figures: every report (headers, timeline, stats, sessions, /metrics) says the same, by the README's
definitions.

The crafted session (tests/crafted.py) has known numbers: 3 offloads, 1
compaction, and per request a saving computed here from the client's body and
what the mock upstream received, without the proxy's code.
"""

from __future__ import annotations

import json
import re
import uuid

import crafted
import pytest
from proxy_server import InProcessProxy, make_settings

import proxy.accounting.accountant as accounting
from proxy.wire.chat.codec import CHAT

HANDLE = re.compile(r'handle="(ctx_[0-9a-f]{20})"')
PLACEHOLDER = re.compile(r"^\[ctxproxy: (tool result of \w+ stored whole|cleared tool result)")


def config(**raw) -> dict:
    return {"env": {"CTXPROXY_ADMIN_TOKEN": "s3cret"}, "models": {crafted.MODEL: {"context_window": crafted.WINDOW}},
            "defaults": crafted.DEFAULTS, **raw}


def settings(upstream, tmp_path, **raw):
    return make_settings(upstream.base_url, f"sqlite:///{tmp_path}/f.db", **config(**raw))


pytestmark = pytest.mark.proxy_config(**config())


def get(p: InProcessProxy, path: str, key: str) -> dict:
    """No waiting: a request is visible as soon as its response has completed."""
    r = p.get(path, headers={"authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_crafted_session_has_the_same_figures_everywhere(proxy, upstream):
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"crafted-{uuid.uuid4().hex[:8]}"
    run = crafted.drive(proxy, upstream, key, session)
    sent = [r.json for r in upstream.requests]
    assert len(sent) == 3  # no summarizer, no read rounds: one upstream call per request
    given = {h for body in sent for m in body["messages"] if m["role"] == "tool"
             and PLACEHOLDER.match(m["content"]) for h in HANDLE.findall(m["content"])}

    # headers: what this request did, apart from what is in effect in it
    h = [r.headers for r in run.responses]
    assert [x["x-ctxproxy-offloaded-new"] for x in h] == ["2", "1", "0"]
    assert [x["x-ctxproxy-offloaded"] for x in h] == ["2", "3", "3"] == [str(e.placeholders) for e in run.expected]
    assert [int(x["x-ctxproxy-tokens-saved"]) for x in h] == [e.saved for e in run.expected]
    assert [x.get("x-ctxproxy-compacted") for x in h] == [None, None, "clear"]

    # the timeline, request by request
    data = get(proxy, f"/ctx/v1/sessions/{session}", key)
    timeline, summary = data["requests"], data["summary"]
    assert [e["request_id"] for e in timeline] == [x["x-ctxproxy-request-id"] for x in h]
    assert [e["offloaded_new"] for e in timeline] == [2, 1, 0]
    assert [e["offloaded"] for e in timeline] == [2, 3, 3]
    assert [e["compactions"] for e in timeline] == [0, 0, 1] and timeline[2]["compacted"] == "clear"
    for e, want in zip(timeline, run.expected):
        assert (e["saved"], e["saved_offload"], e["saved_compress"], e["added"]) == \
            (want.saved, want.offload, want.compress, want.added)
        assert e["client_tokens"] - e["sent_tokens"] == want.saved
    breaks = sum(1 for e in timeline if e["break"])

    # the session's summary, the stats totals and the route/model row
    stats = get(proxy, "/ctx/v1/stats", key)
    rows = [summary, stats["totals"]["all"], stats["totals"]["last_hour"], stats["groups"][0]["all"]]
    for row in rows:
        assert row["offloads"] == 3 and row["compactions"] == 1 and row["breaks"] == breaks
        assert row["saved_tokens"] == run.total("saved")
        assert row["saved_offload"] == run.total("offload") and row["saved_compress"] == run.total("compress")
        assert row["added_tokens"] == run.total("added")
        assert row["saved_tokens"] == row["client_tokens"] - row["sent_tokens"]
        assert row["handles_given"] == len(given) == 7 and row["handles_read"] == 0 and row["readback_rate"] == 0
        assert row["read_rounds"] == 0 and row["own_calls"] == 0
    assert summary["prompt"] == stats["totals"]["all"]["prompt"] == sum(r.usage["prompt_tokens"]
                                                                       for r in upstream.requests)

    # /metrics, from the same figures
    text = proxy.get("/metrics", timeout=10).text
    assert metric(text, "ctxproxy_offloads_total", model=crafted.MODEL) == 3
    assert metric(text, "ctxproxy_compactions_total", layer="clear") == 1
    assert metric(text, "ctxproxy_client_prompt_tokens_total") - metric(text, "ctxproxy_sent_prompt_tokens_total") \
        == run.total("saved")
    assert metric(text, "ctxproxy_tokens_saved_total", by="offload") == run.total("offload")
    assert metric(text, "ctxproxy_tokens_saved_total", by="compress") == run.total("compress")
    assert metric(text, "ctxproxy_handles_given_total") == 7
    assert metric(text, "ctxproxy_cache_breaks_total") == breaks


def _find_handle(body: dict) -> str:
    return next(h for m in body["messages"] for h in HANDLE.findall(str(m.get("content"))))


@pytest.mark.parametrize("stream", [False, True])
def test_hidden_read_rounds_are_billed_to_the_turn(proxy, upstream, stream):
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"reads-{uuid.uuid4().hex[:8]}"
    upstream.windows[crafted.MODEL] = crafted.WINDOW
    msgs = crafted.requests()[0]
    upstream.script(lambda body: {"tool_calls": [{"name": "context_read",
                                                  "arguments": {"handle": _find_handle(body)}}]},
                    lambda body: {"tool_calls": [{"name": "context_read",
                                                  "arguments": {"handle": _find_handle(body), "offset": 5}}]},
                    "worker 17 failed")
    client = proxy.openai("/v1", api_key=key, max_retries=0,
                           default_headers={"x-session-id": session})
    kw = dict(model=crafted.MODEL, messages=msgs, tools=crafted.TOOLS)
    billed = None
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        usage, text = chunks[-1].usage, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        raw = client.chat.completions.with_raw_response.create(**kw)
        assert raw.headers["x-ctxproxy-read-rounds"] == "2"
        out = raw.parse()
        usage, text = out.usage, out.choices[0].message.content
    assert text == "worker 17 failed" and len(upstream.requests) == 3
    billed = [r.usage for r in upstream.requests]
    assert usage.prompt_tokens == sum(u["prompt_tokens"] for u in billed)
    assert usage.completion_tokens == sum(u["completion_tokens"] for u in billed)
    assert usage.total_tokens == sum(u["total_tokens"] for u in billed)
    assert usage.prompt_tokens_details.cached_tokens == sum(u["prompt_tokens_details"]["cached_tokens"] for u in billed)

    (entry,) = get(proxy, f"/ctx/v1/sessions/{session}", key)["requests"]
    assert entry["prompt"] == usage.prompt_tokens and entry["completion"] == usage.completion_tokens
    assert entry["read_rounds"] == 2 and entry["read_handles"] == 1 and "own_calls" not in entry  # none made
    totals = get(proxy, "/ctx/v1/stats", key)["totals"]["all"]
    assert totals["prompt"] == usage.prompt_tokens and totals["own_prompt"] == 0 and totals["read_rounds"] == 2
    assert (totals["handles_given"], totals["handles_read"], totals["readback_rate"]) == (2, 1, 0.5)
    # the inspector shows the hidden rounds: the model's calls, the proxy's answers, what each round was billed
    rounds = get(proxy, f"/ctx/v1/sessions/{session}/requests/1", key)["rounds"]
    assert [[c["name"] for c in r["calls"]] for r in rounds] == [["context_read"], ["context_read"]]
    assert [r["usage"]["prompt"] for r in rounds] == [u["prompt_tokens"] for u in billed[:2]]
    handle = json.loads(rounds[0]["calls"][0]["arguments"])["handle"]
    assert rounds[0]["answers"][0]["head"].startswith(f"[{handle}: lines 0-")
    assert rounds[1]["answers"][0]["head"].startswith(f"[{handle}: lines 5-")


def test_requests_that_never_reached_the_provider_add_no_tokens(upstream, tmp_path):
    dead = {"name": "dead", "upstream": {"base_url": "http://127.0.0.1:1/v1"}}
    with InProcessProxy(settings(upstream, tmp_path, routes=[dead])) as p:
        key, session = f"sk-{uuid.uuid4().hex[:8]}", f"dead-{uuid.uuid4().hex[:8]}"
        msgs = crafted.requests()[0]
        body = {"model": crafted.MODEL, "messages": msgs, "tools": crafted.TOOLS}
        auth = {"authorization": f"Bearer {key}", "x-session-id": session}
        ok = p.post("/v1/chat/completions", json=body, headers=auth, timeout=30)
        assert ok.status_code == 200
        gone = p.post("/r/dead/v1/chat/completions", json=body, headers=auth, timeout=30)
        assert gone.status_code == 502
        upstream.fail_next(429, {"error": {"message": "slow down", "type": "rate_limit_error"}})
        refused = p.post("/v1/chat/completions", json=body, headers=auth, timeout=30)
        assert refused.status_code == 429
        again = p.post("/v1/chat/completions", json=body, headers=auth, timeout=30)
        assert again.status_code == 200
        timeline = get(p, f"/ctx/v1/sessions/{session}", key)["requests"]
        totals = get(p, "/ctx/v1/stats", key)["totals"]["all"]
    assert [e["status"] for e in timeline] == [200, 502, 429, 200]
    for e in timeline[1:3]:
        assert e["accepted"] is False and e["cacheable"] == 0 and e["prompt"] is None and e["saved"] is None
    # the last request is measured against the last one the provider accepted, the same prompt
    assert timeline[3]["cacheable"] == timeline[3]["previous"] == timeline[0]["sent_tokens"]
    assert totals["requests"] == 4 and totals["errors"] == 2
    assert totals["cacheable"] == timeline[0]["cacheable"] + timeline[3]["cacheable"] == timeline[3]["cacheable"]
    assert totals["prompt"] == sum(r.usage["prompt_tokens"] for r in upstream.requests if r.usage)
    assert totals["saved_tokens"] == timeline[0]["saved"] + timeline[3]["saved"]
    # counted once per route, by the request that first offloaded them there, whatever its status: the first
    # request's two on the default route, the dead route's own two (the text stored once)
    assert totals["offloads"] == 4 and timeline[1]["offloaded_new"] == 2 and timeline[3].get("offloaded_new", 0) == 0


def test_a_request_is_visible_as_soon_as_its_response_completes(proxy, upstream, monkeypatch):
    monkeypatch.setattr(accounting, "FLUSH_DELAY", 30.0)  # the background batch would wait half a minute
    key = f"sk-{uuid.uuid4().hex[:8]}"
    client = proxy.openai("/v1", api_key=key, max_retries=0)
    for i, stream in enumerate((False, True), 1):
        session = f"ryw-{uuid.uuid4().hex[:8]}"
        kw = dict(model="gpt-4o", messages=[{"role": "user", "content": f"hi {i}"}],
                  extra_headers={"x-session-id": session})
        if stream:
            assert list(client.chat.completions.create(stream=True, **kw))
        else:
            client.chat.completions.create(**kw)
        r = proxy.get(f"/ctx/v1/sessions/{session}", headers={"authorization": f"Bearer {key}"}, timeout=5)
        assert r.status_code == 200, r.text
        assert len(r.json()["requests"]) == 1
        assert get(proxy, "/ctx/v1/stats", key)["totals"]["all"]["requests"] == i
    assert 'ctxproxy_requests_total{model="gpt-4o",route="default",status="200"} 2.0' in \
        proxy.get("/metrics").text


def test_an_unknown_session_is_not_found_for_whoever_asks(proxy):
    r = proxy.get("/ctx/v1/sessions/nope", headers={"authorization": "Bearer sk-someone"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "no session 'nope' for this API key"
    r = proxy.get("/ctx/v1/sessions/nope", headers={"x-ctx-admin-token": "s3cret"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "no session 'nope' recorded by this proxy"
    assert "key" not in r.json()["error"]["message"]


def test_alignment_accounts_for_every_message_once():
    """Whatever the proxy did, each message sent and each client message is placed exactly once, in order."""
    import random

    from proxy.accounting.figures import align
    from proxy.rewrite.marks import legacy_kind

    def msg(text: str) -> dict:
        return {"role": "tool", "tool_call_id": "x", "content": text}

    rng = random.Random(7)
    for _trial in range(300):
        n = rng.randint(0, 30)
        client = [bytes([rng.randint(0, 5)]) for _ in range(n)]  # many equal messages on purpose
        sent, messages = [], []
        for i, d in enumerate(client):
            what = rng.random()
            if what < 0.15:
                continue  # left out (or folded into the summary before it)
            if what < 0.35:
                sent.append(b"p%d" % i)
                messages.append(msg(rng.choice(["[ctxproxy: tool result of bash stored whole (9 tokens, 1 lines, "
                                                "9 chars); showing", "[ctxproxy: cleared tool result of bash", "x"])))
            else:
                sent.append(d)
                messages.append(msg("client"))
            if rng.random() < 0.1:
                sent.append(b"s%d" % i)
                messages.append({"role": "user", "content": "<agent_status>\nturn: 1"})
        kinds = [legacy_kind(CHAT.first_text(m)) for m in messages]
        segments = align(kinds.__getitem__, client, sent)
        placed_sent, placed_client = [], []
        for seg in segments:
            if seg[0] == "c":
                placed_client += range(seg[1], seg[2])
                placed_sent += range(len(placed_sent), len(placed_sent) + seg[2] - seg[1])
            elif seg[0] == "p":
                assert seg[1] == len(placed_sent)
                placed_sent.append(seg[1])
                placed_client += range(seg[3], seg[4])
            else:
                placed_client += range(seg[1], seg[2])
        assert placed_sent == list(range(len(sent))), (client, sent, segments)
        assert placed_client == list(range(len(client))), (client, sent, segments)
        pos = 0
        for seg in segments:  # a run is the client's messages exactly as sent
            if seg[0] == "c":
                assert sent[pos:pos + seg[2] - seg[1]] == client[seg[1]:seg[2]]
            pos += seg[2] - seg[1] if seg[0] == "c" else seg[0] == "p"


def test_usage_of_several_calls_is_summed_in_the_providers_spelling():
    from proxy.wire.usage import parse_usage, summed

    openai = [{"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
               "prompt_tokens_details": {"cached_tokens": 64}, "completion_tokens_details": {"reasoning_tokens": 2}},
              {"prompt_tokens": 130, "completion_tokens": 7, "total_tokens": 137,
               "prompt_tokens_details": {"cached_tokens": 96, "audio_tokens": None}}]
    assert summed(openai) == {"prompt_tokens": 230, "completion_tokens": 12, "total_tokens": 242,
                              "prompt_tokens_details": {"cached_tokens": 160, "audio_tokens": None},
                              "completion_tokens_details": {"reasoning_tokens": 2}}
    anthropic = [{"input_tokens": 10, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 0,
                  "output_tokens": 4}, {"input_tokens": 20, "cache_read_input_tokens": 1010,
                                        "cache_creation_input_tokens": 30, "output_tokens": 6}]
    u = parse_usage(summed(anthropic))
    assert (u.prompt, u.cached, u.cache_write, u.completion) == (2070, 2010, 30, 10)


def test_a_reworded_placeholder_moves_no_figure(proxy, upstream, monkeypatch):
    """What the proxy wrote is said by the transform that wrote it, never read back from its wording: placeholders
    worded otherwise than today are charged exactly as before (offload savings, placeholders in effect)."""
    import proxy.rewrite.offload as offload

    key = f"sk-{uuid.uuid4().hex[:8]}"
    before = crafted.drive(proxy, upstream, key, f"crafted-{uuid.uuid4().hex[:8]}")
    build = offload.build_placeholder
    monkeypatch.setattr(offload, "build_placeholder", lambda *a, **k: "Reworded: " + build(*a, **k))
    run = crafted.drive(proxy, upstream, f"sk-{uuid.uuid4().hex[:8]}", f"crafted-{uuid.uuid4().hex[:8]}")
    assert any(m["content"].startswith("Reworded: ") for m in upstream.requests[-1].json["messages"]
               if m["role"] == "tool")
    for was, now in zip(before.responses, run.responses):
        assert now.headers["x-ctxproxy-offloaded"] == was.headers["x-ctxproxy-offloaded"]
    assert [e.placeholders for e in run.expected] == [e.placeholders for e in before.expected]
    data = get(proxy, f"/ctx/v1/sessions/{run.session}", run.responses[0].request.headers["authorization"][7:])
    assert [e["saved_offload"] > 0 for e in data["requests"]] == [True, True, True]
