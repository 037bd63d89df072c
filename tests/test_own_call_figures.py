"""Every summary call the proxy makes is in the figures exactly once, whether or not a request uses its summary.

The provider bills a background summary (compress.precompute) when it answers it, not when a later request uses
it; a session's last request may start one that nothing uses, and an answer rejected as no summary is billed too.
The figures checked are the ones people read: /ctx/v1/stats, /metrics, and the session's timeline and summary;
the bill they are checked against is the mock provider's own record of each call's usage.
"""

from __future__ import annotations

import json
import uuid

from prometheus_client.parser import text_string_to_metric_families
from proxy_server import InProcessProxy
from test_compress import agent_run, big_settings, is_cached_shape, post, responder
from test_precompute import REDIS, TURNS, crossing, run_turns, settings, slow_summaries, summary_calls


def billed(upstream) -> tuple[int, int, int]:
    """(calls, prompt tokens, cached tokens) of the summary calls the mock answered, from its own record."""
    calls = [upstream.requests[i] for i in summary_calls(upstream)]
    assert all(c.status == 200 and c.usage for c in calls)
    return (len(calls), sum(c.usage["prompt_tokens"] for c in calls),
            sum(c.usage["prompt_tokens_details"]["cached_tokens"] for c in calls))


def billed_completion(upstream) -> int:
    """The completion tokens of the summary calls the mock answered (billed at the output price)."""
    return sum(upstream.requests[i].usage["completion_tokens"] for i in summary_calls(upstream))


def own_prompt_metric(proxy: InProcessProxy, name: str = "ctxproxy_own_prompt_tokens") -> float:
    r = proxy.get("/metrics")
    assert r.status_code == 200, r.text
    return sum(s.value for f in text_string_to_metric_families(r.text) if f.name == name
               for s in f.samples if s.name.endswith("_total"))


def figures(proxy: InProcessProxy, key: str, session: str) -> tuple[dict, dict, list[dict]]:
    """The tenant's all-time totals, the session's summary and its timeline."""
    auth = {"authorization": f"Bearer {key}"}
    stats = proxy.get("/ctx/v1/stats", headers=auth)
    assert stats.status_code == 200, stats.text
    s = proxy.get(f"/ctx/v1/sessions/{session}", headers=auth)
    assert s.status_code == 200, s.text
    return stats.json()["totals"]["all"], s.json()["summary"], s.json()["requests"]


def assert_counted_once(proxy: InProcessProxy, upstream, key: str, session: str, turns: int) -> None:
    calls, prompt, cached = billed(upstream)
    assert calls >= 1
    totals, summary, timeline = figures(proxy, key, session)
    assert (totals["own_calls"], totals["own_prompt"], totals["own_cached"]) == (calls, prompt, cached)
    assert (summary["own_calls"], summary["own_prompt"], summary["own_cached"]) == (calls, prompt, cached)
    own = [e for e in timeline if e.get("kind") == "summary"]
    assert len(own) == calls and sum(e["own_prompt"] for e in own) == prompt
    assert sum(e.get("own_prompt") or 0 for e in timeline) == prompt  # the turns carry none of it again
    turn_ids = {e["request_id"] for e in timeline if e.get("kind", "turn") == "turn"}
    assert len(turn_ids) == turns and all(e["started_by"] in turn_ids for e in own)
    assert totals["requests"] == summary["requests"] == turns  # an own call is no client request
    assert own_prompt_metric(proxy) == prompt
    completion = billed_completion(upstream)
    assert completion > 0 and totals["own_completion"] == summary["own_completion"] == completion
    assert sum(e["completion"] for e in own) == completion
    assert own_prompt_metric(proxy, "ctxproxy_own_completion_tokens") == completion


