"""A store problem is said out loud: `ctxproxy check` asks the store and fails in one line when it does not answer,
`serve` warns at start (and still serves, forwarding unmodified), and the log says when the store goes down and
when it answers again, once each, never per request."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import test_serve

from proxy.store import SqliteStore, StoreError
from proxy.store.guarded import GuardedStore

ROOT = Path(__file__).resolve().parents[1]
DEAD_STORE = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def check(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    full.update({"PYTHONPATH": str(ROOT), **env})
    return subprocess.run([sys.executable, "-m", "proxy.cli", "check", *args], capture_output=True, text=True,
                          timeout=60, env=full, cwd=tmp_path)


def test_check_fails_in_one_line_when_the_store_does_not_answer(tmp_path, upstream):
    r = check(tmp_path, {"CTXPROXY_STORE": DEAD_STORE, "CTXPROXY_UPSTREAM": upstream.base_url})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"store: {DEAD_STORE}: UNREACHABLE" in r.stdout
    (line,) = r.stderr.splitlines()  # one line, nothing else (no log line of the probe either)
    assert line.startswith(f"ctxproxy: store {DEAD_STORE} is unreachable: ") and "connect" in line.lower()
    assert "route default" in r.stdout  # the rest of the report is still printed


def test_check_offline_asks_nothing(tmp_path, upstream):
    r = check(tmp_path, {"CTXPROXY_STORE": DEAD_STORE, "CTXPROXY_UPSTREAM": "http://127.0.0.1:1/v1"}, "--offline")
    assert r.returncode == 0, r.stderr
    assert f"store: {DEAD_STORE}: not asked (--offline)" in r.stdout and "UNREACHABLE" not in r.stdout


def test_check_asks_the_store_and_each_upstream(tmp_path, upstream):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"store: redis://127.0.0.1:6379/15\nupstream: {{base_url: {upstream.base_url}}}\n"
                   f"routes:\n  - name: gone\n    upstream: {{base_url: 'http://127.0.0.1:1/v1'}}\n")
    r = check(tmp_path, {}, "--config", str(cfg))
    assert r.returncode == 0, r.stderr  # a dead upstream is a warning: the store is what makes rewriting work
    assert "store: redis://127.0.0.1:6379/15: answers" in r.stdout
    gone, default = r.stdout.split("route gone:")[1].split("route default:")
    assert "upstream: UNREACHABLE (" in gone and "upstream: answers" in default
    assert "warning: route gone: upstream http://127.0.0.1:1/v1 is unreachable" in r.stderr


def test_check_never_creates_the_sqlite_file_and_names_a_missing_directory(tmp_path, upstream):
    env = {"CTXPROXY_UPSTREAM": upstream.base_url}
    r = check(tmp_path, {**env, "CTXPROXY_STORE": f"sqlite:///{tmp_path}/new.db"})
    assert r.returncode == 0 and "answers" in r.stdout.splitlines()[0] and not (tmp_path / "new.db").exists()
    r = check(tmp_path, {**env, "CTXPROXY_STORE": f"sqlite:///{tmp_path}/no/such/dir/x.db"})
    assert r.returncode == 1 and f"the directory {tmp_path}/no/such/dir does not exist" in r.stderr


def test_check_prints_each_routes_effective_window_and_thresholds(tmp_path, upstream):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"upstream: {{base_url: {upstream.base_url}}}\n"
                   "models: {my-local-model: {context_window: 32000}}\n"
                   "routes:\n  - name: local\n    match: {model: 'my-local-*'}\n    context_window: 32000\n"
                   "    offload: {tool_result_tokens: 50000}\n    compress: {keep_recent_tokens: 4000}\n")
    r = check(tmp_path, {}, "--offline", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "model windows, from models: my-local-model 32,000" in r.stdout and "gpt-4o* 128,000" in r.stdout
    local, default = r.stdout.split("route local:")[1].split("route default:")
    assert "window: 32,000 tokens" in local and "its models: my-local-model 32,000" in local
    # 50,000 asked, but a tool result never takes more than a quarter of the window: 8,000 is what applies
    assert "offload: tool results over 8,000 tokens, user messages over 16,000" in local
    assert "compress: trigger 75% (24,000 tokens), target 20% (6,400), newest 3,200 kept verbatim" in local
    assert "window: 128,000 tokens" in default and "tool results over 20,000 tokens" in default


def test_serve_warns_at_start_and_still_serves_unmodified_saying_it_once(tmp_path, upstream):
    s = test_serve.serve(tmp_path, {"CTXPROXY_UPSTREAM": upstream.base_url, "CTXPROXY_STORE": DEAD_STORE,
                                    "PYTHONPATH": str(ROOT)})
    try:
        for _ in range(3):
            r = httpx.post(s.url + "/v1/chat/completions", headers={"authorization": "Bearer k"}, timeout=10,
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                 "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
            assert r.status_code == 200 and r.headers["x-ctxproxy-degraded"] == "store-unavailable"
    finally:
        test_serve.stop(s)
    lines = s.log_lines()
    said = [x for x in lines if x["level"] == "warning" and x["msg"].startswith("store unavailable")]
    assert len(said) == 1 and said[0]["store"] == DEAD_STORE and "connect" in said[0]["reason"].lower()
    start = next(i for i, x in enumerate(lines) if x["msg"] == "ctxproxy starting")
    first_request = next(i for i, x in enumerate(lines) if x["msg"] == "request")
    assert start < lines.index(said[0]) < first_request  # said at start, before any request
    assert not [x for x in lines if "backing off" in x["msg"] or "forwarding unmodified" in x["msg"]]  # debug only
    assert all("degraded" in x["events"] for x in lines if x["msg"] == "request")  # each request says it


class _Switch:
    """A backend that is down or up as the test says."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner, self.down = inner, True

    async def get(self, key: str) -> bytes | None:
        if self.down:
            raise StoreError("redis get failed: ConnectionError: Connection refused")
        return await self.inner.get(key)

    async def close(self) -> None:
        await self.inner.close()


