"""The Responses API through the same pipeline: what Codex and the Agents SDK send is managed like chat."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from proxy_server import InProcessProxy, make_settings

KEY = "sk-responses"
HANDLE = re.compile(r'context_read\(handle="(ctx_[0-9a-f]+)"')
TOOLS = [{"type": "function", "name": "shell", "description": "run a command", "strict": False,
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look at the log."}],
             "encrypted_content": "gAAAAABopaque" + "x" * 400}


def big_log(lines: int = 3000) -> str:
    return "\n".join(f"2026-11-29T12:{i % 60:02d}:00 worker[{i}] processed item {i * 7919 % 100003} ok"
                     for i in range(lines))


def codex_input(output: str) -> list[dict]:
    """Items as Codex sends them: developer and user messages, reasoning, a call and its output."""
    return [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be careful."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find the bad item."}]},
            REASONING,
            {"type": "function_call", "name": "shell", "arguments": '{"command":"cat app.log"}', "call_id": "call_1"},
            {"type": "function_call_output", "call_id": "call_1", "output": output},
            {"type": "item_reference", "id": "msg_earlier"},
            {"type": "some_future_item", "payload": {"keep": [1, 2.50, "é"]}}]


def config(**defaults) -> dict:
    return {"defaults": {"offload": {"tool_result_tokens": 2000}, **defaults}}


def settings(upstream, tmp_path, **defaults):
    return make_settings(upstream.base_url, f"sqlite:///{tmp_path}/r.db", **config(**defaults))


pytestmark = pytest.mark.proxy_config(**config())


def client(proxy: InProcessProxy) -> openai.OpenAI:
    return proxy.openai("/v1", api_key=KEY, max_retries=0)


def sent(upstream) -> dict:
    return json.loads(upstream.requests[-1].body)


def sessions(proxy: InProcessProxy, want: int = 1) -> list[dict]:
    """The tenant's sessions once the background accounting has written `want` requests (or 5 s passed)."""
    import time
    deadline = time.monotonic() + 5
    while True:
        rows = proxy.get("/ctx/v1/sessions", headers={"authorization": f"Bearer {KEY}"}).json()["sessions"]
        if sum(r.get("requests", 0) for r in rows) >= want or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def post(proxy: InProcessProxy, body: dict) -> httpx.Response:
    return proxy.post("/v1/responses", content=orjson.dumps(body), timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})


def test_a_small_request_goes_upstream_byte_for_byte(proxy, upstream):
    raw = orjson.dumps({"model": "gpt-5", "input": "Say hi.", "instructions": "Be brief.", "store": False})
    r = proxy.post("/v1/responses", content=raw, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    assert upstream.requests[-1].path == "/v1/responses" and upstream.requests[-1].body == raw
    assert r.headers["x-ctxproxy-session"].startswith("s-") and r.headers["x-ctxproxy-route"] == "default"


def test_the_sdk_gets_its_answer_and_the_proxy_its_session(proxy, upstream):
    resp = client(proxy).responses.create(model="gpt-5", input="Say hi.")
    assert resp.output_text
    assert sessions(proxy)


def test_a_big_function_call_output_is_offloaded_and_the_rest_untouched(proxy, upstream):
    text = big_log()
    items = codex_input(text)
    r = post(proxy, {"model": "gpt-5", "input": items, "tools": TOOLS, "store": False})
    assert r.status_code == 200, r.text
    assert r.headers.get("x-ctxproxy-offloaded-new") == "1"
    up = sent(upstream)
    out = up["input"][4]
    assert out["type"] == "function_call_output" and out["call_id"] == "call_1"
    assert HANDLE.search(out["output"]) and len(out["output"]) < len(text) // 10
    for i in (0, 1, 2, 3, 5, 6):  # every item the pipeline did not rewrite: same value, same place
        assert up["input"][i] == items[i], i
    raw_up = upstream.requests[-1].body
    assert orjson.dumps(REASONING) in raw_up  # the encrypted reasoning, byte for byte
    assert b'{"keep":[1,2.50,"\xc3\xa9"]}' in raw_up or b'"keep":[1,2.5,' in raw_up
    assert up["tools"][:1] == TOOLS and up["tools"][-1]["name"] == "context_read"  # the read tool, last
    status = up["input"][-1]
    assert status["role"] == "user" and "<agent_status>" in status["content"][0]["text"]


def test_the_same_request_is_rewritten_into_the_same_bytes(upstream, tmp_path):
    body = {"model": "gpt-5", "input": codex_input(big_log()), "tools": TOOLS, "store": False}
    bodies = []
    for _ in range(2):  # a restart in between: a new process state, the same store
        with InProcessProxy(settings(upstream, tmp_path)) as p:
            assert post(p, body).status_code == 200
            bodies.append(re.sub(rb"time: [0-9T:-]+Z", b"", re.sub(rb"elapsed: [^\\]+", b"",
                                                                   upstream.requests[-1].body)))
    assert bodies[0] == bodies[1]


def test_the_read_tool_is_answered_in_a_hidden_round(proxy, upstream):
    text = big_log()
    first = post(proxy, {"model": "gpt-5", "input": codex_input(text), "tools": TOOLS, "store": False})
    handle = HANDLE.search(sent(upstream)["input"][4]["output"]).group(1)
    upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": handle, "pattern": "item 7919"}}]},
                    "The bad item is 7919.")
    assert first.status_code == 200
    r = post(proxy, {"model": "gpt-5", "input": codex_input(text), "tools": TOOLS, "store": False})
    assert r.status_code == 200, r.text
    data = r.json()
    assert r.headers["x-ctxproxy-read-rounds"] == "1"
    assert not [o for o in data["output"] if o.get("type") == "function_call"]
    assert "7919" in json.dumps(data["output"])
    hidden = sent(upstream)["input"]
    answer = hidden[-1]
    assert answer["type"] == "function_call_output" and "item 7919" in answer["output"]
    both = [rq.usage for rq in upstream.requests[-2:]]
    assert data["usage"]["input_tokens"] == sum(u["input_tokens"] for u in both)


