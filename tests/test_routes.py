"""Route selection (path, header, model glob, default), per-route upstream keys, tenant and session ids."""

from __future__ import annotations

import os

import httpx
import pytest

from proxy.config import build_settings
from proxy.engine.routing import session_id, tenant_id
from proxy.request import Conversation
from proxy.wire.chat.codec import CHAT

pytestmark = pytest.mark.proxy_config(routes=[
    {"name": "coding", "match": {"model": "gpt-5*"}, "upstream": {"api_key_env": "CODING_KEY"}},
    {"name": "research", "match": {"model": "o3*"}},
])


@pytest.fixture(autouse=True)
def coding_key(monkeypatch):
    monkeypatch.setenv("CODING_KEY", "sk-injected-by-proxy")


def chat(p, path: str, model: str = "gpt-4o", headers: dict | None = None) -> httpx.Response:
    return p.post(path, json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                      headers={"authorization": "Bearer sk-client", **(headers or {})})


@pytest.mark.parametrize("path,model,headers,route", [
    ("/r/coding/v1/chat/completions", "gpt-4o", {}, "coding"),           # path beats model
    ("/r/research/v1/chat/completions", "gpt-5-mini", {"x-ctx-route": "coding"}, "research"),  # path beats header
    ("/v1/chat/completions", "gpt-4o", {"x-ctx-route": "research"}, "research"),
    ("/v1/chat/completions", "gpt-5-codex", {}, "coding"),
    ("/v1/chat/completions", "o3-mini", {}, "research"),
    ("/v1/chat/completions", "llama-3", {}, "default"),
])
def test_route_is_chosen_by_path_then_header_then_model(proxy, upstream, path, model, headers, route):
    r = chat(proxy, path, model, headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-route"] == route
    sent = upstream.requests[-1].headers
    expected_key = "sk-injected-by-proxy" if route == "coding" else "sk-client"
    assert sent["authorization"] == f"Bearer {expected_key}"
    assert "x-ctx-route" not in sent


def test_sdk_base_url_with_route_prefix(proxy, upstream):
    client = proxy.openai("/r/coding/v1", api_key="sk-client", max_retries=0)
    assert client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}]).choices
    assert [m.id for m in client.models.list()]
    assert all(r.headers["authorization"] == "Bearer sk-injected-by-proxy" for r in upstream.requests)


def test_unknown_route_is_404_openai_shaped(proxy, upstream):
    for r in (chat(proxy, "/r/nope/v1/chat/completions"),
              chat(proxy, "/v1/chat/completions", headers={"x-ctx-route": "nope"}),
              proxy.get("/r/nope/v1/models")):
        assert r.status_code == 404 and r.json()["error"]["code"] == "route_not_found"
    assert upstream.requests == []


def test_session_header_wins_else_derived_from_stable_head(proxy, upstream):
    base = "/v1/chat/completions"
    assert chat(proxy, base, headers={"x-session-id": "run-42"}).headers["x-ctxproxy-session"] == "run-42"
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "task"}]
    ids = set()
    for extra in ([], [{"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]):
        r = proxy.post(base, json={"model": "m", "messages": msgs + extra}, headers={"authorization": "Bearer k1"})
        ids.add(r.headers["x-ctxproxy-session"])
    assert len(ids) == 1  # later turns of one run share the session
    other = proxy.post(base, json={"model": "m", "messages": msgs}, headers={"authorization": "Bearer k2"})
    assert other.headers["x-ctxproxy-session"] not in ids  # another tenant, another session


def test_tenant_is_a_keyed_hash_never_the_key():
    settings = build_settings({}, env={})
    route = settings.routes[0]
    t = tenant_id("sk-secret-value", "salt")
    assert "sk-secret" not in t and t == tenant_id("sk-secret-value", "salt") != tenant_id("sk-secret-value", "salt2")
    conv = Conversation.parse(b'{"messages": [{"role": "user", "content": "x"}]}', CHAT)
    assert session_id({}, t, route, conv)[0] != session_id({}, tenant_id("other", "salt"), route, conv)[0]


def test_check_and_a_request_tell_one_story_for_messages_without_a_route(tmp_path, upstream):
    """No route speaks the Messages API: `ctxproxy check` prints, word for word, the 400 a request would get."""
    from cli_main import run_main
    from proxy_server import InProcessProxy, make_settings

    cfg = tmp_path / "config.yaml"
    cfg.write_text("routes:\n  - name: default\n    upstream: {base_url: 'https://api.openai.com/v1'}\n")
    done = run_main("check", "--offline", "--config", str(cfg),
                    env={**{k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}})
    line = next(x for x in done.stdout.splitlines() if x.startswith("/v1/messages without a route"))
    with InProcessProxy(make_settings("https://api.openai.com/v1", f"sqlite:///{tmp_path}/r.db")) as p:
        r = p.post("/v1/messages", json={"model": "claude-x", "max_tokens": 10,
                                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["message"] in line, (line, r.text)
    assert "upstream.api: anthropic" in line
