"""No password from a URL is ever printed or logged: `ctxproxy check`, serve's startup line, logs, errors."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import test_serve
from cli_main import run_side_by_side

from proxy.logs import JsonFormatter
from proxy.redact import redact

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-PASSWORD"


def _env(env: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    return {**base, "PYTHONPATH": str(ROOT), **(env or {})}


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=_env(env), stdin=subprocess.DEVNULL)


def test_redact_masks_passwords_and_keeps_the_rest():
    assert redact(f"redis://:{SECRET}@host:6379/0") == "redis://:***@host:6379/0"
    assert redact(f"https://user:{SECRET}@api.example.com/v1") == "https://user:***@api.example.com/v1"
    assert redact(f"rediss://default:p@{SECRET}@h:6380") == "rediss://default:***@h:6380"  # unescaped '@'
    assert redact("https://ghp_TOKEN@github.com/x") == "https://***@github.com/x"  # a token as user name
    plain = 'mail me at a@b.com, see https://example.com/a@b and {"u": "http://h/x"}'
    assert redact(plain) == plain


def test_check_prints_store_and_upstream_urls_without_passwords(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"store": f"redis://:{SECRET}@127.0.0.1:6379/0",
                               "routes": [{"name": "r", "upstream": {"base_url": "http://127.0.0.1:9/v1"}}]}))
    r = run("check", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout + r.stderr
    assert "store: redis://:***@127.0.0.1:6379/0" in r.stdout


def test_check_never_prints_an_upstream_password_accepted_or_refused(tmp_path):
    configs = []
    for i, base_url in enumerate((f"https://user:{SECRET}@api.example.com/v1",
                                  f"ftp://user:{SECRET}@api.example.com/v1")):
        configs.append(tmp_path / f"c{i}.yaml")
        configs[-1].write_text(json.dumps({"upstream": {"base_url": base_url}}))
    for r in run_side_by_side(*([sys.executable, "-m", "proxy.cli", "check", "--config", str(c)] for c in configs),
                              cwd=ROOT, env=_env()):
        assert SECRET not in r.stdout + r.stderr, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        # Credentials in an upstream URL are refused (test_tenancy_and_paths); the refusal names the key only.
        assert r.returncode == 2 and "upstream.base_url" in r.stderr


def test_stats_errors_do_not_print_the_url_password():
    r = run("stats", "--url", f"http://admin:{SECRET}@127.0.0.1:1")
    assert r.returncode == 1 and SECRET not in r.stderr and "admin:***@127.0.0.1:1" in r.stderr


def test_serve_startup_line_and_logs_show_the_store_without_its_password(tmp_path, upstream):
    store = f"redis://:{SECRET}@127.0.0.1:6379/15"
    s = test_serve.serve(tmp_path, {"CTXPROXY_UPSTREAM": upstream.base_url, "CTXPROXY_STORE": store})
    try:
        r = httpx.post(s.url + "/v1/chat/completions", headers={"authorization": "Bearer k"}, timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and SECRET not in r.text
    finally:
        test_serve.stop(s)
    text = s.log.read_text()
    assert SECRET not in text
    start = next(line for line in s.log_lines() if line["msg"] == "ctxproxy starting")
    assert start["store"] == "redis://:***@127.0.0.1:6379/15"
    assert start["routes"] == {"default": upstream.base_url}


def test_log_lines_mask_url_passwords_in_messages_fields_and_tracebacks():
    try:
        raise ConnectionError(f"cannot reach redis://:{SECRET}@10.0.0.1:6379/0")
    except ConnectionError:
        record = logging.LogRecord("ctxproxy", logging.ERROR, __file__, 1, f"store http://u:{SECRET}@h down",
                                   None, sys.exc_info())
    record.fields = {"store": f"redis://:{SECRET}@10.0.0.1:6379/0"}
    line = JsonFormatter().format(record)
    assert SECRET not in line
    out = json.loads(line)
    assert out["msg"] == "store http://u:***@h down" and out["store"] == "redis://:***@10.0.0.1:6379/0"
    assert "redis://:***@10.0.0.1:6379/0" in out["exc"]


# A password the old pattern (RFC 3986 userinfo characters) did not reach: '^', '{', '}', '"', '\'; a sentinel
# password in the query, which it never looked at.
ODD = 'pa^{ss}"wo\\rd'
ODD2 = "sent^{inel}pw"


def _no_odd_secret(text: str) -> None:
    for s in (ODD, ODD2, json.dumps(ODD)[1:-1], "ss}", "inel}"):
        assert s not in text, (s, text)


def test_check_online_and_offline_never_print_an_odd_store_password():
    store = f"redis://:{ODD}@127.0.0.1:1/0?sentinel_password={ODD2}"  # port 1: refused, the store is down
    offline, online = run_side_by_side(*([sys.executable, "-m", "proxy.cli", "check", *extra]
                                         for extra in (["--offline"], [])),
                                       cwd=ROOT, env=_env({"CTXPROXY_STORE": store}))
    assert offline.returncode == 0 and online.returncode == 1, (offline.stderr, online.stderr)
    assert "store: redis://:***@127.0.0.1:1/0?sentinel_password=***: UNREACHABLE" in online.stdout
    for r in (offline, online):
        _no_odd_secret(r.stdout + r.stderr)


def test_serve_with_a_dead_store_never_prints_an_odd_password(tmp_path, upstream):
    """The start-up line, `ctxproxy starting`, and the store-unavailable warning (at start and after /readyz)."""
    store = f"redis://user:{ODD}@127.0.0.1:1/0?sentinel_password={ODD2}"
    out, log = tmp_path / "out.txt", tmp_path / "proxy.log"
    port = test_serve.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port)], cwd=tmp_path,
                            env=_env({"CTXPROXY_UPSTREAM": upstream.base_url, "CTXPROXY_STORE": store}),
                            stdout=out.open("w"), stderr=log.open("w"))
    s = test_serve.Served(proc, f"http://127.0.0.1:{port}", log)
    try:
        for _ in range(300):
            try:
                if httpx.get(s.url + "/readyz", timeout=1).status_code == 503:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
    finally:
        test_serve.stop(s)
    _no_odd_secret(out.read_text() + log.read_text())
    assert "store: redis://user:***@127.0.0.1:1/0?sentinel_password=***" in out.read_text()
    lines = s.log_lines()
    start = next(line for line in lines if line["msg"] == "ctxproxy starting")
    assert start["store"] == "redis://user:***@127.0.0.1:1/0?sentinel_password=***"
    down = next(line for line in lines if line["msg"].startswith("store unavailable"))
    assert down["store"] == start["store"]
