"""/metrics stays small and quick whatever model names clients make up, and never holds up other requests."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import orjson
import pytest

from proxy.accounting.metrics import MAX_OTHER_MODELS, ModelLabels

NAMES = 12 * MAX_OTHER_MODELS  # well beyond the cap: 600 made-up names


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


def test_made_up_models_beyond_the_cap_keep_metrics_small(proxy, upstream):
    """Far more made-up names than the cap (NAMES, 12x MAX_OTHER_MODELS): the label set stays bounded.

    The bound is asserted exactly, as the number of distinct model labels, so a smaller flood
    than the old 5,000 shows it as surely: unbounded, every made-up name would be a label.
    """
    made_up = [f"attack-{i:05d}" for i in range(NAMES)]
    known = ["my-local-model", "gpt-4o", "coder-7b", "openai/gpt-4o-mini"]
    statuses = asyncio.run(_send_all(proxy.url, known + made_up))
    assert set(statuses) == {200}

    r = proxy.get("/metrics", timeout=60)
    text = r.text
    assert r.status_code == 200 and len(r.content) < 1_000_000, len(r.content)
    assert 'model="other"' in text
    for name in known:
        assert f'model="{name}"' in text
    assert len({line.split('model="attack-', 1)[1][:5] for line in text.splitlines() if 'model="attack-' in line}) \
        == MAX_OTHER_MODELS  # the first ones seen keep their name
    labels = {line.split('model="', 1)[1].split('"', 1)[0] for line in text.splitlines() if 'model="' in line}
    assert len(labels) <= len(known) + MAX_OTHER_MODELS + 1, sorted(labels)  # + "other"; "" for no model
    requests = [line for line in text.splitlines() if line.startswith("ctxproxy_requests_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in requests) == NAMES + len(known)  # nothing lost, only folded


def test_metrics_render_off_the_event_loop(proxy, upstream):
    """While /metrics renders (a huge registry), /healthz still answers: told by ordering, not timing.

    The render waits until a health check *sent after it started* has been answered. Were the
    render on the event loop, no such answer could come while it waits: it gives up (after
    10 s) and says so. The health checker records failures; the test re-raises them.
    """
    rendering, answered_meanwhile = threading.Event(), threading.Event()
    waited: list[bool] = []
    failures: list[str] = []

    def slow_render() -> bytes:
        rendering.set()
        waited.append(answered_meanwhile.wait(10))
        return b"# slow\n"

    def health_checks(stop: threading.Event) -> None:
        with httpx.Client(base_url=proxy.url, timeout=30) as c:
            while not stop.is_set():
                sent_during_render = rendering.is_set()
                try:
                    status = c.get("/healthz").status_code
                except httpx.HTTPError as exc:
                    failures.append(f"/healthz failed: {exc!r}")
                    return
                if status != 200:
                    failures.append(f"/healthz answered {status}")
                    return
                if sent_during_render:
                    answered_meanwhile.set()
                time.sleep(0.02)

    proxy.state.metrics.render = slow_render
    stop = threading.Event()
    checker = threading.Thread(target=health_checks, args=(stop,))
    checker.start()
    try:
        r = proxy.get("/metrics", timeout=30)
    finally:
        stop.set()
        checker.join(timeout=30)
    assert not failures, failures
    assert r.text == "# slow\n"
    assert waited == [True], "no /healthz answered while /metrics rendered: the render held the event loop"


def test_model_labels_fold_glob_matches_into_their_glob():
    labels = ModelLabels(models=["mine"], globs=["gpt-4o*"])
    assert labels("mine") == "mine" and labels(None) == "" and labels("x" * 500) == "other"
    names = [labels(f"gpt-4o-{i}") for i in range(1000)]
    assert len(set(names)) < 300 and names[-1] == "gpt-4o*" and names[0] == "gpt-4o-0"
    assert labels("gpt-4o-0") == "gpt-4o-0"  # a name once given a label keeps it
