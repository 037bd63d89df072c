"""Browsers cannot drive a local proxy (proxy/http/local_guard.py).

A page the developer visits may POST to 127.0.0.1:8080 as text/plain, or open a
WebSocket to it, without a CORS preflight; a DNS-rebinding page reaches it under a
name of its own. Either would spend the key a route injects, or read every tenant's
sessions from the keyless loopback admin view. Agents, SDKs and curl send no
`Origin` and are unaffected; neither is a request bringing its own key.
"""

from __future__ import annotations

import http.server
import threading
import uuid
from pathlib import Path

import httpx
import pytest
from proxy_server import ProxyServer, make_settings
from test_dashboard import chromium, dump_dom  # noqa: F401 - the browser fixture
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from proxy.config import ServerSettings
from proxy.http.local_guard import names_proxy, origin_refusal

KEY_ENV = "CTX_TEST_GUARD_KEY"
INJECTED = "sk-operator-injected"
EVIL = "http://rebind.evil.example"
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def guarded(mock_upstream, tmp_path_factory):
    """A real server whose default route injects the operator's key (the case a page would abuse), and a route
    `own` that forwards the client's key; its admin view keyless on loopback (no admin token: the default)."""
    db = tmp_path_factory.mktemp("guard") / "g.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, INJECTED)
        cfg = make_settings(mock_upstream.base_url, f"sqlite:///{db}",
                            upstream={"base_url": mock_upstream.base_url, "api_key_env": KEY_ENV},
                            routes=[{"name": "own", "upstream": {"api_key_env": None}}],
                            server={"allowed_origins": ["http://localhost:5173"], "allowed_hosts": ["*.svc"]})
        with ProxyServer(cfg) as p:
            yield p


def _no_cors_grant(r: httpx.Response) -> None:
    assert not any(k.lower().startswith("access-control-") for k in r.headers), r.headers


# ---- the rules

def test_what_names_the_proxy():
    server = ServerSettings(host="10.0.0.5", allowed_hosts=("ctxproxy.team.svc", "*.internal"))
    for host in ("127.0.0.1:8080", "localhost", "LOCALHOST:80", "ctxproxy.localhost:8080", "[::1]:8080", "::1",
                 "10.0.0.5:8080", "192.168.1.9", "ctxproxy.team.svc", "a.internal:9", "localhost.", None):
        assert names_proxy(host, server), host
    for host in ("rebind.evil.example", "rebind.evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io",
                 "ctxproxy.team.svc.evil.example", ""):
        assert not names_proxy(host, server), host


def test_which_origins_may_call():
    server = ServerSettings(allowed_origins=("http://localhost:5173",))
    assert origin_refusal(None, "127.0.0.1:8080", server) is None  # agents, SDKs, curl
    assert origin_refusal("http://localhost:5173", "127.0.0.1:8080", server) is None
    assert origin_refusal("http://127.0.0.1:8080", "127.0.0.1:8080", server) is None  # the dashboard, same origin
    for origin, host in (("http://evil.example", "127.0.0.1:8080"), ("null", "127.0.0.1:8080"),
                         ("http://localhost:5174", "127.0.0.1:8080"), ("http://127.0.0.1:9999", "127.0.0.1:8080"),
                         (f"{EVIL}:8080", "rebind.evil.example:8080")):  # rebinding: same origin, foreign name
        err = origin_refusal(origin, host, server)
        assert err is not None and err.status == 403 and err.code == "origin_not_allowed", (origin, host)


def test_an_origin_setting_that_is_not_an_origin_is_refused_in_one_line():
    with pytest.raises(ValueError, match="not an origin"):
        ServerSettings(allowed_origins=("localhost:3000",))


# ---- over a real server

def test_a_cross_origin_post_never_reaches_the_provider(guarded, upstream):
    for ctype in ("text/plain", "application/json"):
        r = httpx.post(f"{guarded.url}/v1/chat/completions", content=httpx.Request("POST", "/", json=CHAT).content,
                       headers={"origin": EVIL, "content-type": ctype})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "origin_not_allowed"
        _no_cors_grant(r)
    r = httpx.post(f"{guarded.url}/v1/messages", json={"model": "claude", "max_tokens": 5, "messages": []},
                   headers={"origin": EVIL})
    assert r.status_code == 403 and r.json()["type"] == "error", r.text  # in the Messages API's shape
    assert upstream.requests == []


