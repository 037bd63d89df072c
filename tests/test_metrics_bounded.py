"""/metrics stays small and quick whatever model names clients make up, and never holds up other requests."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import orjson
import pytest

from proxy.accounting.metrics import MAX_OTHER_MODELS, ModelLabels

NAMES = 5_000


pytestmark = pytest.mark.proxy_config(real=True, models={"my-local-model": {"context_window": 32000}},
                                      routes=[{"name": "coding", "match": {"model": "coder-*"}}])


async def _send_all(url: str, models: list[str], connections: int = 8) -> list[int]:
    """POST one small chat request per model over a few keep-alive connections (a bare HTTP/1.1 client:
    thousands of requests in a test, the client must cost little next to the proxy)."""
    host, port = url.removeprefix("http://").split(":")
    queue = list(reversed(models))
    statuses: list[int] = []

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while queue:
                body = orjson.dumps({"model": queue.pop(), "messages": [{"role": "user", "content": "hi"}]})
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer sk-m\r\n"
                             b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                head = await reader.readuntil(b"\r\n\r\n")
                statuses.append(int(head.split(b" ", 2)[1]))
                length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length:"))
                await reader.readexactly(length)
        finally:
            writer.close()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return statuses


def healthz_times(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        while not stop.is_set():
            t0 = time.monotonic()
            assert c.get("/healthz").status_code == 200
            out.append(time.monotonic() - t0)
            time.sleep(0.02)


def test_five_thousand_made_up_models_keep_metrics_small(proxy, upstream):
    made_up = [f"attack-{i:05d}" for i in range(NAMES)]
    known = ["my-local-model", "gpt-4o", "coder-7b", "openai/gpt-4o-mini"]
    statuses = asyncio.run(_send_all(proxy.url, known + made_up))
    assert set(statuses) == {200}

    times: list[float] = []
    stop = threading.Event()
    pinger = threading.Thread(target=healthz_times, args=(proxy.url, stop, times))
    pinger.start()
    try:
        for _ in range(3):
            r = proxy.get("/metrics", timeout=60)
    finally:
        stop.set()
        pinger.join()
    text = r.text
    assert r.status_code == 200 and len(r.content) < 1_000_000, len(r.content)
    assert 'model="other"' in text
    for name in known:
        assert f'model="{name}"' in text
    assert len({line.split('model="attack-', 1)[1][:5] for line in text.splitlines() if 'model="attack-' in line}) \
        == MAX_OTHER_MODELS  # the first ones seen keep their name
    requests = [line for line in text.splitlines() if line.startswith("ctxproxy_requests_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in requests) == NAMES + len(known)  # nothing lost, only folded
    assert times and max(times) < 0.5, max(times)


def test_metrics_render_off_the_event_loop(proxy, upstream):
    def slow_render() -> bytes:
        time.sleep(1.5)  # a huge registry
        return b"# slow\n"
    proxy.state.metrics.render = slow_render
    times: list[float] = []
    stop = threading.Event()
    pinger = threading.Thread(target=healthz_times, args=(proxy.url, stop, times))
    pinger.start()
    try:
        r = proxy.get("/metrics", timeout=30)
    finally:
        stop.set()
        pinger.join()
    assert r.text == "# slow\n"
    assert len(times) >= 5 and max(times) < 0.5, times


def test_model_labels_fold_glob_matches_into_their_glob():
    labels = ModelLabels(models=["mine"], globs=["gpt-4o*"])
    assert labels("mine") == "mine" and labels(None) == "" and labels("x" * 500) == "other"
    names = [labels(f"gpt-4o-{i}") for i in range(1000)]
    assert len(set(names)) < 300 and names[-1] == "gpt-4o*" and names[0] == "gpt-4o-0"
    assert labels("gpt-4o-0") == "gpt-4o-0"  # a name once given a label keeps it
