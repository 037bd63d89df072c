"""Two workers of one proxy (two apps on one store, `server.workers: 2`), or two replicas on one Redis,
measure each request as one process would.

A session whose requests alternate between the workers — A, B, A — gets the
same timeline figures (the previous prompt each request is measured against,
its cacheable tokens, its break cause) as the same requests sent to a single
process: a worker must not measure against the trace of its own last request
of the session when the other worker has served a later one.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import crafted
from proxy_server import InProcessProxy, make_settings

FIGURES = ("previous", "cacheable", "break", "prompt", "sent_tokens", "offloaded", "compactions")


def _settings(upstream: Any, db: Path | str, workers: int) -> Any:
    store = db if isinstance(db, str) else f"sqlite:///{db}"
    return make_settings(upstream.base_url, store, server={"workers": workers},
                         models={crafted.MODEL: {"context_window": crafted.WINDOW}},
                         defaults={**crafted.DEFAULTS, "status_bar": {"enabled": False}})


def _timeline(proxies: list[InProcessProxy], upstream: Any) -> list[dict[str, Any]]:
    """The crafted session, request i to proxies[i % len]; each proxy's figures read (so written) after its turn."""
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"alternating-{uuid.uuid4().hex[:8]}"
    headers = {"authorization": f"Bearer {key}", "x-session-id": session}
    upstream.windows[crafted.MODEL] = crafted.WINDOW
    for i, msgs in enumerate([*crafted.requests(), crafted.requests()[2]]):
        p = proxies[i % len(proxies)]
        r = p.post("/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": crafted.MODEL, "messages": msgs, "tools": crafted.TOOLS})
        assert r.status_code == 200, r.text
        assert p.get(f"/ctx/v1/sessions/{session}", headers=headers).status_code == 200  # settles p's writes
    entries = proxies[0].get(f"/ctx/v1/sessions/{session}", headers=headers).json()["requests"]
    assert len(entries) == 4
    return [{k: e[k] for k in FIGURES} for e in entries]


def test_alternating_workers_measure_each_request_as_one_process_does(upstream, tmp_path):
    with InProcessProxy(_settings(upstream, tmp_path / "one.db", 1)) as alone:
        expected = _timeline([alone], upstream)
    shared = _settings(upstream, tmp_path / "two.db", 2)
    with InProcessProxy(shared) as a, InProcessProxy(shared) as b:
        got = _timeline([a, b], upstream)
    assert got == expected
    assert [e["previous"] > 0 for e in got] == [False, True, True, True]  # each measured against the one before


def test_replicas_on_redis_measure_each_request_as_one_process_does(upstream, tmp_path):
    """Two replicas on one Redis (one worker each) behind a load balancer: the same figures as one process."""
    with InProcessProxy(_settings(upstream, tmp_path / "one.db", 1)) as alone:
        expected = _timeline([alone], upstream)
    shared = _settings(upstream, "redis://127.0.0.1:6379/14", 1)
    with InProcessProxy(shared) as a, InProcessProxy(shared) as b:
        got = _timeline([a, b], upstream)
    assert got == expected
