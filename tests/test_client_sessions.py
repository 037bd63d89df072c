"""Sessions as the client means them, and the client's own compaction left to the client.

A client's own session identity wins over the derived one: X-Session-Id, then
the agent's header (Claude Code's `X-Claude-Code-Session-Id`, opencode's
`session-id`, Codex's `session_id`), then the conversation its body names
(`prompt_cache_key`); a Claude Code subagent (request class `subagent`, with
`CLAUDE_CODE_GATEWAY_HINT_HEADERS=1`) is a session of its own named after its
parent's. Claude Code's compaction request - its summary instruction last, or its
request class `compaction` - gets no status bar after it and no compaction of
ours; the request after it is managed as usual.
"""

from __future__ import annotations

import json

import orjson
from test_claude_code_shapes import BETAS, KEY, turn

# The shape of Claude Code 2.1.3xx's summary request: its history, then this user message.
SUMMARY_REQUEST = ("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n"
                   "Your task is to create a detailed summary of the conversation so far, paying close attention to "
                   "the user's explicit requests and your previous actions.\n...\n"
                   "REMINDER: Do NOT call any tools. Respond with plain text only \u2014 an <analysis> block "
                   "followed by a <summary> block. Tool calls will be rejected and you will fail the task.")
HISTORY = [{"role": "user", "content": "List the files."},
           {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                              "input": {"command": "ls"}}]},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py b.py"}]}]


def post(proxy, body: dict, **headers: str):  # noqa: ANN201
    return proxy.post("/v1/messages?beta=true", content=orjson.dumps(body), timeout=60,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": ",".join(BETAS),
                               "content-type": "application/json", **headers})


def last_sent(upstream) -> str:
    return json.dumps(json.loads(upstream.requests[-1].body)["messages"][-1])


def test_two_identical_requests_of_two_claude_code_sessions_are_two_sessions(proxy, upstream):
    body = turn(HISTORY)
    a = post(proxy, body, **{"x-claude-code-session-id": "cc-a"})
    b = post(proxy, body, **{"x-claude-code-session-id": "cc-b"})
    assert (a.headers["x-ctxproxy-session"], b.headers["x-ctxproxy-session"]) == ("cc-a", "cc-b")


def test_opencode_and_codex_session_headers_name_the_session(proxy, upstream):
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    auth = {"authorization": "Bearer sk-oc"}
    opencode = proxy.post("/v1/chat/completions", json=body, headers={**auth, "session-id": "ses_opencode1"})
    codex = proxy.post("/v1/chat/completions", json=body, headers={**auth, "session_id": "0199-codex"})
    named = proxy.post("/v1/chat/completions", json=body,
                       headers={**auth, "session-id": "ses_opencode1", "x-session-id": "mine"})
    assert opencode.headers["x-ctxproxy-session"] == "ses_opencode1"
    assert codex.headers["x-ctxproxy-session"] == "0199-codex"
    assert named.headers["x-ctxproxy-session"] == "mine"  # X-Session-Id first, as always


def test_a_chat_prompt_cache_key_keeps_two_openings_apart(proxy, upstream):
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "same opening"}]}
    auth = {"authorization": "Bearer sk-pck"}
    a = proxy.post("/v1/chat/completions", json={**body, "prompt_cache_key": "ses_a"}, headers=auth)
    b = proxy.post("/v1/chat/completions", json={**body, "prompt_cache_key": "ses_b"}, headers=auth)
    a2 = proxy.post("/v1/chat/completions", json={**body, "prompt_cache_key": "ses_a"}, headers=auth)
    assert a.headers["x-ctxproxy-session"] != b.headers["x-ctxproxy-session"]
    assert a.headers["x-ctxproxy-session"] == a2.headers["x-ctxproxy-session"]


def test_a_claude_code_subagent_is_a_session_of_its_own_named_after_its_parent(proxy, upstream):
    hints = {"x-claude-code-session-id": "cc-main", "x-claude-code-request-class": "subagent",
             "x-claude-code-agent-id": "a1b2", "x-claude-code-parent-agent-id": "root"}
    sub = post(proxy, turn(HISTORY), **hints)
    main = post(proxy, turn(HISTORY), **{"x-claude-code-session-id": "cc-main",
                                          "x-claude-code-request-class": "main"})
    assert sub.headers["x-ctxproxy-session"] == "cc-main/agent-a1b2"
    assert main.headers["x-ctxproxy-session"] == "cc-main"


