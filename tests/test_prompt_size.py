"""One size per prompt: the status bar, the headers and the inspector state the same number for what went upstream.

That number is the prompt as the provider got it by the proxy's count: the tool
definitions, the system prompt and every message sent, the status bar included
(README, "What the figures mean"). The answer's `max_tokens` must fit in the
window too but is no part of the prompt: it is a figure of its own
(`x-ctxproxy-output-reserve`, the timeline's `output_reserve`). Here the number
is also recomputed from the body the mock provider received, without the
proxy's code.
"""

from __future__ import annotations

import re
import uuid

import crafted
import pytest

pytestmark = pytest.mark.proxy_config(models={crafted.MODEL: {"context_window": crafted.WINDOW}},
                                      defaults=crafted.DEFAULTS)
RESERVE = 500
STATED = re.compile(r"context: \d+% \(([\d,]+)/([\d,]+) tokens\)")


def test_a_compacted_prompt_has_one_size_in_the_status_bar_the_headers_and_the_inspector(proxy, upstream):
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"size-{uuid.uuid4().hex[:8]}"
    upstream.windows[crafted.MODEL] = crafted.WINDOW
    auth = {"authorization": f"Bearer {key}", "x-session-id": session}
    answers = [proxy.post("/v1/chat/completions", headers=auth, timeout=30,
                          json={"model": crafted.MODEL, "messages": msgs, "tools": crafted.TOOLS,
                                "max_tokens": RESERVE})
               for msgs in crafted.requests()]
    assert [r.status_code for r in answers] == [200, 200, 200]
    last, body = answers[-1].headers, upstream.requests[-1].json
    assert last["x-ctxproxy-compacted"] == "clear"

    got = crafted.prompt_tokens(body)  # what the provider got, counted here by the README's rules
    status = body["messages"][-1]["content"]
    stated, window = (int(x.replace(",", "")) for x in STATED.search(status).groups())
    assert (stated, window) == (got, crafted.WINDOW)
    assert int(last["x-ctxproxy-prompt-tokens"]) == int(last["x-ctxproxy-tokens-after"]) == got
    assert last["x-ctxproxy-output-reserve"] == str(RESERVE)
    assert int(last["x-ctxproxy-tokens-before"]) > got

    inspected = proxy.get(f"/ctx/v1/sessions/{session}/requests/3", headers=auth).json()
    assert inspected["entry"]["sent_tokens"] == inspected["prompt"]["sent"] == got
    assert inspected["entry"]["output_reserve"] == inspected["prompt"]["output_reserve"] == RESERVE
    assert inspected["entry"]["tokens_after"] == got
    assert inspected["entry"]["tokens_before"] == int(last["x-ctxproxy-tokens-before"])
    for r, rq in zip(answers, upstream.requests):  # every request, compacted or not
        assert int(r.headers["x-ctxproxy-prompt-tokens"]) == crafted.prompt_tokens(rq.json)


def test_the_system_prompt_is_in_both_sizes_so_it_is_no_saving_and_no_cost(make_proxy, upstream):
    proxy = make_proxy(defaults={"status_bar": {"enabled": False}, "offload": {"enabled": False}})
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "system": "You are Claude Code. " * 200,
            "messages": [{"role": "user", "content": "Say hi."}]}
    r = proxy.post("/v1/messages", json=body, headers={"x-api-key": "sk-ant-size", "x-session-id": "sys"})
    assert r.status_code == 200 and r.headers["x-ctxproxy-tokens-saved"] == "0"
    (entry,) = proxy.get("/ctx/v1/sessions/sys", headers={"x-api-key": "sk-ant-size"}).json()["requests"]
    assert entry["client_tokens"] == entry["sent_tokens"] == int(r.headers["x-ctxproxy-prompt-tokens"]) > 1000
    assert entry["added"] == 0


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_every_api_states_the_same_size_in_its_status_bar_and_headers(make_proxy, upstream, api):
    proxy = make_proxy(defaults={"offload": {"enabled": False}})
    session = f"{api}-{uuid.uuid4().hex[:8]}"
    auth = {"x-api-key": "sk-size", "authorization": "Bearer sk-size", "x-session-id": session}
    result = "\n".join(f"line {j} of module one" for j in range(80))
    if api == "messages":
        r = proxy.post("/v1/messages", headers=auth, json={
            "model": "claude-sonnet-4-6", "max_tokens": 700, "system": "Be careful. " * 40,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "Port it."},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash",
                                                            "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                       "content": result}]}]})
    else:
        r = proxy.post("/v1/responses", headers=auth, json={
            "model": "gpt-4o", "max_output_tokens": 700, "instructions": "Be careful. " * 40,
            "tools": [{"type": "function", "name": "Bash", "parameters": {"type": "object"}}],
            "input": [{"role": "user", "content": "Port it."},
                      {"type": "function_call", "call_id": "c1", "name": "Bash", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": result}]})
    assert r.status_code == 200, r.text
    stated = int(STATED.search(upstream.requests[-1].body.decode().replace("\\n", "\n")).group(1).replace(",", ""))
    (entry,) = proxy.get(f"/ctx/v1/sessions/{session}", headers=auth).json()["requests"]
    assert stated == int(r.headers["x-ctxproxy-prompt-tokens"]) == entry["sent_tokens"]
    assert entry["output_reserve"] == 700
