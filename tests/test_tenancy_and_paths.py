"""Hostile input at the edges: credentials of any scheme are tenants, windows learned from errors stay the
learner's, paths stay inside the route's base path, and ill-formed input or config is a 4xx, never a 500."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import textwrap

import httpx
import pytest
from cli_main import run_main
from proxy_server import InProcessProxy, ProxyServer, make_settings
from test_compress import agent_run
from test_offload import HANDLE, TOOLS, big_log, history, offload_config, sent_messages

from proxy.config import ConfigError
from proxy.engine.routing import api_key_of, tenant_id
from proxy.store import open_store
from proxy.upstream.windows import LearnedWindows, overflow_limit

pytestmark = pytest.mark.proxy_config(**offload_config())


def basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# ---- every credential scheme is a tenant

@pytest.mark.parametrize("a,b", [
    (basic("alice", "one"), basic("bob", "two")),
    ({"authorization": "Digest username=alice"}, {"authorization": "Digest username=bob"}),
    ({"authorization": "Token aaa"}, {"authorization": "Token bbb"}),
    ({"x-goog-api-key": "k1"}, {"x-goog-api-key": "k2"}),
    ({"authorization": "Bearer same", "x-api-key": "k1"}, {"authorization": "Bearer same", "x-api-key": "k2"}),
])
def test_distinct_credentials_of_any_scheme_are_distinct_tenants(a, b):
    ta, tb = (tenant_id(api_key_of(h), "salt") for h in (a, b))
    assert ta != tb and "anonymous" not in (ta, tb)


def test_bearer_and_single_key_headers_keep_their_tenant_ids():
    """Stored data of existing users stays theirs: a lone key hashes as the key itself, as it always did."""
    assert api_key_of({"authorization": "Bearer sk-1"}) == "sk-1"
    assert api_key_of({"x-api-key": "sk-1"}) == "sk-1" == api_key_of({"api-key": "sk-1"})
    assert api_key_of({}) is None and api_key_of({"authorization": "Bearer "}) is None


def test_a_repeated_header_counts_by_its_first_value(proxy, upstream):
    """Two Authorization or X-Session-Id headers: the first names the tenant and the session, as always."""
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    headers = [("authorization", "Bearer sk-first"), ("authorization", "Bearer sk-second"),
               ("x-session-id", "first-session"), ("x-session-id", "second-session")]
    r = proxy.post("/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-session"] == "first-session"
    listed = proxy.get("/ctx/v1/sessions", headers={"authorization": "Bearer sk-first"}).json()
    assert "first-session" in json.dumps(listed)
    other = proxy.get("/ctx/v1/sessions", headers={"authorization": "Bearer sk-second"}).json()
    assert "first-session" not in json.dumps(other)


def test_basic_users_neither_share_sessions_nor_read_each_others_offloads(proxy, upstream):
    alice, bob = basic("alice", "pw-a"), basic("bob", "pw-b")
    body = {"model": "gpt-4o", "tools": TOOLS, "messages": history(big_log())}
    r = proxy.post("/v1/chat/completions", json=body, headers=alice, timeout=30)
    assert r.status_code == 200, r.text
    handle = HANDLE.search(sent_messages(upstream)[3]["content"]).group(1)
    assert proxy.get(f"/ctx/v1/blobs/{handle}", headers=alice).status_code == 200
    other = proxy.get(f"/ctx/v1/blobs/{handle}", headers=bob)
    assert other.status_code == 404 and other.json()["error"]["code"] == "handle_not_found"
    # The model of bob's request asks for alice's handle: "not found", nothing of hers.
    upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": handle}}]}, "done")
    proxy.post("/v1/chat/completions", headers=bob, timeout=30,
               json={"model": "gpt-4o", "tools": TOOLS, "messages": history("small")})
    answer = sent_messages(upstream)[-1]["content"]
    assert answer.startswith("error: no stored content") and "worker" not in answer
    # The same conversation from bob (storing the same text for himself) is bob's session, not alice's.
    r2 = proxy.post("/v1/chat/completions", json=body, headers=bob, timeout=30)
    assert r2.headers["x-ctxproxy-session"] != r.headers["x-ctxproxy-session"]
    anon = proxy.post("/v1/chat/completions", json=body, timeout=30)
    assert anon.headers["x-ctxproxy-session"] not in (r.headers["x-ctxproxy-session"],
                                                      r2.headers["x-ctxproxy-session"])


# ---- a window learned from an error is the learner's, genuine, and expires

def _overflow(window: int, requested: int, code: str | None = "context_length_exceeded", message: str | None = None):
    return {"error": {"message": message or f"This model's maximum context length is {window} tokens. However, "
                      f"your messages resulted in {requested} tokens. Please reduce the length of the messages.",
                      "type": "invalid_request_error", "param": "messages", "code": code}}


@pytest.fixture
def compressing(upstream, tmp_path):
    cfg = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/w.db",
                        defaults={"offload": {"enabled": False}, "status_bar": {"enabled": False},
                                  "compress": {"keep_recent_tokens": 300}})
    with InProcessProxy(cfg) as p:
        yield p


def _ask(p: InProcessProxy, key: str, messages: list[dict]) -> httpx.Response:
    return p.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "local-coder", "messages": messages, "tools": TOOLS})


def _sent(upstream) -> bytes:
    return upstream.requests[-1].body


def test_one_tenants_overflow_does_not_shrink_another_tenants_requests(compressing, upstream):
    msgs = agent_run(8)
    upstream.fail_next(400, _overflow(1500, 3000))
    first = _ask(compressing, "sk-a", msgs)
    assert first.status_code == 200 and first.headers["x-ctxproxy-window-learned"] == "1500"
    upstream.reset()
    other = _ask(compressing, "sk-b", msgs)
    assert other.status_code == 200 and "x-ctxproxy-compacted" not in other.headers
    assert json.loads(_sent(upstream))["messages"] == msgs  # tenant b's request went as sent
    upstream.reset()
    again = _ask(compressing, "sk-a", msgs)  # the learner itself keeps what it learned
    assert again.status_code == 200 and again.headers["x-ctxproxy-compaction"] == "1"  # its compaction replayed
    assert len(json.loads(_sent(upstream))["messages"]) < len(msgs)


@pytest.mark.parametrize("error", [
    # A provider echoing the client's own text back inside some other error.
    _overflow(207, 3000, code="invalid_value", message="Invalid value for 'metadata': 'the maximum context length "
              "is 207 tokens' is not an object"),
    # A genuine code, but a window no smaller than the prompt it says it rejected.
    _overflow(5000, 3000),
    # A genuine code, but a window far above anything the proxy sent: not what rejected this prompt.
    _overflow(90_000, 120_000),
])
def test_only_a_genuine_overflow_below_the_rejected_prompt_is_learned(compressing, upstream, error):
    msgs = agent_run(8)
    upstream.fail_next(400, error)
    r = _ask(compressing, "sk-a", msgs)
    assert r.status_code == 400 and "x-ctxproxy-window-learned" not in r.headers
    assert r.json() == error  # the client gets the provider's answer as it was
    upstream.reset()
    assert _ask(compressing, "sk-a", msgs).status_code == 200
    assert json.loads(_sent(upstream))["messages"] == msgs


@pytest.mark.parametrize("body,sent,expected", [
    (_overflow(4000, 6000), 5000, 4000),
    (_overflow(4000, 6000, code=None), 5000, 4000),  # vLLM: no code, the provider's own opening words
    ({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}}, 5000, 4096),  # llama.cpp
    ({"error": {"code": 400, "message": "x", "type": "exceed_context_size_error", "n_prompt_tokens": 4000,
                "n_ctx": 4096}}, 5000, None),
    (_overflow(4000, 6000, code=None, message="Your text: This model's maximum context length is 4000 tokens"),
     5000, None),
    (b"<html>maximum context length is 10 tokens</html>", 5000, None),
])
def test_overflow_limit_reads_genuine_errors_only(body, sent, expected):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert overflow_limit(raw, sent) == expected


async def test_learned_windows_are_per_tenant_and_expire(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/lw.db")
    try:
        windows = LearnedWindows(store, ttl=0.3)
        await windows.learn("ta", "default", "m", 4000)
        assert await windows.get("ta", "default", "m") == 4000
        assert await windows.get("tb", "default", "m") is None
        fresh = LearnedWindows(store, ttl=0.3)  # another replica, or after a restart
        assert await fresh.get("ta", "default", "m") == 4000
        await asyncio.sleep(0.5)
        assert await windows.get("ta", "default", "m") is None
        assert await LearnedWindows(store, ttl=0.3).get("ta", "default", "m") is None
    finally:
        await store.close()


# ---- no 500 from client input or config

@pytest.mark.parametrize("tool", [
    {"type": "function", "function": None},
    {"type": "function", "function": "bash"},
    {"type": "function", "function": ["bash"]},
])
def test_ill_formed_tool_definitions_get_400(proxy, upstream, tool):
    r = proxy.post("/v1/chat/completions", headers={"authorization": "Bearer k"},
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[0].function"
    assert upstream.requests == []


def _raw_request(url: str, target: str) -> int:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\n"
                  "Connection: close\r\n\r\n".encode())
        status = s.recv(4096).split(b"\r\n", 1)[0]
    return int(status.split()[1])


@pytest.fixture(scope="module")
def served(mock_upstream, tmp_path_factory):
    """The raw request line is the subject (a client library would not send it): a real server, one for the
    module's path tests, which only send requests that are refused or read /v1/models."""
    db = tmp_path_factory.mktemp("served") / "c.db"
    with ProxyServer(make_settings(mock_upstream.base_url, f"sqlite:///{db}", **offload_config())) as p:
        yield p


