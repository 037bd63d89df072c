"""The mock's scripted model (tests/_mock_agent.py): it plays a real agent's session with the agent's own tools."""

from __future__ import annotations

import json

import httpx
from _mock_agent import ShellAgent
from mock_upstream import MockUpstream

CODEX_TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
               {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "spawn"}]}]
CLAUDE_TOOLS = [{"name": "Read", "input_schema": {"type": "object"}},
                {"name": "Bash", "input_schema": {"type": "object"}}]


def codex_turn(*items: dict) -> dict:
    return {"model": "gpt-5.5", "input": [{"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "go"}]}, *items],
            "tools": CODEX_TOOLS}


def test_codex_gets_calls_of_its_own_shell_tool_then_the_final_text() -> None:
    agent = ShellAgent("seq -f 'call {n} line %g' 1 3", calls=2, final="finished")
    first, second, third = (agent(codex_turn()) for _ in range(3))
    assert first == {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": "seq -f 'call 1 line %g' 1 3"}}]}
    assert second["tool_calls"][0]["arguments"] == {"cmd": "seq -f 'call 2 line %g' 1 3"}
    assert third == "finished"
    assert agent.made == 2 and agent.tools_seen == ["exec_command", "exec_command"]


def test_claude_code_gets_bash_with_a_command_and_a_description() -> None:
    agent = ShellAgent("yes line | head -n 3000", calls=1)
    body = {"model": "claude-opus-5-5", "max_tokens": 100, "tools": CLAUDE_TOOLS,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}]}
    reply = agent(body)
    assert reply == {"tool_calls": [{"name": "Bash", "arguments": {"command": "yes line | head -n 3000",
                                                                   "description": "Print a long listing"}}]}


def test_an_instruction_not_to_call_tools_gets_a_summary_under_the_headings_it_names() -> None:
    agent = ShellAgent("seq 1 10", calls=5)
    agent(codex_turn())
    ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text":
           "Do not call tools. Write markdown with exactly these headings: ## Goal and constraints, ## Next step."}]}
    reply = agent(codex_turn({"type": "function_call_output", "call_id": "c1", "output": "1"}, ask))
    assert isinstance(reply, str) and reply.startswith("## Goal and constraints\n") and "\n## Next step\n" in reply
    assert agent.made == 1 and agent.summaries == 1  # the summary is not a turn of the task


def test_a_request_without_a_shell_tool_is_answered_with_text() -> None:
    agent = ShellAgent("seq 1 10", calls=5)
    reply = agent({"model": "claude-haiku-5", "max_tokens": 50,
                   "messages": [{"role": "user", "content": "Write a title for this session"}]})
    assert isinstance(reply, str) and reply
    assert agent.made == 0


def test_the_mock_plays_it_on_the_wire_when_set_as_its_default_reply(upstream: MockUpstream) -> None:
    upstream.default_reply = ShellAgent("ls -la", calls=1, final="done")
    with httpx.Client(base_url=upstream.base_url, timeout=10) as c:
        first = c.post("/responses", json=codex_turn()).json()
        call = next(o for o in first["output"] if o["type"] == "function_call")
        assert (call["name"], json.loads(call["arguments"])) == ("exec_command", {"cmd": "ls -la"})
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "total 0"}
        second = c.post("/responses", json=codex_turn(call, output)).json()
    assert second["output"][-1]["content"][0]["text"] == "done"
