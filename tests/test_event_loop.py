"""No request stalls the others: hostile content and hostile patterns never hold the event loop.

One client's 10 MB tool result of a single letter, or a model's catastrophic
regex in a read-back, must not delay anybody else's request: a `/healthz`
polled meanwhile answers at once. The bound is generous (0.5 s worst on a
loaded 2-core machine); before the work moved off the loop it was seconds.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from proxy_server import ProxyServer, make_settings

KEY = "sk-event-loop"
HANDLE = re.compile(r'context_read\(handle="(ctx_[0-9a-f]+)"')


def history(tool_text: str) -> list[dict]:
    return [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Look at the output."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "run"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_text}]


def post(proxy: ProxyServer, messages: list[dict]) -> httpx.Response:
    body = json.dumps({"model": "gpt-4o", "messages": messages}).encode()
    return proxy.post("/v1/chat/completions", content=body, timeout=120,
                      headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})


@contextlib.contextmanager
def healthz_polled(proxy: ProxyServer) -> Iterator[list[int]]:
    """Polls /healthz back to back while the block runs; yields [health checks answered during the block].

    A proxy that did the block's work on its event loop thread could answer none while that work ran (one
    at most, queued behind it). Told by counting, not by timing; a failed poll fails the test, here.
    """
    answered: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    count = [0]

    def poll() -> None:
        try:
            with httpx.Client(timeout=60) as c:
                while not stop.is_set():
                    r = c.get(proxy.url + "/healthz")
                    if r.status_code != 200:
                        raise AssertionError(f"/healthz answered {r.status_code}: {r.text[:200]}")
                    count[0] += 1
                    stop.wait(0.005)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            failures.append(e)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while count[0] < 2:  # polling has begun before the load starts
        assert thread.is_alive() and time.monotonic() < deadline, failures or "/healthz never answered"
        time.sleep(0.005)
    before = count[0]
    try:
        yield answered
    finally:
        answered.append(count[0] - before)
        stop.set()
        thread.join(timeout=60)
    if failures:
        raise failures[0]
    assert not thread.is_alive(), "the /healthz poller never finished"


def sent(upstream) -> list[dict]:
    return json.loads(upstream.requests[-1].body)["messages"]

pytestmark = pytest.mark.proxy_config(real=True)  # /healthz polled from another thread over a socket


@pytest.fixture
def small_proxy(upstream, tmp_path):
    """Offloads over 2,000 tokens, so a modest log is stored and readable back."""
    with ProxyServer(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db",
                                   defaults={"offload": {"tool_result_tokens": 2000}})) as p:
        yield p


def test_a_10mb_single_letter_tool_result_does_not_stall_healthz(proxy, upstream):
    messages = history("a" * 10_000_000)
    with healthz_polled(proxy) as latencies:
        r = post(proxy, messages)
    assert latencies[0] >= 3, latencies  # health checks answered while the request was being served
    assert r.status_code == 200 and r.headers["x-ctxproxy-offloaded"] == "1"
    preview = sent(upstream)[3]["content"]
    # A string this big is counted by a deterministic estimate (proxy/tokens/counter.py), and says so.
    assert preview.startswith("[ctxproxy: tool result of bash stored whole (~1,250,007 tokens, 1 lines, "
                              "10,000,000 chars)") and len(preview) < 1000


def test_a_10mb_result_of_ten_million_lines_does_not_stall_healthz(proxy, upstream):
    messages = history("\n" * 5_000_000 + "x\n" * 2_500_000)
    with healthz_polled(proxy) as latencies:
        r = post(proxy, messages)
    assert latencies[0] >= 3, latencies  # health checks answered while the request was being served
    assert r.status_code == 200 and r.headers["x-ctxproxy-offloaded"] == "1"
    assert "7,500,000 lines" in sent(upstream)[3]["content"]


def stored(proxy: ProxyServer, upstream, text: str) -> str:
    """Offload `text` through the proxy; its handle."""
    assert post(proxy, history(text)).status_code == 200
    return HANDLE.search(sent(upstream)[3]["content"]).group(1)


def read_back(proxy: ProxyServer, upstream, text: str, *calls: dict) -> list[str]:
    """The model calls context_read with each of `calls`, one round each; the answers it got."""
    upstream.script(*({"tool_calls": [{"name": "context_read", "arguments": c}]} for c in calls), "done")
    out = post(proxy, history(text))
    assert out.status_code == 200 and out.json()["choices"][0]["message"]["content"] == "done"
    return [m["content"] for m in sent(upstream)[4:] if m["role"] == "tool"]  # the history's own result is [3]


@pytest.mark.timeout(30)  # Python's re would take minutes here (seconds per line): that fails as a timeout
def test_a_catastrophic_pattern_is_answered_at_once_and_stalls_nobody(small_proxy, upstream):
    # Python's re needs seconds per line for (a+)+$ on these lines; RE2 is linear.
    text = "\n".join([f"2026-11-29 worker[{i}] processed item {i * 7919 % 100003}" for i in range(3000)]
                     + ["a" * 22 + "!"] * 10 + ["aaaa"])
    handle = stored(small_proxy, upstream, text)
    [answer] = read_back(small_proxy, upstream, text, {"handle": handle, "pattern": "(a+)+$"})
    assert small_proxy.get("/healthz").status_code == 200
    assert answer == f"[{handle}: 1 lines match '(a+)+$'; showing 1 from match 0]\n3010: aaaa"


@pytest.mark.parametrize("pattern", [r"worker(?=\[42\])", r"(?<!x)worker\[42\]", r"item (\d)\1"])
def test_lookaround_and_backreferences_get_a_clear_error(small_proxy, upstream, pattern):
    text = "\n".join(f"2026-11-29 worker[{i}] processed item {i * 7919 % 100003}" for i in range(3000))
    handle = stored(small_proxy, upstream, text)
    [answer] = read_back(small_proxy, upstream, text, {"handle": handle, "pattern": pattern})
    assert answer.startswith("error: pattern not supported: ") and "no backreferences or lookaround" in answer


def test_grep_and_paging_of_a_huge_stored_text_stay_bounded(proxy, upstream):
    text = "ab\n" * 3_000_000 + "needle\n" + "ab\n" * 300_000  # 10 MB, 3.3 million lines
    handle = stored(proxy, upstream, text)
    with healthz_polled(proxy) as latencies:
        every, needle, page = read_back(proxy, upstream, text, {"handle": handle, "pattern": "b"},
                                        {"handle": handle, "pattern": "^needle$"},
                                        {"handle": handle, "offset": 3_000_000, "limit": 2})
    assert latencies[0] >= 3, latencies  # health checks answered while the request was being served
    assert every.startswith(f"[{handle}: 100000+ lines match 'b'; showing 200 from match 0]\n0: ab\n1: ab\n")
    assert needle == f"[{handle}: 1 lines match '^needle$'; showing 1 from match 0]\n3000000: needle"
    assert page == f"[{handle}: lines 3000000-3000001 of 3300001; continue with offset=3000002]\nneedle\nab"