def test_a_background_summary_nobody_uses_is_counted_once(upstream, tmp_path):
    """The session's last request passes `precompute` and starts a summary; no request crosses the trigger."""
    slow_summaries(upstream)
    key = f"sk-{uuid.uuid4()}"
    run = agent_run(TURNS)
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/s.db", min_clear_tokens=100_000)) as p:
        turns = 0
        for i in range(4, len(run) + 1, 2):
            r = post(p, run[:i], key)
            assert r.status_code == 200, r.text
            assert "x-ctxproxy-compacted" not in r.headers
            turns += 1
            p.settle()  # the background summary answered and stored, as an agent thinking
            if summary_calls(upstream):
                break  # this was the session's last request: nothing will use the summary it started
        assert len(summary_calls(upstream)) == 1
        assert_counted_once(p, upstream, key, r.headers["x-ctxproxy-session"], turns)


def test_a_used_background_summary_is_counted_once_not_again_by_the_request_using_it(upstream, tmp_path):
    slow_summaries(upstream)
    key = f"sk-{uuid.uuid4()}"
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/u.db", min_clear_tokens=100_000)) as p:
        turns = run_turns([p], upstream, key, paced=True)
        (n,) = crossing(turns)
        assert turns[n][0].headers["x-ctxproxy-compacted"] == "summary"
        p.settle()
        assert_counted_once(p, upstream, key, turns[-1][0].headers["x-ctxproxy-session"], len(turns))


def test_a_summary_rejected_after_it_was_billed_is_counted(upstream, tmp_path):
    """Answered "ok": billed by the provider, refused as no summary by the proxy (the breaker opens)."""
    slow_summaries(upstream, answer="ok")
    key = f"sk-{uuid.uuid4()}"
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/r.db", min_clear_tokens=100_000)) as p:
        turns = run_turns([p], upstream, key, paced=True)
        assert turns[crossing(turns)[0]][0].headers["x-ctxproxy-compacted"] in ("clear", "archive")
        p.settle()
        assert_counted_once(p, upstream, key, turns[-1][0].headers["x-ctxproxy-session"], len(turns))


def test_two_replicas_on_one_store_count_the_one_summary_once(upstream):
    """The replica that claimed the span makes the call and accounts it; the other waits for it and counts none."""
    slow_summaries(upstream)
    key = f"sk-{uuid.uuid4()}"
    with InProcessProxy(settings(upstream, REDIS, min_clear_tokens=100_000)) as p1, \
            InProcessProxy(settings(upstream, REDIS, min_clear_tokens=100_000)) as p2:
        turns = run_turns([p1, p2], upstream, key, paced=False)
        p1.settle()
        p2.settle()
        assert len(summary_calls(upstream)) == 1
        calls, prompt, cached = billed(upstream)
        session = turns[-1][0].headers["x-ctxproxy-session"]
        for p in (p1, p2):  # either replica reads the shared figures
            totals, summary, timeline = figures(p, key, session)
            assert (totals["own_calls"], totals["own_prompt"], totals["own_cached"]) == (calls, prompt, cached)
            assert (summary["own_calls"], summary["own_prompt"]) == (calls, prompt)
            assert sum(e.get("own_prompt") or 0 for e in timeline) == prompt
        assert own_prompt_metric(p1) + own_prompt_metric(p2) == prompt  # each process's /metrics: its own calls
        assert totals["own_completion"] == billed_completion(upstream)


def test_a_summary_call_answered_with_a_tool_call_is_counted_beside_the_transcript_call_after_it(upstream, tmp_path):
    """The cached shape answered with a tool call (no summary: the transcript shape is tried next): both billed."""
    def stubborn(req: dict):
        if is_cached_shape(req):
            return {"tool_calls": [{"name": "bash", "arguments": json.dumps({"cmd": "ls"})}]}
        return responder(req)

    key = f"sk-{uuid.uuid4()}"
    with InProcessProxy(big_settings(upstream, f"sqlite:///{tmp_path}/t.db")) as p:
        run = agent_run(60)
        upstream.script(*[stubborn] * 400)
        rs = [post(p, run[:i], key) for i in range(4, len(run) + 1, 2)]
        assert all(r.status_code == 200 for r in rs)
        p.settle()
        shapes = [is_cached_shape(upstream.requests[i].json) for i in summary_calls(upstream)]
        assert shapes[:2] == [True, False]
        assert_counted_once(p, upstream, key, rs[-1].headers["x-ctxproxy-session"], len(rs))
