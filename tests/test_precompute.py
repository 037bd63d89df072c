"""compress.precompute: the summary is written before the trigger is crossed, so the crossing request never waits.

The mock makes only summary calls slow (SLOW seconds); the agent's own calls answer at once. An agent
"thinks" between turns (`paced`: the client waits until the proxy has no work left, any summary call in
flight answered and stored, as a real agent waits for its model), which is the time a precompute has to
finish in. Whether a request waited for a summary is told from the order of the provider's requests (no
clock): a summary call sent before the crossing request was sent is one the crossing request did not wait for.
"""

from __future__ import annotations

import uuid

import httpx
from proxy_server import InProcessProxy
from test_compress import SUMMARY, agent_run, chat_requests, is_summary_call, post, responder
from test_compress import settings as compress_settings

SLOW = 0.15  # seconds every summary call takes: long enough that unpaced turns (~10 ms each) overtake it
REDIS = "redis://127.0.0.1:6379/14"
TURNS = 10  # agent_run(10) crosses the trigger once, at its 8th request (window 6,000, nothing clearable)
# A gap of a few turns between precompute and trigger: at the defaults' 0.03 (180 tokens of this window) one
# ~350-token turn goes from under precompute to over the trigger, so nothing would be written in advance.
GAP = {"trigger": 0.85, "precompute": 0.78}


def settings(upstream, store: str, **compress):
    return compress_settings(upstream, store, **{**GAP, **compress})


def slow_summaries(upstream, answer=responder) -> None:
    upstream.delay_for = lambda req: SLOW if isinstance(req, dict) and is_summary_call(req) else 0.0
    upstream.script(*[answer] * 400)


def summary_calls(upstream) -> list[int]:
    """Indexes in upstream.requests of the proxy's summary calls."""
    return [i for i, r in enumerate(upstream.requests) if isinstance(r.json, dict) and is_summary_call(r.json)]


def wait_for_summaries(proxy: InProcessProxy) -> None:
    """The agent thinks: until the proxy's background work (a summary call, its storing) is done."""
    proxy.settle()


def run_turns(proxies: list[InProcessProxy], upstream, key: str, paced: bool) -> list[tuple[httpx.Response, int, int]]:
    """Each turn sends the history so far (ending with a tool result), round robin over `proxies`.

    Returns (response, len(upstream.requests) before it was sent, len(upstream.requests) after) per turn."""
    run, out = agent_run(TURNS), []
    for n, i in enumerate(range(4, len(run) + 1, 2)):
        before = len(upstream.requests)
        r = post(proxies[n % len(proxies)], run[:i], key)
        out.append((r, before, len(upstream.requests)))
        assert r.status_code == 200, r.text
        if paced:
            wait_for_summaries(proxies[n % len(proxies)])
    return out


def crossing(turns: list[tuple[httpx.Response, int, int]]) -> list[int]:
    return [n for n, (r, _, _) in enumerate(turns) if "x-ctxproxy-compacted" in r.headers]


def test_the_crossing_request_does_not_wait_for_the_summary(upstream, tmp_path):
    """With precompute the compacting request is served at once; without, it waits the summary call out."""
    slow_summaries(upstream)
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/on.db", min_clear_tokens=100_000)) as p:
        on = run_turns([p], upstream, "sk-on", paced=True)
    (n,) = crossing(on)
    r, before, after = on[n]
    assert r.headers["x-ctxproxy-compacted"] == "summary"
    # the summary it used was asked for (and answered) before it was sent, and it is the one the provider sees
    (call,) = summary_calls(upstream)
    assert call < before and upstream.requests[call].status == 200
    assert after == before + 1  # the crossing request made no call but its own
    assert SUMMARY.splitlines()[1] in upstream.requests[-1].body.decode()

    upstream.reset()
    slow_summaries(upstream)
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/off.db", min_clear_tokens=100_000,
                              precompute=None)) as p:
        off = run_turns([p], upstream, "sk-off", paced=True)
    (n,) = crossing(off)
    r, before, after = off[n]
    assert r.headers["x-ctxproxy-compacted"] == "summary"
    (call,) = summary_calls(upstream)
    assert before <= call < after  # asked for, and waited out, while the crossing request was being served


