"""The context engine behind a gateway: Headroom's contract (POST /v1/compress, GET /v1/retrieve/{hash}).

In process: the contract as tests/gateways/HEADROOM_CONTRACT.md reads it from LiteLLM (same rows back, keys kept,
hashes declared and readable, tenants by the bearer key, the input unchanged on any failure and in audit mode).
Then a real LiteLLM proxy (tests/litellm_gateway.py) with its `headroom` guardrail pointed at a running ctxproxy,
the mock provider behind it: a chat session that overflows a 32k window without the guardrail survives it, the
provider receives ctxproxy's placeholders, LiteLLM's retrieval round reads an offloaded text back, and the same
conversation twice sends the same bytes upstream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from litellm_gateway import INSTALL, LiteLLMGateway, installed
from mock_upstream import MockUpstream
from proxy_server import ProxyServer, make_settings

KEY = "Bearer gw-key"
MARKER = re.compile(r"\[Retrieve more: hash=([0-9a-f]{12,24})\]")
MARKER_ANY = re.compile(r"hash=([0-9a-f]{12,24})")  # an offload's marker, or a cleared result's


def listing(n: int, lines: int = 2000) -> str:
    return "\n".join(f"call {n} line {i}: item {i * 7919 % 10007} ok" for i in range(lines))


def rows(big: str) -> list[dict[str, Any]]:
    """What LiteLLM sends: older user rows and tool results, never system or assistant rows."""
    return [{"role": "user", "content": "Find the bad item."},
            {"role": "tool", "tool_call_id": "call_1", "content": big, "name": "shell"},
            {"role": "user", "content": "and the next one?"}]


def compress(p: Any, messages: list[dict[str, Any]], key: str = KEY) -> Any:
    return p.post("/v1/compress", json={"messages": messages, "model": "agent-model"},
                  headers={"authorization": key})


@pytest.fixture
def engine(make_proxy: Any) -> Any:
    return make_proxy(models={"agent-model": {"context_window": 32_000}})


def test_big_rows_come_back_as_markers_every_other_row_and_key_as_sent(engine: Any) -> None:
    sent = rows(listing(1))
    r = compress(engine, sent)
    assert r.status_code == 200, r.text
    got = r.json()
    assert len(got["messages"]) == len(sent) and r.headers["x-ctxproxy-engine"] == "rewritten"
    assert got["messages"][0] == sent[0] and got["messages"][2] == sent[2]
    tool = got["messages"][1]
    assert {k: v for k, v in tool.items() if k != "content"} == {k: v for k, v in sent[1].items() if k != "content"}
    (digest,) = MARKER.findall(tool["content"])
    assert got["ccr_hashes"] == [digest] and got["transforms_applied"] == ["ctxproxy:offload"]
    assert got["tokens_before"] > 10 * got["tokens_after"] > 0
    assert got["tokens_saved"] == got["tokens_before"] - got["tokens_after"]
    assert got["compression_ratio"] == round(got["tokens_after"] / got["tokens_before"], 4)
    again = compress(engine, sent)
    assert again.content == r.content  # the gateway re-sends the history: the same bytes back


def test_an_offloaded_text_is_read_back_by_its_hash_and_only_by_its_tenant(engine: Any) -> None:
    big = listing(2)
    (digest,) = compress(engine, rows(big)).json()["ccr_hashes"]
    whole = engine.get(f"/v1/retrieve/{digest}", headers={"authorization": KEY})
    assert whole.status_code == 200 and whole.json()["original_content"] == big
    found = engine.get(f"/v1/retrieve/{digest}?query=item+7919", headers={"authorization": KEY}).json()
    assert "line 1: item 7919 ok" in found["original_content"] and "line 2:" not in found["original_content"]
    assert engine.get(f"/v1/retrieve/{digest}", headers={"authorization": "Bearer someone-else"}).status_code == 404
    assert engine.get("/v1/retrieve/0123456789abcdef0123", headers={"authorization": KEY}).status_code == 404


def test_small_rows_come_back_unchanged(engine: Any) -> None:
    sent = rows("short output")
    r = compress(engine, sent)
    assert r.json()["messages"] == sent and r.json()["ccr_hashes"] == [] and r.json()["tokens_saved"] == 0
    assert r.headers["x-ctxproxy-engine"] == "unchanged"


def test_audit_answers_unchanged_and_says_what_it_would_have_done(make_proxy: Any) -> None:
    p = make_proxy(models={"agent-model": {"context_window": 32_000}}, routes=[{"name": "default", "audit": True}])
    sent = rows(listing(3))
    r = compress(p, sent)
    assert r.status_code == 200 and r.json()["messages"] == sent and r.json()["ccr_hashes"] == []
    assert r.json()["tokens_saved"] == 0
    assert r.headers["x-ctxproxy-engine"] == "audit" and r.headers["x-ctxproxy-audit-offloads"] == "1"
    assert int(r.headers["x-ctxproxy-audit-tokens-after"]) < r.json()["tokens_before"] // 10
    metrics = p.get("/metrics").text
    assert 'ctxproxy_engine_calls_total{outcome="audit",route="default"} 1.0' in metrics
    assert 'ctxproxy_engine_audit_tokens_total{route="default",stage="before"}' in metrics


def test_a_store_that_is_down_answers_the_rows_unchanged(make_proxy: Any) -> None:
    p = make_proxy("redis://127.0.0.1:1/0", models={"agent-model": {"context_window": 32_000}}, store_timeout=0.2)
    sent = rows(listing(4))
    r = compress(p, sent)
    assert r.status_code == 200 and r.json()["messages"] == sent
    assert r.headers["x-ctxproxy-engine"] == "degraded" and "store" in r.headers["x-ctxproxy-degraded"]
    assert 'ctxproxy_engine_calls_total{outcome="degraded",route="default"} 1.0' in p.get("/metrics").text


def test_a_body_that_is_no_compress_request_is_a_400(engine: Any) -> None:
    assert compress(engine, "rows").status_code == 400  # type: ignore[arg-type]
    assert engine.post("/v1/compress", content=b"{", headers={"authorization": KEY}).status_code == 400


# --------------------------------------------------------------------------- a real LiteLLM in front

WINDOW = 32_000
MODEL = "agent-model"
SHELL = {"type": "function", "function": {"name": "shell", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def ctx_engine(mock_upstream: MockUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    store = tmp_path_factory.mktemp("engine") / "ctx.db"
    settings = make_settings(mock_upstream.base_url, f"sqlite:///{store}",
                             models={MODEL: {"context_window": WINDOW}})
    with ProxyServer(settings) as p:
        yield p


@pytest.fixture(scope="module")
def litellm(mock_upstream: MockUpstream, ctx_engine: ProxyServer) -> Iterator[LiteLLMGateway]:
    if not installed():
        if __import__("os").environ.get("CI") == "true":
            pytest.fail(f"LiteLLM is not installed; {INSTALL} (.ci/run does)", pytrace=False)
        pytest.skip(f"LiteLLM is not installed; to run the gateway tests: {INSTALL}")
    with LiteLLMGateway(mock_upstream.base_url, ctx_engine.url, models=(MODEL,)) as gw:
        yield gw


def session(turns: int) -> list[dict[str, Any]]:
    """An agent's chat after `turns` shell calls of ~10k tokens each (about 3.3x a 32k window at 10 calls)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                 {"role": "user", "content": "Print the listings, then report."}]
    for n in range(1, turns + 1):
        out += [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call_{n}", "type": "function",
                     "function": {"name": "shell", "arguments": json.dumps({"cmd": f"listing {n}"})}}]},
                {"role": "tool", "tool_call_id": f"call_{n}", "content": listing(n)}]
    return out