def test_claude_codes_summary_request_gets_no_status_bar_and_the_next_turn_does(proxy, upstream):
    compacting = turn([*HISTORY, {"role": "user", "content": [{"type": "text", "text": SUMMARY_REQUEST}]}])
    r = post(proxy, compacting, **{"x-claude-code-session-id": "cc-compacts"})
    assert r.status_code == 200, r.text
    assert "<agent_status>" not in last_sent(upstream) and "REMINDER: Do NOT call any tools" in last_sent(upstream)
    after = turn([{"role": "user", "content": "This session is being continued from a previous conversation. "
                                              "Summary: listed the files."}, *HISTORY[1:]])
    post(proxy, after, **{"x-claude-code-session-id": "cc-compacts"})
    assert "<agent_status>" in last_sent(upstream)


def test_the_compaction_request_class_alone_leaves_the_request_to_the_client(proxy, upstream):
    body = turn([*HISTORY, {"role": "user", "content": "Summarize the conversation."}])
    post(proxy, body, **{"x-claude-code-session-id": "cc-class", "x-claude-code-request-class": "compaction"})
    assert "<agent_status>" not in last_sent(upstream)
    post(proxy, body, **{"x-claude-code-session-id": "cc-class", "x-claude-code-request-class": "main"})
    assert "<agent_status>" in last_sent(upstream)


def test_two_interleaved_conversations_with_one_opening_are_two_sessions_without_a_cache_break(proxy, upstream):
    """No session header, no body name: two agents on one task (one system prompt, one first message) take turns.
    Each continues its own history; neither is counted as editing the other's, and the provider's cached tokens
    are never more than the proxy says could have been cached."""
    opening = [{"role": "system", "content": "You are a careful engineer. " * 300},
               {"role": "user", "content": "Find the failing test and fix it."}]
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object", "properties": {}}}}]
    auth = {"authorization": "Bearer sk-twins"}
    histories = {"a": list(opening), "b": list(opening)}
    sessions: dict[str, list[str]] = {"a": [], "b": []}
    breaks = []
    for turn_no in range(5):
        for name, history in histories.items():
            r = proxy.post("/v1/chat/completions", headers=auth,
                           json={"model": "gpt-4o", "messages": history, "tools": tools})
            assert r.status_code == 200, r.text
            sessions[name].append(r.headers["x-ctxproxy-session"])
            breaks.append(r.headers.get("x-ctxproxy-cache-break"))
            call = {"id": f"call_{name}{turn_no}", "type": "function",
                    "function": {"name": "shell", "arguments": json.dumps({"cmd": f"{name} step {turn_no}"})}}
            history += [{"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": call["id"], "content": f"output of {name} {turn_no}"}]
    assert len(set(sessions["a"][1:])) == 1 and len(set(sessions["b"][1:])) == 1
    assert sessions["a"][-1] != sessions["b"][-1]
    assert breaks == [None] * len(breaks)
    stats = proxy.get("/ctx/v1/stats", headers=auth).json()
    totals = stats["totals"]["all"]
    assert totals["breaks"] == 0 and 0 < totals["efficiency"] <= 1.0, totals


def test_a_turn_redone_with_another_last_message_stays_in_its_session(proxy, upstream):
    """A client that sends its history again with only the last message changed (a turn redone, an edited prompt)
    is the same conversation: the same session (its memo kept), not a branch of its own."""
    auth = {"authorization": "Bearer sk-redo"}
    history = [{"role": "system", "content": "You are a careful engineer."},
               {"role": "user", "content": "Find the failing test."},
               {"role": "assistant", "content": "Running the tests."},
               {"role": "user", "content": "first try"}]
    first = proxy.post("/v1/chat/completions", headers=auth, json={"model": "gpt-4o", "messages": history})
    again = [*history[:-1], {"role": "user", "content": "second try"}]
    redone = proxy.post("/v1/chat/completions", headers=auth, json={"model": "gpt-4o", "messages": again})
    assert first.status_code == redone.status_code == 200
    assert redone.headers["x-ctxproxy-session"] == first.headers["x-ctxproxy-session"]