def test_one_summary_call_per_compaction(upstream, tmp_path):
    """The crossing request uses the precomputed summary: no second, foreground call for the same compaction."""
    slow_summaries(upstream)
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000)) as p:
        run, sent = agent_run(24), []
        for i in range(4, len(run) + 1, 2):
            sent.append(len(upstream.requests))
            r = post(p, run[:i], "sk-once")
            assert r.status_code == 200, r.text
            if "x-ctxproxy-compacted" in r.headers:
                assert r.headers["x-ctxproxy-compacted"] == "summary"
                sent[-1] = -sent[-1] - 1  # marks a compacting turn
            wait_for_summaries(p)
    compacting = [-b - 1 for b in sent if b < 0]
    calls = summary_calls(upstream)
    assert len(compacting) >= 3 and len(calls) == len(compacting)
    # each compaction's call went out after the previous compaction, before the request that compacted was sent
    for prev, before in zip([-1, *compacting], compacting):
        assert sum(prev < c < before for c in calls) == 1, (calls, compacting)


def test_two_replicas_send_the_same_bytes_as_one_proxy(upstream, tmp_path):
    """The span is claimed in the store by the first request past `precompute`: a second replica waits for
    that summary instead of writing its own, so what goes upstream does not depend on which replica served
    which turn, nor on how fast the background call was (the replicas' client does not pace its turns)."""
    slow_summaries(upstream)
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/one.db", min_clear_tokens=100_000)) as p:
        one = run_turns([p], upstream, f"sk-{uuid.uuid4()}", paced=True)
    one_bodies = [r.body for r in chat_requests(upstream)]
    assert len(summary_calls(upstream)) == 1 and summary_calls(upstream)[0] < one[crossing(one)[0]][2]

    upstream.reset()
    slow_summaries(upstream)
    with InProcessProxy(settings(upstream, REDIS, min_clear_tokens=100_000)) as p1, \
            InProcessProxy(settings(upstream, REDIS, min_clear_tokens=100_000)) as p2:
        two = run_turns([p1, p2], upstream, f"sk-{uuid.uuid4()}", paced=False)
    (n,) = crossing(two)
    assert two[n][0].headers["x-ctxproxy-compacted"] == "summary"
    assert len(summary_calls(upstream)) == 1  # written in the background, on whichever replica claimed it
    assert [r.body for r in chat_requests(upstream)] == one_bodies


def test_a_rejected_precompute_trips_the_breaker_and_the_crossing_request_falls_back(upstream, tmp_path):
    """The background summary is answered "ok" (rejected): the breaker opens, and the crossing request falls back
    without a slow summary call of its own: at once when the agent paced its turns, after waiting out the one
    background call (not two) when it did not."""
    slow_summaries(upstream, answer="ok")
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/p.db", min_clear_tokens=100_000)) as p:
        turns = run_turns([p], upstream, "sk-rejected-paced", paced=True)
    (n,) = crossing(turns)
    r, before, after = turns[n]
    assert r.headers["x-ctxproxy-compacted"] in ("clear", "archive")
    assert summary_calls(upstream) and all(c < before for c in summary_calls(upstream))
    assert after == before + 1  # fell back at once: no summary call of its own

    upstream.reset()
    slow_summaries(upstream, answer="ok")
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/u.db", min_clear_tokens=100_000)) as p:
        turns = run_turns([p], upstream, "sk-rejected-unpaced", paced=False)
    (n,) = crossing(turns)
    r, before, after = turns[n]
    assert r.headers["x-ctxproxy-compacted"] in ("clear", "archive")
    # the one background call (which may go out just after the crossing request was sent), never a second
    assert len(summary_calls(upstream)) == 1
