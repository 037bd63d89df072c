"""The replay in Anthropic's Messages API: chat trajectories as Messages, native Claude Code turns, the fake summarizer.

`python -m bench.replay --api messages|all` converts every chat turn with
bench/replay/messages_items.py (Claude Code's cache breakpoints and a
max_tokens included) and reads each request back as chat messages for its
checks; these tests pin the conversion, that it reads back at the same
positions, what a native Claude Code turn sends, that the mock accepts and
bills every converted turn, and that bench/fake_llm.py answers ctxproxy's own
summary calls in the Messages shapes the proxy really builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import orjson
from cli_main import run_main

from bench import fake_llm
from bench.replay import messages_items as mi
from bench.replay.apis import MESSAGES as MESSAGES_API
from bench.replay.apis import billed, cache_written
from bench.replay.cli import main as replay_main
from bench.replay.native import NativeMessagesTrace, load_native_messages
from bench.replay.settings import MODEL
from bench.replay.traces import load_traces
from proxy.rewrite.compress.summarizer import IN_PLACE_FACT, IN_PLACE_PROMPT, SECTIONS, SYSTEM_PROMPT, render
from proxy.wire.messages.codec import MESSAGES

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
CC = {"type": "ephemeral"}

CALL_A = {"id": "call_a", "type": "function", "function": {"name": "shell", "arguments": '{"cmd":"ls src"}'}}
CALL_B = {"id": "call_b", "type": "function", "function": {"name": "shell", "arguments": '{"cmd":"cat setup.py"}'}}
CHAT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in tests/test_io.py"},
    {"role": "assistant", "content": "Looking around first.", "tool_calls": [CALL_A, CALL_B]},
    {"role": "tool", "tool_call_id": "call_a", "content": "io.py\nutil.py"},
    {"role": "tool", "tool_call_id": "call_b", "content": "from setuptools import setup"},
    {"role": "assistant", "content": "", "tool_calls": [CALL_A]},
    {"role": "tool", "tool_call_id": "call_a", "content": "io.py"},
    {"role": "user", "content": "Please also run the linter."},
    {"role": "assistant", "content": "Done: src/io.py fixed."},
    {"role": "user", "content": [{"type": "text", "text": "And this?"},
                                 {"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}]},
]
PARAMS = {"type": "object", "properties": {"cmd": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "shell", "description": "run a command", "parameters": PARAMS}}]


def test_chat_messages_become_a_claude_code_request() -> None:
    body = mi.to_request({"model": "gpt-4o", "messages": CHAT, "tools": TOOLS})
    assert body == {
        "model": "gpt-4o", "max_tokens": mi.MAX_TOKENS,
        "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": CC}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix the failing test in tests/test_io.py"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Looking around first."},
                {"type": "tool_use", "id": "call_a", "name": "shell", "input": {"cmd": "ls src"}},
                {"type": "tool_use", "id": "call_b", "name": "shell", "input": {"cmd": "cat setup.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "io.py\nutil.py"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "from setuptools import setup"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_a", "name": "shell", "input": {"cmd": "ls src"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_a", "content": "io.py"},
                                         {"type": "text", "text": "Please also run the linter."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Done: src/io.py fixed."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "And this?"},
                {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"},
                 "cache_control": CC}]}],
        "tools": [{"name": "shell", "description": "run a command", "input_schema": PARAMS}]}
    # only the last message is marked: the trajectory's own objects are not
    assert "cache_control" not in json.dumps(CHAT)
    assert mi.tool_input("not json") == {"raw": "not json"} and mi.tool_input("[1]") == {"raw": "[1]"}
    assert mi.tool_input("") == {}


def test_the_request_reads_back_as_the_same_messages_at_the_same_positions() -> None:
    body = mi.to_request({"model": "gpt-4o", "messages": CHAT, "tools": TOOLS})
    view = MESSAGES_API.view(body)
    assert [m["role"] for m in view] == [m["role"] for m in CHAT]
    assert [[c["id"] for c in m.get("tool_calls") or []] for m in view] == \
           [[c["id"] for c in m.get("tool_calls") or []] for m in CHAT]
    assert [m.get("tool_call_id") for m in view] == [m.get("tool_call_id") for m in CHAT]
    assert view[0]["content"] == CHAT[0]["content"] and view[5]["content"] is None
    assert json.loads(view[2]["tool_calls"][1]["function"]["arguments"]) == {"cmd": "cat setup.py"}
    assert view[9]["content"] == "And this?\n[image]"
    # ctxproxy's status bar, a text block of the last user message here, reads as its own user message
    status = "<agent_status>\nturn: 3\n</agent_status>"
    body["messages"][-1]["content"].append({"type": "text", "text": status})
    assert MESSAGES_API.view(body)[-2:] == [view[-1], {"role": "user", "content": status}]


def test_every_turn_of_a_corpus_trajectory_is_accepted_and_billed_by_the_mock(upstream) -> None:
    trace = load_traces(str(ROOT / "proxy" / "examples"), ["21"])[0]
    reads = []
    for i in trace.turns():
        body = MESSAGES_API.body(trace, i)
        r = httpx.post(upstream.base_url + MESSAGES_API.path, content=orjson.dumps(body),
                       headers=MESSAGES_API.headers("sk-t"))
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        prompt, cached, _ = billed(usage)
        assert prompt == sum(len(c) for c in MESSAGES_API.chunks(body)) and cached == usage["cache_read_input_tokens"]
        assert cache_written(usage) == usage["cache_creation_input_tokens"]
        reads.append((prompt, cached))
    # Claude Code's breakpoints: every turn reads what the turn before it wrote (all of it, once it is cacheable)
    for (before, _), (_, read) in zip(reads, reads[1:]):
        assert read == (before if before >= 1024 else 0)


def test_a_native_claude_code_turn_is_the_input_up_to_each_user_message() -> None:
    [trace] = load_native_messages(str(DATA), ["08"])
    data = json.loads((DATA / "08_claude-code_claude-reliability_opus-4-5_python-to-rust-port.json").read_text())
    users = [k + 1 for k, m in enumerate(data["items"]) if m["role"] == "user"]
    assert trace.turns() == users and trace.turns()[-1] == data["last_request_input_len"]
    body = trace.body(trace.turns()[2])
    assert body["model"] == MODEL and body["max_tokens"] == mi.MAX_TOKENS and body["tools"] == data["tools"]
    assert body["messages"][:-1] == data["items"][:trace.turns()[2] - 1]
    assert body["messages"][-1]["content"][-1]["cache_control"] == CC
    items = [{"role": "user", "content": "go"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
             {"role": "user", "content": "and then?"},
             {"role": "assistant", "content": "done"},
             {"role": "user", "content": "thanks"}]
    t = NativeMessagesTrace("09", "09_x", items, None, "Be brief.", last_input=4)
    assert t.turns() == [1, 4] and t.turns(final=True) == [1, 4, 6]  # a run of user messages is one request
    assert [m["role"] for m in t.view(4)] == ["system", "user", "assistant", "tool", "user"]
    assert t.body(4)["system"] == [{"type": "text", "text": "Be brief.", "cache_control": CC}]


def _span() -> tuple[dict, list]:
    """A Messages conversation as the proxy holds it (its codec's items), with Claude Code's tools."""
    body = mi.to_request({"model": "gpt-4o", "messages": CHAT[:7], "tools": TOOLS})
    parsed = MESSAGES.parse(orjson.dumps(body))
    return body, MESSAGES.items(parsed)


def test_the_proxys_summary_calls_in_messages_shape_are_answered_like_chat_ones() -> None:
    body, items = _span()
    transcript = MESSAGES.request("gpt-4o", [MESSAGES.message("system", SYSTEM_PROMPT),
                                             MESSAGES.message("user", f"<transcript>\n{render(MESSAGES, items[1:])}"
                                                                      "\n</transcript>")],
                                  tools=None, extra={}, max_output=2000)
    cached = MESSAGES.request("gpt-4o", [*items, MESSAGES.message("user", IN_PLACE_PROMPT)], tools=body["tools"],
                              extra={"system": body["system"]}, max_output=2000)
    fact = MESSAGES.request("gpt-4o", [*items, MESSAGES.message("user", IN_PLACE_FACT.format(question="Which?"))],
                            tools=body["tools"], extra={"system": body["system"]}, max_output=2000)
    # the instruction shares the last user message with the last tool result, as the API's roles require
    assert [b["type"] for b in cached["messages"][-1]["content"]] == ["tool_result", "text"]
    assert (fake_llm.kind(transcript), fake_llm.kind(cached), fake_llm.kind(fact)) == ("summary", "summary", "facts")
    agent = mi.to_request({"model": "gpt-4o", "messages": CHAT, "tools": TOOLS})
    assert fake_llm.kind(agent) is None and fake_llm.respond(agent) == "ok"
    for call in (transcript, cached):
        text = fake_llm.respond(call)
        assert [ln[3:] for ln in text.splitlines() if ln.startswith("## ")] == list(SECTIONS)
        assert "assistant: Looking around first." in text
        assert "You are a coding agent." not in text and "Fix the failing test" not in text  # the head
    assert "tool result (shell): io.py" in fake_llm.respond(cached)  # the tool result beside the instruction
    chat_cached = {"model": "gpt-4o", "messages": [*CHAT[:7], {"role": "user", "content": IN_PLACE_PROMPT}]}
    assert fake_llm.respond(chat_cached) == fake_llm.respond(cached)


def test_billed_reads_anthropics_usage() -> None:
    usage = {"input_tokens": 12, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 300,
             "output_tokens": 7}
    assert billed(usage) == (1312, 1000, 7) and cache_written(usage) == 300
    assert billed({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2}) == (10, 4, 2)
    assert cache_written({"prompt_tokens": 5}) == 0


def test_replay_all_three_apis_side_by_side_on_one_trajectory_and_the_claude_code_session() -> None:
    """Client-side settings only (no proxy): a few seconds."""
    # `python -m bench.replay` through its main in this process (it starts as a module in test_bench_package.py)
    out = run_main("--traces-dir", str(ROOT / "proxy" / "examples"), "--traces", "13", "--window", "32000", "--quiet",
                   "--api", "all", "--native", str(DATA), "--native-traces", "08",
                   "--settings", "no-proxy,sliding-window-20", main=replay_main)
    assert out.returncode == 0, out.stderr
    assert "## chat, Responses and Messages side by side" in out.stdout
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| no-proxy | ")]
    for api in ("chat", "responses", "messages"):
        assert any(f"| no-proxy | {api} | chat corpus |" in ln for ln in rows), api
    claude = next(ln for ln in rows if "| no-proxy | messages | native Claude Code sessions |" in ln)
    cells = [c.strip() for c in claude.split("|")]
    assert cells[4] == "39" and cells[5] == "0 (0)"  # 39 requests at 32k, none rejected
    assert cells[-3] != "-" and int(cells[-3].replace(",", "")) > 0  # cache writes, billed apart
    assert "not run: sliding-window-20 transforms chat messages" in out.stdout
