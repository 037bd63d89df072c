"""Every answer the proxy gives is counted, its own refusals included: per route, model and status, per session.

A request the proxy refuses before anything goes upstream (a body that is not
JSON, an unknown route, a body over the size limit, a path it does not serve)
is still a request the client made and an error it got: `/ctx/v1/stats`,
`/metrics` and, when the request names its session, `/ctx/v1/sessions/{id}` say so.
"""

from __future__ import annotations

import uuid

import pytest
from test_figures import metric

pytestmark = pytest.mark.proxy_config(server={"max_body_bytes": 4000})


def test_the_proxys_own_refusals_are_counted_everywhere(proxy, upstream):
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"bad-{uuid.uuid4().hex[:8]}"
    auth = {"authorization": f"Bearer {key}", "x-session-id": session}
    hi = [{"role": "user", "content": "hi"}]
    answers = [
        proxy.post("/v1/chat/completions", content=b"{not json", headers={**auth, "content-type": "application/json"}),
        proxy.post("/v1/chat/completions", json={"model": "gpt-4o"}, headers=auth),  # no messages
        proxy.post("/r/nowhere/v1/chat/completions", json={"model": "gpt-4o", "messages": hi}, headers=auth),
        proxy.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [
            {"role": "user", "content": "x" * 5000}]}, headers=auth),
        proxy.post("/v2/chat/completions", json={"model": "gpt-4o", "messages": hi}, headers=auth),
    ]
    assert [r.status_code for r in answers] == [400, 400, 404, 413, 404]
    assert not upstream.requests  # the proxy answered every one itself

    totals = proxy.get("/ctx/v1/stats", headers=auth).json()["totals"]["all"]
    assert totals["requests"] == totals["errors"] == 5 and totals["prompt"] == 0
    text = proxy.get("/metrics").text
    assert metric(text, "ctxproxy_requests_total", status="400") == 2
    assert metric(text, "ctxproxy_requests_total", status="404") == 2
    assert metric(text, "ctxproxy_requests_total", status="413") == 1
    assert metric(text, "ctxproxy_requests_total", route="default", model="gpt-4o", status="400") == 1
    assert 'route="nowhere"' not in text  # a route nobody configured is never a label

    data = proxy.get(f"/ctx/v1/sessions/{session}", headers=auth).json()
    assert [e["status"] for e in data["requests"]] == [400, 400, 404, 413, 404]
    assert [e["error"] for e in data["requests"]][:3] == ["invalid_json", "invalid_request",
                                                          "route_not_found"]
    assert data["summary"]["requests"] == data["summary"]["errors"] == 5


def test_a_refused_request_without_a_session_is_counted_without_one(proxy, upstream):
    key = f"sk-{uuid.uuid4().hex[:8]}"
    auth = {"authorization": f"Bearer {key}"}
    for _ in range(3):
        assert proxy.post("/v1/chat/completions", content=b"[", headers=auth).status_code == 400
    ok = proxy.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
                    headers=auth)
    assert ok.status_code == 200
    totals = proxy.get("/ctx/v1/stats", headers=auth).json()["totals"]["all"]
    assert (totals["requests"], totals["errors"]) == (4, 3)
    sessions = proxy.get("/ctx/v1/sessions", headers=auth).json()["sessions"]
    assert [s["requests"] for s in sessions] == [1]  # the refusals named no session: none was made up for them