def test_a_cross_origin_websocket_is_refused_at_the_handshake(guarded, upstream):
    url = guarded.url.replace("http://", "ws://") + "/v1/responses"
    with pytest.raises(InvalidStatus) as refused:
        with connect(url, additional_headers={"origin": EVIL}):
            pass
    assert refused.value.response.status_code == 403
    assert b"origin_not_allowed" in refused.value.response.body
    assert upstream.requests == []


def test_a_rebinding_host_neither_reads_sessions_nor_spends_the_key(guarded, upstream):
    ok = httpx.post(f"{guarded.url}/v1/chat/completions", json=CHAT)  # an agent on loopback: served
    assert ok.status_code == 200, ok.text
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {INJECTED}"
    seen = len(upstream.requests)
    host = {"host": "rebind.evil.example:8080"}
    r = httpx.get(f"{guarded.url}/ctx/v1/sessions", headers=host)
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", r.text
    assert httpx.get(f"{guarded.url}/ctx/v1/sessions").status_code == 200  # the developer's own view
    r = httpx.post(f"{guarded.url}/v1/chat/completions", json=CHAT, headers=host)
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", r.text
    r = httpx.get(f"{guarded.url}/v1/models", headers=host)  # the passthrough injects the key as well
    assert r.status_code == 403, r.text
    assert len(upstream.requests) == seen
    # a name the operator listed is the proxy's; a request bringing its own key is trusted for the key
    assert httpx.post(f"{guarded.url}/v1/chat/completions", json=CHAT,
                      headers={"host": "ctxproxy.team.svc"}).status_code == 200
    r = httpx.post(f"{guarded.url}/r/own/v1/chat/completions", json=CHAT,
                   headers={**host, "authorization": "Bearer sk-client-own"})
    assert r.status_code == 200, r.text
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-client-own"


def test_an_allowed_origin_is_served(guarded, upstream):
    r = httpx.post(f"{guarded.url}/v1/chat/completions", json=CHAT, headers={"origin": "http://localhost:5173/"})
    assert r.status_code == 200, r.text


# ---- a real browser

_PAGE = """<!doctype html><html><head><title>page</title></head><body><pre id="out">waiting</pre><script>
const proxy = "%(proxy)s", out = [];
const say = (k, v) => { out.push(k + "=" + v); document.getElementById("out").textContent = out.join(" "); };
fetch(proxy + "/v1/chat/completions", {method: "POST", headers: {"content-type": "text/plain"},
      body: JSON.stringify(%(chat)s)})
  .then(r => r.text().then(t => say("turn", "read:" + r.status + ":" + t.slice(0, 40))))
  .catch(e => say("turn", "blocked"));
fetch(proxy + "/ctx/v1/sessions").then(r => r.text().then(t => say("sessions", "read:" + t.slice(0, 40))))
  .catch(e => say("sessions", "blocked"));
const ws = new WebSocket(proxy.replace("http", "ws") + "/v1/responses");
ws.onopen = () => { say("ws", "open"); ws.send(JSON.stringify({type: "response.create", ...%(chat)s})); };
ws.onmessage = m => say("wsmsg", m.data.slice(0, 40));
ws.onerror = () => say("ws", "error");
</script></body></html>"""


class _Page(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: object) -> None:
        pass


def test_a_page_on_another_origin_can_neither_complete_a_turn_nor_read_ctx(guarded, upstream, chromium,  # noqa: F811
                                                                           tmp_path: Path):
    """Headless Chromium loads a page from another origin (another port of 127.0.0.1) that tries what the issue's
    probe did: a text/plain POST of a turn, a read of /ctx/v1/sessions, a WebSocket turn."""
    import json

    chat = {**CHAT, "messages": [{"role": "user", "content": f"from a page {uuid.uuid4().hex}"}]}
    _Page.page = (_PAGE % {"proxy": guarded.url, "chat": json.dumps(chat)}).encode()
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        dom = dump_dom(chromium, f"http://127.0.0.1:{site.server_address[1]}/", tmp_path)
    finally:
        site.shutdown()
    out = dom.split('id="out">', 1)[1].split("<", 1)[0]
    assert "turn=blocked" in out and "sessions=blocked" in out and "ws=error" in out, out
    assert "ws=open" not in out and "wsmsg" not in out and "read:" not in out, out
    assert upstream.requests == []
