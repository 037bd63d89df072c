"""A transform that fails, for any reason, never fails the agent's request: it goes upstream as sent."""

from __future__ import annotations

import orjson
import pytest
from agent_runs import TOOLS, conversation


@pytest.mark.parametrize("transform", ["offload", "compress", "context_read", "status_bar", "cache_hints"])
def test_a_failing_transform_forwards_the_request_unmodified(proxy, upstream, transform, monkeypatch):
    target = next(t for t in proxy.state.pipelines["default"] if t.name == transform)

    async def broken(conv, ctx):  # noqa: ANN001, ANN202
        raise RuntimeError("a bug in a transform")

    monkeypatch.setattr(target, "restore" if hasattr(target, "restore") else "apply", broken)
    raw = orjson.dumps({"model": "gpt-4o", "messages": conversation(3), "tools": TOOLS})
    r = proxy.post("/v1/chat/completions", content=raw,
                   headers={"content-type": "application/json", "authorization": "Bearer k"})
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-degraded"] == transform
    assert upstream.requests[-1].body == raw  # the client's bytes, exactly
    metrics = proxy.get("/metrics").text
    assert any(line.startswith("ctxproxy_degraded_requests_total{") and line.endswith(" 1.0")
               for line in metrics.splitlines()), metrics[:2000]


@pytest.mark.parametrize("stream", [False, True])
def test_failing_accounting_never_fails_the_turn(proxy, upstream, monkeypatch, caplog, stream):
    """Accounting observes the request (proxy/request/flow.py): a bug in it is logged, and the agent gets its answer."""
    async def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("a bug in accounting")

    monkeypatch.setattr(proxy.state.accounting, "open", broken)
    raw = orjson.dumps({"model": "gpt-4o", "messages": conversation(3), "tools": TOOLS, "stream": stream})
    r = proxy.post("/v1/chat/completions", content=raw,
                   headers={"content-type": "application/json", "authorization": "Bearer k"})
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 1 and "x-ctxproxy-request-id" in r.headers
    assert any(rec.getMessage() == "observer failed" for rec in caplog.records)
