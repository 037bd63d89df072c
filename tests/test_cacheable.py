"""The cacheable prefix is measured against what the provider really cached; efficiency compares the two in its units.

Cacheable is what a request repeats byte for byte of an earlier prompt the
provider accepted, by the proxy's own count; cached is what the provider says
it served from its cache. Every session here has both known exactly: cached from
the mock provider (a real token-prefix comparison, tests/_mock_prompt.py),
cacheable recomputed from the bodies the mock received with the README's
counting rules (tests/crafted.py), without the proxy's code. Before these were
measured right, a turn with hidden read-back rounds summed the usage of every
call but the cacheable prefix of the first only, and a session whose requests
alternate between two models was measured against the other model's prompt:
cached ran far past cacheable, and the 100% clamp hid it.
"""

from __future__ import annotations

import re
import uuid

import crafted
import pytest
from agent_runs import TOOLS, conversation

HANDLE = re.compile(r'handle="(ctx_[0-9a-f]{20})"')

pytestmark = pytest.mark.proxy_config(models={crafted.MODEL: {"context_window": crafted.WINDOW}},
                                      defaults={**crafted.DEFAULTS, "status_bar": {"enabled": False}})


def shared(a: dict, b: dict) -> int:
    """Tokens of the longest prefix two chat bodies share (the tools, then whole messages), by the README's count."""
    if a.get("tools") != b.get("tools"):
        return 0
    n = 0
    while n < min(len(a["messages"]), len(b["messages"])) and a["messages"][n] == b["messages"][n]:
        n += 1
    return crafted.tool_tokens(b.get("tools")) + sum(map(crafted.message_tokens, b["messages"][:n]))


def cached(rq) -> int:
    return rq.usage["prompt_tokens_details"]["cached_tokens"]


def session_figures(proxy, key: str, session: str) -> tuple[list[dict], dict, dict]:
    auth = {"authorization": f"Bearer {key}"}
    data = proxy.get(f"/ctx/v1/sessions/{session}", headers=auth).json()
    return data["requests"], data["summary"], proxy.get("/ctx/v1/stats", headers=auth).json()["totals"]["all"]


def first_handle(body: dict) -> str:
    return next(h for m in body["messages"] for h in HANDLE.findall(str(m.get("content"))))


def test_hidden_read_rounds_count_their_cacheable_prefix_as_their_usage_is_counted(proxy, upstream):
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"rounds-{uuid.uuid4().hex[:8]}"
    upstream.windows[crafted.MODEL] = crafted.WINDOW
    read = [lambda body: {"tool_calls": [{"name": "context_read", "arguments": {"handle": first_handle(body)}}]},
            lambda body: {"tool_calls": [{"name": "context_read",
                                          "arguments": {"handle": first_handle(body), "offset": 40}}]}]
    upstream.script(*read, "worker 17 failed", "ok")
    client = proxy.openai("/v1", api_key=key, default_headers={"x-session-id": session})
    long_system = {"role": "system", "content": "You are a coding agent. " + "Check every claim twice. " * 250}
    first = [long_system, *crafted.requests()[0][1:]]  # a prefix long enough for the provider to cache
    turns = [first, first + [{"role": "assistant", "content": "worker 17 failed"}, {"role": "user", "content": "why?"}]]
    answers = [client.chat.completions.with_raw_response.create(model=crafted.MODEL, messages=m, tools=crafted.TOOLS)
               for m in turns]
    bodies = [rq.json for rq in upstream.requests]
    assert len(bodies) == 4  # turn 1: its call and two hidden rounds; turn 2: one call

    # turn 1: each hidden round repeats the whole prompt of the call before it; turn 2 repeats turn 1's first call
    want = [shared(bodies[0], bodies[1]) + shared(bodies[1], bodies[2]), shared(bodies[0], bodies[3])]
    assert want[0] == crafted.prompt_tokens(bodies[0]) + crafted.prompt_tokens(bodies[1])
    got = [cached(upstream.requests[1]) + cached(upstream.requests[2]), cached(upstream.requests[3])]
    assert got[0] > 0 and got[1] > 0

    timeline, summary, totals = session_figures(proxy, key, session)
    assert [e["cacheable"] for e in timeline] == want
    assert [e["cached"] for e in timeline] == got
    assert answers[0].headers["x-ctxproxy-cacheable-tokens"] == str(want[0])
    for row in (summary, totals):
        assert (row["cacheable"], row["cached"]) == (sum(want), sum(got))
        assert row["efficiency"] == round(sum(got) / row["cacheable_billed"], 4) <= 1  # in the provider's units