@pytest.mark.parametrize("prefix", ["/v1/models", "/r/default/v1/"])
@pytest.mark.parametrize("bad", ["%00", "%09", "%7f", "%1b", "a%00b/c"])
def test_control_characters_in_the_path_get_400(served, upstream, prefix, bad):
    assert _raw_request(served.url, prefix + bad) == 400
    assert upstream.requests == []
    assert served.get("/healthz").status_code == 200


def test_userinfo_in_an_upstream_base_url_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"routes\[0\]\.upstream\.base_url.*credentials"):
        make_settings("http://127.0.0.1:1/v1", "sqlite:///x.db",
                      routes=[{"name": "r", "upstream": {"base_url": "http://user:s3cret@127.0.0.1:1/v1"}}])
    f = tmp_path / "c.yaml"
    f.write_text(textwrap.dedent("""
        routes:
          - name: coding
            upstream: {base_url: "https://user:s3cret@llm.example/v1"}
    """))
    r = run_main("check", "--config", str(f))  # the process: test_redaction.py, a password in `upstream`
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "routes[0].upstream.base_url" in r.stderr and "s3cret" not in r.stderr + r.stdout


# ---- clients stay inside the route's base path

@pytest.fixture(scope="module")
def keyed(mock_upstream, tmp_path_factory):
    """A route whose upstream key the proxy injects: climbing out of its base path would carry that key.

    Raw request lines (a client library normalises dot segments): a real server, one for the module's tests
    of it (each gets the mock freshly reset through `upstream`). The key is read from the environment per request.
    """
    db = tmp_path_factory.mktemp("keyed") / "k.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTX_TEST_ROUTE_KEY", "sk-injected")
        cfg = make_settings(mock_upstream.base_url, f"sqlite:///{db}",
                            routes=[{"name": "team", "upstream": {"base_url": mock_upstream.base_url,
                                                                  "api_key_env": "CTX_TEST_ROUTE_KEY"}}])
        with ProxyServer(cfg) as p:
            yield p


@pytest.mark.parametrize("tail", [
    "%2e%2e/%2e%2e/x", "%2E%2E/x", ".%2e/x", "%2e./x", "../x", "../../x", "models/../../x", "./x",
    "models/%2e%2e%2f%2e%2e%2fx", "..%2fx",
])
def test_dot_segments_never_leave_the_base_path(keyed, upstream, tail):
    status = _raw_request(keyed.url, "/r/team/v1/" + tail)
    assert status in (400, 404)
    base = httpx.URL(upstream.base_url).path.rstrip("/")
    assert all(r.path.startswith(base + "/") for r in upstream.requests), [r.path for r in upstream.requests]
    assert all(".." not in r.path for r in upstream.requests)


def test_ordinary_paths_still_pass_through_unchanged(keyed, upstream):
    r = keyed.get("/r/team/v1/models", headers={"authorization": "Bearer k"})
    assert r.status_code == 200
    assert upstream.requests[-1].path.endswith("/v1/models")
