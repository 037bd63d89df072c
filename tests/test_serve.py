"""`ctxproxy serve` as users run it: a real process, env configuration, JSON logs, clean stop; readiness in process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from cli_main import run_main

KEY = "sk-live-SECRET-never-logged"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def log_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]


def serve(tmp_path: Path, env_extra: dict[str, str], *args: str) -> Served:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    env.update(env_extra)
    log = tmp_path / "proxy.log"
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), *args],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return Served(proc, url, log)
        except httpx.TransportError:
            time.sleep(0.05)
        if proc.poll() is not None:
            raise AssertionError(f"ctxproxy serve exited: {log.read_text()}")
    proc.kill()
    raise AssertionError("ctxproxy serve did not become healthy")


def stop(s: Served) -> bool:
    """SIGTERM; True when the server shut down gracefully (uvicorn re-raises the signal after)."""
    s.proc.send_signal(signal.SIGTERM)
    code = s.proc.wait(timeout=30)
    return code in (0, -signal.SIGTERM) and "shutdown complete" in s.log.read_text()


def test_serve_on_embedded_default_with_env_upstream(tmp_path, upstream):
    s = serve(tmp_path, {"CTXPROXY_UPSTREAM": upstream.base_url})
    try:
        assert httpx.get(s.url + "/readyz").json()["store"] is True
        client = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0)
        upstream.script("hello from mock")
        out = client.chat.completions.create(model="gpt-4o-mini",
                                             messages=[{"role": "user", "content": "TOP-SECRET-CONTENT"}])
        assert out.choices[0].message.content == "hello from mock"
        assert "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="gpt-4o-mini", stream=True, messages=[{"role": "user", "content": "x"}]) if c.choices) == "ok"
    finally:
        assert stop(s)
    assert (tmp_path / "ctxproxy.db").exists()  # the embedded store, in the working directory
    text = s.log.read_text()
    assert KEY not in text and "TOP-SECRET-CONTENT" not in text
    requests = [line for line in s.log_lines() if line.get("msg") == "request"]
    assert len(requests) == 2
    first = requests[0]
    for field in ("request_id", "route", "model", "session", "status", "overhead_ms", "total_ms"):
        assert field in first, field
    assert first["status"] == 200 and first["model"] == "gpt-4o-mini" and first["route"] == "default"
    assert requests[1]["stream"] is True and "ttfb_ms" in requests[1]


@pytest.mark.parametrize("store,ready", [("redis://127.0.0.1:6379/15", True), ("redis://127.0.0.1:1/0", False)])
def test_readiness_follows_the_store_and_traffic_flows_regardless(make_proxy, store, ready):
    # The app's answer, in process: a store from CTXPROXY_STORE in a real process is test_redaction's serve test.
    p = make_proxy(store)
    r = p.get("/readyz", timeout=10)
    assert r.status_code == (200 if ready else 503) and r.json()["store"] is ready
    chat = p.post("/v1/chat/completions", headers={"authorization": "Bearer k"},
                  json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert chat.status_code == 200


def test_serve_with_missing_config_file_explains_in_one_line(tmp_path):
    r = run_main("serve", "--config", str(tmp_path / "nope.yaml"))  # it stops before serving: main in process
    assert r.returncode == 2 and "config file not found" in r.stderr and "Traceback" not in r.stderr


def test_serve_says_in_one_line_where_requests_go_and_state_is_kept(tmp_path, upstream):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"upstream: {{base_url: '{upstream.base_url}'}}\nroutes:\n  - name: local\n"
                   f"    upstream: {{base_url: 'http://127.0.0.1:9/v1'}}\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--config", str(cfg)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert f"default -> {upstream.base_url}" in line and "local -> http://127.0.0.1:9/v1" in line
    assert "store: sqlite:///./ctxproxy.db" in line and f"config: {cfg}" in line and f":{port}" in line


def test_check_warns_about_an_upstream_without_a_version_path(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("routes:\n  - name: bare\n    upstream: {base_url: 'http://127.0.0.1:8000'}\n"
                   "  - name: azure\n    upstream: {base_url: 'https://x.example/openai/v1'}\n")
    r = run_main("check", "--offline", "--config", str(cfg))  # offline: these hosts are not asked
    assert r.returncode == 0
    warnings = [x for x in r.stderr.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and "route bare" in warnings[0] and "/v1" in warnings[0]