def chat(gw: LiteLLMGateway, messages: list[dict[str, Any]]) -> Any:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=gw.master_key, max_retries=0, timeout=60)
    return client.chat.completions.create(model=MODEL, messages=messages, tools=[SHELL])


@pytest.mark.timeout(180)
def test_a_session_through_litellm_survives_the_window_it_overflows_alone(
        litellm: LiteLLMGateway, upstream: MockUpstream) -> None:
    upstream.windows[MODEL] = WINDOW
    for turns in range(1, 7):
        reply = chat(litellm, session(turns))
        assert reply.choices[0].message.content == "ok"
    assert sum(len(m["content"] or "") for m in session(6)) // 4 > WINDOW  # straight to the provider: over
    assert not [r for r in upstream.requests if r.status != 200]
    last = upstream.requests[-1].json["messages"]
    markers = [m for m in last if m["role"] == "tool" and MARKER.search(m["content"])]
    assert len(markers) == 5 and last[-1]["content"] == listing(6)  # the newest exchange: LiteLLM's to keep
    assert [m.get("tool_call_id") for m in last] == [m.get("tool_call_id") for m in session(6)]
    before = upstream.requests[-1].body
    chat(litellm, session(6))
    assert upstream.requests[-1].body == before  # the same conversation: the same bytes to the provider