def test_going_down_and_coming_back_are_each_logged_once_at_warning(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="ctxproxy")
    backend = _Switch(SqliteStore(tmp_path / "s.db"))
    store = GuardedStore(backend, backoff=0, max_backoff=0, name="redis://example:6379/0")  # type: ignore[arg-type]

    async def calls(n: int) -> None:
        for _ in range(n):
            try:
                await store.get("t:a:x")
            except StoreError:
                pass

    async def run() -> None:
        await calls(5)  # the first fails and opens the breaker; each later one is a probe that fails too
        backend.down = False
        await calls(5)  # the first probe answers: the store is back
        backend.down = True
        await calls(2)
        await store.close()
    asyncio.run(run())
    said = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [("WARNING", "store unavailable"), ("WARNING", "store answering again"),
                    ("WARNING", "store unavailable")]
    down = next(r for r in caplog.records if r.getMessage().startswith("store unavailable"))
    assert down.fields["reason"] == "redis get failed: ConnectionError: Connection refused"
    assert down.fields["store"] == "redis://example:6379/0"


@pytest.mark.parametrize("ok", [True, False])
def test_readiness_tells_the_truth_and_a_failed_ping_is_said_once(tmp_path, caplog, ok):
    caplog.set_level(logging.WARNING, logger="ctxproxy")

    class Pinged(_Switch):
        async def ping(self) -> bool:
            return not self.down

    backend = Pinged(SqliteStore(tmp_path / "s.db"))
    backend.down = not ok
    store = GuardedStore(backend)  # type: ignore[arg-type]

    async def run() -> list[bool]:
        out = [await store.ping() for _ in range(3)]
        await store.close()
        return out
    assert asyncio.run(run()) == [ok] * 3
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == (0 if ok else 1)
