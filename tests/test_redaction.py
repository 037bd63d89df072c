"""No password from a URL is ever printed or logged: `ctxproxy check`, serve's startup line, logs, errors."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
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