def test_a_session_alternating_two_models_is_measured_against_the_same_models_prompt(make_proxy, upstream):
    proxy = make_proxy(defaults={"status_bar": {"enabled": False}, "offload": {"enabled": False}})
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"two-models-{uuid.uuid4().hex[:8]}"
    client = proxy.openai("/v1", api_key=key, default_headers={"x-session-id": session})
    side = [{"role": "system", "content": "Write a five-word title."}, {"role": "user", "content": "Fix the test"}]
    main = [conversation(4), conversation(6)]
    sent = []
    for history in main:  # the agent's turn on gpt-4o, then a side request on gpt-4o-mini, as Claude Code does
        client.chat.completions.create(model="gpt-4o", messages=history, tools=TOOLS)
        sent.append(upstream.requests[-1].json)
        client.chat.completions.create(model="gpt-4o-mini", messages=side)
    timeline, summary, totals = session_figures(proxy, key, session)
    assert [e["model"] for e in timeline] == ["gpt-4o", "gpt-4o-mini"] * 2
    want = [0, 0, shared(sent[0], sent[1]), crafted.prompt_tokens({"messages": side})]
    assert [e["cacheable"] for e in timeline] == want
    assert [e["cached"] for e in timeline] == [cached(rq) for rq in upstream.requests]
    assert timeline[2]["break"] is None  # the side request broke nothing: it is another model's cache
    assert summary["efficiency"] == round(summary["cached"] / summary["cacheable_billed"], 4) <= 1


def test_a_new_session_can_reuse_the_prefix_another_session_of_the_tenant_opened(make_proxy, upstream):
    proxy = make_proxy(defaults={"status_bar": {"enabled": False}, "offload": {"enabled": False}})
    key = f"sk-{uuid.uuid4().hex[:8]}"
    client = proxy.openai("/v1", api_key=key)
    first, second = [{**m} for m in conversation(2)], conversation(3)
    first[1]["content"] = "Fix the failing test in tests/test_api.py"  # another task: a session of its own
    for history in (first, second):
        client.chat.completions.create(model="gpt-4o", messages=history, tools=TOOLS)
    a, b = (rq.json for rq in upstream.requests)
    sessions = proxy.get("/ctx/v1/sessions", headers={"authorization": f"Bearer {key}"}).json()["sessions"]
    assert len(sessions) == 2
    opened = next(s for s in sessions if s["cacheable"])
    assert opened["cacheable"] == shared(a, b) > 1024  # the tools and the system prompt both sessions carry
    assert opened["cached"] == cached(upstream.requests[1]) > 0


def test_a_prompt_the_provider_holds_is_not_measured(make_proxy, upstream):
    proxy = make_proxy(defaults={"status_bar": {"enabled": False}, "offload": {"enabled": False}})
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"held-{uuid.uuid4().hex[:8]}"
    client = proxy.openai("/v1", api_key=key, default_headers={"x-session-id": session})
    big = "You are a coding agent. " + "Be careful. " * 400
    one = client.responses.create(model="gpt-4o", instructions=big, input="Fix the failing test.")
    two = client.responses.with_raw_response.create(model="gpt-4o", instructions=big, input="And the next one.",
                                                    previous_response_id=one.id)
    timeline, summary, totals = session_figures(proxy, key, session)
    held = timeline[1]
    assert held["cached"] == upstream.requests[1].usage["input_tokens_details"]["cached_tokens"] > 0
    assert held["cacheable"] is None and held["break"] is None  # the history is the provider's: nothing to compare
    assert "x-ctxproxy-cacheable-tokens" not in two.headers
    for row in (summary, totals):  # what the provider served of a prompt the proxy never saw is not in the ratio
        assert row["cached"] == held["cached"] and row["measured_cached"] == 0 and row["efficiency"] is None
