"""A session id the proxy accepts in X-Session-Id can be read back: over HTTP and with `ctxproxy stats --session`."""

from __future__ import annotations

import time
import uuid
from urllib.parse import quote

import httpx
import pytest
from proxy_server import InProcessProxy

from proxy import cli

ADMIN = {"x-ctx-admin-token": "s3cret"}


pytestmark = pytest.mark.proxy_config(env={"CTXPROXY_ADMIN_TOKEN": "s3cret"})


def recorded(p: InProcessProxy, path: str) -> httpx.Response:
    deadline = time.monotonic() + 10
    while True:  # accounting is written in the background
        r = p.get(path, headers=ADMIN)
        if r.status_code != 404 or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


@pytest.mark.parametrize("session", ["team/run-1", "a/b/../c", "..", "50%/done?x=1#frag"])
@pytest.mark.proxy_config(real=True)  # `ctxproxy stats --url` asks over a socket
def test_a_session_id_with_slashes_reads_back(proxy, upstream, session, capsys, monkeypatch):
    session = session.replace("run-1", f"run-{uuid.uuid4().hex[:6]}")
    r = proxy.post("/v1/chat/completions",
                   headers={"authorization": "Bearer sk-ids", "x-session-id": session},
                   json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.headers["x-ctxproxy-session"] == session
    got = recorded(proxy, "/ctx/v1/sessions/" + quote(session, safe="").replace(".", "%2E"))
    assert got.status_code == 200, got.text
    assert got.json()["session"] == session and len(got.json()["requests"]) == 1
    # the way `ctxproxy stats --session` asks: its main, in process (tests/test_cli_stats.py runs it as
    # a subprocess, as users do; here the subject is the id's round trip, not the process)
    monkeypatch.setenv("CTXPROXY_ADMIN_TOKEN", "s3cret")
    capsys.readouterr()
    cli.main(["stats", "--url", proxy.url, "--session", session])  # a failure raises SystemExit(1)
    out = capsys.readouterr()
    assert out.out.startswith(f"session {session}: route default, model gpt-4o, 1 requests"), out


def test_a_slash_in_the_path_itself_reaches_the_session(proxy, upstream):
    session = f"org/{uuid.uuid4().hex[:6]}/run"
    proxy.post("/v1/chat/completions", headers={"authorization": "Bearer sk-ids", "x-session-id": session},
               json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    got = recorded(proxy, "/ctx/v1/sessions/" + session)
    assert got.status_code == 200 and got.json()["session"] == session
    # No waiting for this one: it is meant to stay a 404 (recorded() would poll it for its whole deadline).
    missing = proxy.get("/ctx/v1/sessions/org/nope", headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