@pytest.mark.timeout(180)
def test_litellms_retrieval_round_reads_an_offloaded_text_back(litellm: LiteLLMGateway,
                                                                upstream: MockUpstream) -> None:
    upstream.windows[MODEL] = WINDOW

    def read_back(body: dict[str, Any]) -> dict[str, Any]:
        (digest, *_) = MARKER.findall(json.dumps(body["messages"]))
        return {"tool_calls": [{"name": "headroom_retrieve", "arguments": {"hash": digest, "query": "item 7919"}}]}

    upstream.script(read_back, "The bad item is on line 1.")
    reply = chat(litellm, session(3))
    assert reply.choices[0].message.content == "The bad item is on line 1."
    first, second = upstream.requests[-2:]
    assert [t["function"]["name"] for t in first.json["tools"]] == ["shell", "headroom_retrieve"]
    answered = second.json["messages"][-1]
    assert answered["role"] == "tool" and "line 1: item 7919 ok" in answered["content"]


@pytest.mark.timeout(180)
def test_a_messages_session_through_litellm_gets_the_markers_in_its_tool_results(
        litellm: LiteLLMGateway, upstream: MockUpstream) -> None:
    """LiteLLM runs the guardrail on /v1/messages too (as chat rows): Claude-shaped clients get the same engine."""
    claude = litellm.anthropic_models[0]
    upstream.windows[claude] = WINDOW
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Print the listings, then report."}]
    for n in range(1, 5):
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "shell",
                                                        "input": {"cmd": f"listing {n}"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}",
                                                   "content": listing(n)}]}]
    client = anthropic.Anthropic(base_url=litellm.url, api_key=litellm.master_key, max_retries=0, timeout=60)
    reply = client.messages.create(model=claude, max_tokens=64, messages=messages,
                                   tools=[{"name": "shell", "input_schema": SHELL["function"]["parameters"]}])
    assert [b.text for b in reply.content if b.type == "text"] == ["ok"]
    sent = upstream.requests[-1].json["messages"]
    results = [b for m in sent if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"]
    assert len(results) == 4 and all(MARKER.search(json.dumps(b)) for b in results[:3])
    assert results[3]["content"] == listing(4)  # the newest exchange, as LiteLLM keeps it


def test_the_docs_show_the_litellm_config() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "gateways.md").read_text()
    assert "guardrail: headroom" in doc and "/v1/compress" in doc and "audit: true" in doc


def test_old_results_are_cleared_losslessly_row_for_row_past_the_trigger(engine: Any) -> None:
    """Under the offload threshold but many: past the route's trigger the older results are cleared (stored whole,
    a marker in place), never a row added, removed or summarized; the same rows twice, the same bytes."""
    sent = [{"role": "user", "content": "Read all the worker logs."}]
    sent += [{"role": "tool", "tool_call_id": f"call_{n}", "content": listing(n, 300)} for n in range(12)]
    r = compress(engine, sent)
    got = r.json()
    assert len(got["messages"]) == len(sent) and "ctxproxy:clear" in got["transforms_applied"]
    cleared = [m for m in got["messages"] if "cleared tool result" in str(m["content"])]
    assert cleared and got["messages"][-1] == sent[-1]  # the newest kept verbatim
    assert [m["tool_call_id"] for m in got["messages"][1:]] == [m["tool_call_id"] for m in sent[1:]]
    (digest,) = MARKER_ANY.findall(cleared[0]["content"])
    assert digest in got["ccr_hashes"]
    n = int(cleared[0]["tool_call_id"].removeprefix("call_"))
    back = engine.get(f"/v1/retrieve/{digest}", headers={"authorization": KEY}).json()["original_content"]
    assert back == listing(n, 300)
    assert compress(engine, sent).content == r.content
