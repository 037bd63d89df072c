"""The replay in the Responses API: chat trajectories as Responses items, native turns, the fake summarizer.

`python -m bench.replay --api responses|both` converts every chat turn with
bench/replay/responses_items.py and reads each request back as chat messages
for its checks; these tests pin the conversion (item by item, and that it
round-trips to the same positions), what a native Codex turn sends, and that
bench/fake_llm.py answers ctxproxy's own summary calls in the Responses shapes
the proxy really builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import orjson
from cli_main import run_main

from bench import fake_llm
from bench.replay.apis import RESPONSES as RESPONSES_API
from bench.replay.apis import billed
from bench.replay.cli import main as replay_main
from bench.replay.native import NativeTrace
from bench.replay.responses_items import to_items, to_messages, to_request, to_tools
from proxy.rewrite.compress.summarizer import IN_PLACE_FACT, IN_PLACE_PROMPT, SECTIONS, SYSTEM_PROMPT, render
from proxy.wire.responses.codec import RESPONSES

ROOT = Path(__file__).resolve().parents[1]

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
    {"role": "assistant", "content": "Done: src/io.py fixed."},
    {"role": "user", "content": [{"type": "text", "text": "And this?"},
                                 {"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}]},
]
PARAMS = {"type": "object", "properties": {"cmd": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "shell", "description": "run a command", "parameters": PARAMS}}]


def test_chat_messages_become_responses_items() -> None:
    instructions, items = to_items(CHAT)
    assert instructions == "You are a coding agent."
    assert items == [
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Fix the failing test in tests/test_io.py"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking around first."}]},
        {"type": "function_call", "call_id": "call_a", "name": "shell", "arguments": '{"cmd":"ls src"}'},
        {"type": "function_call", "call_id": "call_b", "name": "shell", "arguments": '{"cmd":"cat setup.py"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "io.py\nutil.py"},
        {"type": "function_call_output", "call_id": "call_b", "output": "from setuptools import setup"},
        {"type": "function_call", "call_id": "call_a", "name": "shell", "arguments": '{"cmd":"ls src"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "io.py"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Done: src/io.py fixed."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And this?"},
                                                         {"type": "input_image", "image_url": "https://x.example/a.png"}]},
    ]
    assert to_tools(TOOLS) == [{"type": "function", "name": "shell", "description": "run a command",
                                "parameters": PARAMS}]
    # a system message that does not lead the conversation is a developer message
    assert to_items([{"role": "user", "content": "hi"}, {"role": "system", "content": "Be brief."}])[1] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]}]


def test_the_request_reads_back_as_the_same_messages_at_the_same_positions() -> None:
    body = to_request({"model": "gpt-4o", "messages": CHAT, "tools": TOOLS})
    assert body["store"] is False and body["instructions"] == CHAT[0]["content"] and "messages" not in body
    view = to_messages(body["input"], body["instructions"])
    assert [m["role"] for m in view] == [m["role"] for m in CHAT]
    assert [[c["id"] for c in m.get("tool_calls") or []] for m in view] == \
           [[c["id"] for c in m.get("tool_calls") or []] for m in CHAT]
    assert view[2]["content"] == "Looking around first." and view[5]["content"] is None
    assert view[8]["content"] == "And this?"
    assert [m.get("tool_call_id") for m in view] == [m.get("tool_call_id") for m in CHAT]


def test_a_corpus_trajectory_converts_and_the_mock_bills_it() -> None:
    data = json.loads((ROOT / "proxy" / "examples" / "21_tau-bench_gpt-4o_airline_task7_trial2.json").read_text())
    body = to_request({"model": "gpt-4o", "messages": data["messages"], "tools": data["tools"]})
    assert len(to_messages(body["input"], body.get("instructions"))) == len(data["messages"])
    assert sum(len(c) for c in RESPONSES_API.chunks(body)) > 0  # no orphan output: the mock renders it


def test_a_native_turn_is_the_input_up_to_each_output_or_user_turn() -> None:
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env/>"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run the tests"}]},
             {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"},
             {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "ok"},
             {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
             {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "all green"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
             {"type": "function_call", "call_id": "c3", "name": "shell", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c3", "output": "aborted"}]
    t = NativeTrace("01", "01_codex_x", items, [{"type": "function", "name": "shell"}], None, "sess-1", last_input=9)
    assert t.turns() == [2, 5, 7, 9]
    assert t.turns(final=True) == [2, 5, 7, 9, 11]  # the output recorded after the last request
    body = t.body(5)
    assert body["input"] == items[:5] and body["store"] is False and body["prompt_cache_key"] == "sess-1"
    assert body["include"] == ["reasoning.encrypted_content"] and "instructions" not in body
    parallel = items[:3] + [items[3], {**items[3], "call_id": "c1b"}, items[4],
                            {"type": "function_call_output", "call_id": "c1b", "output": "ok"}]
    assert NativeTrace("02", "02_codex_y", parallel, None, None, "s", last_input=7).turns() == [2, 7]
    view = t.view(7)
    assert [m["role"] for m in view] == ["user", "user", "assistant", "tool", "assistant", "tool"]
    assert view[4]["tool_calls"][0]["function"] == {"name": "apply_patch", "arguments": "*** Begin Patch"}


def _span_items() -> list[dict]:
    _, items = to_items(CHAT[:8])
    return items


def test_the_proxys_summary_calls_in_responses_shape_are_answered_like_chat_ones() -> None:
    items = _span_items()
    transcript = RESPONSES.request("gpt-4o", [RESPONSES.message("system", SYSTEM_PROMPT),
                                              RESPONSES.message("user", f"<transcript>\n{render(RESPONSES, items[1:])}"
                                                                        "\n</transcript>")],
                                   tools=None, extra={}, max_output=2000)
    cached = RESPONSES.request("gpt-4o", [*items, RESPONSES.message("user", IN_PLACE_PROMPT)],
                               tools=to_tools(TOOLS), extra={"instructions": CHAT[0]["content"]}, max_output=2000)
    question = RESPONSES.message("user", IN_PLACE_FACT.format(question="Which file?"))
    fact = RESPONSES.request("gpt-4o", [*items, question], tools=to_tools(TOOLS),
                             extra={"instructions": CHAT[0]["content"]}, max_output=2000)
    assert (fake_llm.kind(transcript), fake_llm.kind(cached), fake_llm.kind(fact)) == ("summary", "summary", "facts")
    agent = to_request({"model": "gpt-4o", "messages": CHAT, "tools": TOOLS})
    assert fake_llm.kind(agent) is None and fake_llm.respond(agent) == "ok"
    for body in (transcript, cached):
        text = fake_llm.respond(body)
        assert [ln[3:] for ln in text.splitlines() if ln.startswith("## ")] == list(SECTIONS)
        assert "assistant: Looking around first." in text and "assistant: Done: src/io.py fixed." in text
        assert "You are a coding agent." not in text  # the head is not part of the span
    # the transcript labels tool results by their tool, as chat does; each one's first line is in the digest
    assert "tool result (shell): io.py" in fake_llm.respond(transcript)
    # the same span in chat gets the same answer in the cached shape
    chat_cached = {"model": "gpt-4o", "messages": [*CHAT[:8], {"role": "user", "content": IN_PLACE_PROMPT}]}
    assert fake_llm.respond(chat_cached) == fake_llm.respond(cached)


def test_the_mock_answers_a_responses_summary_call_with_the_fake_summary(upstream) -> None:
    upstream.script(fake_llm.respond)
    body = RESPONSES.request("gpt-4o", [*_span_items(), RESPONSES.message("user", IN_PLACE_PROMPT)],
                             tools=None, extra={}, max_output=2000)
    r = httpx.post(upstream.base_url + "/responses", content=orjson.dumps(body),
                   headers={"authorization": "Bearer sk-t"})
    assert r.status_code == 200
    assert RESPONSES.reply_text(r.json()).startswith("## Goal and constraints\n- ")
    assert billed(r.json()["usage"])[0] == upstream.requests[-1].usage["input_tokens"]
    assert billed({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}, "completion_tokens": 2}) \
        == (10, 4, 2)


def test_replay_both_apis_side_by_side_on_one_trajectory() -> None:
    """Client-side settings only (no proxy), on a trajectory shipped in the package: a few seconds."""
    # `python -m bench.replay` through its main in this process (it starts as a module in test_bench_package.py)
    out = run_main("--traces-dir", str(ROOT / "proxy" / "examples"), "--traces", "13", "--window", "32000", "--quiet",
                   "--api", "both", "--native", "none", "--settings", "no-proxy,sliding-window-20", main=replay_main)
    assert out.returncode == 0, out.stderr
    assert "## chat and Responses side by side" in out.stdout
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| no-proxy | ")]
    assert any("| no-proxy | responses | chat corpus |" in ln for ln in rows)
    assert any("| no-proxy | chat | chat corpus |" in ln for ln in rows)