def test_a_streamed_hidden_round_keeps_the_event_stream_valid(proxy, upstream):
    text = big_log()
    post(proxy, {"model": "gpt-5", "input": codex_input(text), "tools": TOOLS, "store": False})
    handle = HANDLE.search(sent(upstream)["input"][4]["output"]).group(1)
    upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": handle}}]}, "Done reading.")
    events = list(client(proxy).responses.create(model="gpt-5", input=codex_input(text), tools=TOOLS,
                                                 store=False, stream=True))
    kinds = [e.type for e in events]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "Done reading." and not [o for o in final.output if o.type == "function_call"]
    indexes = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert indexes == list(range(len(indexes)))
    both = [rq.usage for rq in upstream.requests[-2:]]
    assert final.usage.input_tokens == sum(u["input_tokens"] for u in both)


@pytest.mark.parametrize("body, param", [
    ({"model": "gpt-5", "input": 42}, "input"),
    ({"model": "gpt-5", "input": [{"content": "no type, no role"}]}, "input[0].type"),
    ({"model": "gpt-5", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
     "input[0].call_id"),
    ({"model": "gpt-5", "input": [{"type": "message", "role": "wizard", "content": "x"}]}, "input[0].role"),
])
def test_bad_input_gets_an_openai_shaped_400_naming_the_field(proxy, upstream, body, param):
    r = post(proxy, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    assert not upstream.requests


def test_an_unknown_item_type_is_not_an_error(proxy, upstream):
    body = {"model": "gpt-5", "input": [{"type": "compaction", "encrypted_content": "opaque"},
                                        {"role": "user", "content": "go on"}]}
    assert post(proxy, body).status_code == 200
    assert sent(upstream)["input"][0] == body["input"][0]


def test_with_provider_held_history_compression_says_it_cannot_apply(proxy, upstream):
    first = client(proxy).responses.create(model="gpt-5", input="Remember 42.", store=True)
    r = post(proxy, {"model": "gpt-5", "previous_response_id": first.id, "input": "What number?", "store": True,
                     "tools": TOOLS})
    assert r.status_code == 200, r.text
    assert "unavailable" in r.headers["x-ctxproxy-compress"]
    assert sent(upstream)["previous_response_id"] == first.id


def test_turns_naming_one_conversation_share_a_session(proxy, upstream):
    ids = set()
    for text in ("first", "second"):
        r = post(proxy, {"model": "gpt-5", "input": text, "prompt_cache_key": "conv-123"})
        ids.add(r.headers["x-ctxproxy-session"])
    assert len(ids) == 1


def test_other_responses_endpoints_pass_through(proxy, upstream):
    r = proxy.post("/v1/responses/input_tokens", json={"model": "gpt-5", "input": "hi"},
                   headers={"authorization": f"Bearer {KEY}"})
    assert upstream.requests[-1].path == "/v1/responses/input_tokens" and r.status_code == upstream.requests[-1].status


def _read_call_for_placeholder(body: dict) -> dict:
    """The model reads back what the proxy offloaded: a context_read call naming the handle it was shown."""
    text = json.dumps(body["input"])
    handle = HANDLE.search(text.replace('\\"', '"'))
    assert handle, "the offloaded output should be in the input by now"
    return {"tool_calls": [{"name": "context_read", "arguments": {"handle": handle.group(1), "pattern": "item 7919"}}]}


def test_the_agents_sdk_runs_a_tool_loop_through_the_proxy(proxy, upstream):
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def read_log() -> str:
        """Read the application log."""
        ran.append("read_log")
        return big_log()

    upstream.script({"tool_calls": [{"name": "read_log", "arguments": {}}]}, _read_call_for_placeholder,
                    "The bad item is 7919.")
    model = OpenAIResponsesModel(model="gpt-5", openai_client=proxy.async_openai("/v1", api_key=KEY, max_retries=0))
    agent = Agent(name="debugger", instructions="Find the bad item.", tools=[read_log], model=model)
    result = asyncio.run(Runner.run(agent, "Which item is bad?"))
    assert result.final_output == "The bad item is 7919." and ran == ["read_log"]
    responses_calls = [r for r in upstream.requests if r.path == "/v1/responses"]
    assert len(responses_calls) == 3  # the SDK made two requests; the proxy answered context_read in between
    assert HANDLE.search(json.dumps(responses_calls[1].json["input"]).replace('\\"', '"'))  # offloaded
    rows = sessions(proxy, want=2)
    assert len(rows) == 1 and rows[0]["requests"] == 2


# A real Codex CLI session in Responses shape (MIT; tests/data/NOTICE.md), copied from the native corpus.
CODEX_SESSION = Path(__file__).resolve().parent / "data" / "02_codex_moonmind_gpt-5.1-codex_019a802a.json"


def _codex_session() -> dict:
    return json.loads(CODEX_SESSION.read_text())


def _summary_or_ok(body: dict) -> str:
    """The summarizer's answer when the proxy asks for one (its instruction is the last input item), else "ok"."""
    last = json.dumps(body.get("input", [])[-1:])
    if "compacting it" not in last and "<transcript>" not in last:
        return "ok"
    from proxy.rewrite.compress.summarizer import SECTIONS
    return "\n".join(f"## {s}\n- the agent worked on the MoonMind repository, step {i}" for i, s in enumerate(SECTIONS))


def test_a_long_codex_session_is_compacted_without_splitting_calls_from_outputs(upstream, tmp_path):
    session = _codex_session()
    items, model = session["items"], "codex-test-32k"
    s = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", models={model: {"context_window": 32000}},
                      defaults={"compress": {"precompute": None}})
    upstream.script(*[_summary_or_ok] * 400)
    compacted, sessions_seen = [], set()
    with InProcessProxy(s) as p:
        cuts = [i + 1 for i, it in enumerate(items) if it.get("type") in ("function_call_output",
                                                                          "custom_tool_call_output")]
        for k in cuts[:60]:
            r = post(p, {"model": model, "input": items[:k], "tools": session["tools"], "store": False,
                         "include": ["reasoning.encrypted_content"], "prompt_cache_key": "codex-conv-1"})
            assert r.status_code == 200, r.text
            sessions_seen.add(r.headers["x-ctxproxy-session"])
            if "x-ctxproxy-compacted" in r.headers:
                compacted.append(r.headers["x-ctxproxy-compacted"])
    assert "summary" in compacted
    agent = [rq for rq in upstream.requests if rq.path == "/v1/responses" and rq.json.get("tools")]
    for rq in agent:
        seen: set[str] = set()
        for it in rq.json["input"]:
            if it.get("type") in ("function_call", "custom_tool_call"):
                seen.add(it["call_id"])
            elif it.get("type") in ("function_call_output", "custom_tool_call_output"):
                assert it["call_id"] in seen, "an output was separated from its call"
    summaries = [rq for rq in upstream.requests if "compacting it" in json.dumps(rq.json.get("input", [])[-1:])]
    assert summaries and all(rq.path == "/v1/responses" and "temperature" not in rq.json for rq in summaries)
    last = agent[-1].json["input"]
    kept_reasoning = [it for it in last if it.get("type") == "reasoning"]
    assert all(it in items for it in kept_reasoning)  # encrypted reasoning kept verbatim where it is kept at all
    assert len(sessions_seen) == 1  # one conversation id: one session, whatever the turns carry


def test_a_codex_shaped_request_keeps_custom_tools_and_its_cache_key(proxy, upstream):
    """What Codex sends: store false, encrypted reasoning asked back, a custom (freeform) tool, its conversation
    id as prompt_cache_key; a big custom tool output is offloaded like a function's."""
    tools = [*TOOLS, {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
                      "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/s"}}]
    items = [*codex_input("ok")[:5],
             {"type": "custom_tool_call", "status": "completed", "call_id": "call_2", "name": "apply_patch",
              "input": "*** Begin Patch\n*** End Patch"},
             {"type": "custom_tool_call_output", "call_id": "call_2", "output": big_log()}]
    body = {"model": "gpt-5-codex", "instructions": "You are Codex.", "input": items, "tools": tools,
            "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium"},
            "store": False, "stream": True, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "0199a7ae-conv"}
    with proxy.stream("POST", "/v1/responses", content=orjson.dumps(body), timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.completed"
    up = sent(upstream)
    assert up["instructions"] == "You are Codex." and up["prompt_cache_key"] == "0199a7ae-conv"
    assert up["tools"][:2] == tools and up["include"] == ["reasoning.encrypted_content"]
    assert up["input"][5] == items[5] and HANDLE.search(up["input"][6]["output"])


def _codex_turns(session: dict, n: int) -> list[int]:
    items = session["items"]
    return [i + 1 for i, it in enumerate(items) if it.get("type") in ("function_call_output",
                                                                       "custom_tool_call_output")][:n]


def test_two_replicas_on_redis_rewrite_a_codex_session_into_the_same_bytes(upstream, tmp_path):
    """Alternating turns between two proxies that share Redis gives the bytes one proxy alone sends."""
    import uuid

    session, model = _codex_session(), "codex-test-32k"
    key = f"sk-{uuid.uuid4()}"

    def run(proxies: list[InProcessProxy]) -> list[bytes]:
        upstream.reset()
        upstream.script(*[_summary_or_ok] * 400)
        for n, k in enumerate(_codex_turns(session, 45)):
            body = {"model": model, "input": session["items"][:k], "tools": session["tools"], "store": False,
                    "prompt_cache_key": "conv-r"}
            r = proxies[n % len(proxies)].post("/v1/responses", content=orjson.dumps(body), timeout=60,
                           headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
            assert r.status_code == 200, r.text
        return [re.sub(rb"elapsed: [^\\]+|time: [0-9T:-]+Z", b"", rq.body) for rq in upstream.requests]

    def cfg(store: str):  # noqa: ANN202
        return make_settings(upstream.base_url, store, models={model: {"context_window": 32000}},
                             defaults={"compress": {"precompute": None}})

    redis = "redis://127.0.0.1:6379/14"
    with InProcessProxy(cfg(redis)) as p1, InProcessProxy(cfg(redis)) as p2:
        via_two = run([p1, p2])
    with InProcessProxy(cfg(f"sqlite:///{tmp_path}/one.db")) as p:
        via_one = run([p])
    assert any(b"<context_summary>" in b for b in via_one)  # the run compacted: the replicas had to agree
    assert via_two == via_one


def test_the_sdk_stream_helper_gets_the_final_response(proxy, upstream):
    with client(proxy).responses.stream(model="gpt-5", input="Say hi.") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text and final.output_text == text and final.usage.input_tokens > 0


def test_the_agents_sdk_streams_a_tool_loop_with_the_read_round_hidden(proxy, upstream):
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def read_log() -> str:
        """Read the application log."""
        return big_log()

    upstream.script({"tool_calls": [{"name": "read_log", "arguments": {}}]}, _read_call_for_placeholder,
                    "The bad item is 7919.")
    model = OpenAIResponsesModel(model="gpt-5", openai_client=proxy.async_openai("/v1", api_key=KEY, max_retries=0))
    agent = Agent(name="debugger", instructions="Find the bad item.", tools=[read_log], model=model)

    async def go() -> tuple[str, list[str]]:
        result = Runner.run_streamed(agent, "Which item is bad?")
        kinds = [getattr(e, "type", "") for e in [e async for e in result.stream_events()]]
        return str(result.final_output), kinds

    final, kinds = asyncio.run(go())
    assert final == "The bad item is 7919." and "raw_response_event" in kinds
    streamed = [r for r in upstream.requests if r.path == "/v1/responses"]
    assert len(streamed) == 3 and all(r.json.get("stream") is True for r in streamed)
    called = [json.dumps(r.json["input"]) for r in streamed]
    assert "context_read" not in called[0] and any('"name": "context_read"' in c for c in called[2:])
