"""The Messages codec on its own: items split and joined, untouched turns byte for byte, Anthropic's 400s."""

from __future__ import annotations

import json

import orjson
import pytest

from proxy.config import build_settings
from proxy.engine.routing import resolve_route
from proxy.errors import BadRequest
from proxy.request import Conversation
from proxy.upstream.windows import overflow_limit
from proxy.wire.messages.codec import MESSAGES
from proxy.wire.turns import ORIGINS

TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]


def body(messages, **extra):
    return {"model": "claude-sonnet-4-6", "max_tokens": 256, "messages": messages, "tools": TOOLS, **extra}


def raw(obj) -> bytes:
    return json.dumps(obj).encode()


CONVERSATION = [
    {"role": "user", "content": "fix the bug"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "look first", "signature": "EqQBCkYIBxgCKkD0sig"},
        {"type": "text", "text": "Reading."},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "ls"}},
        {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"cmd": "cat a.py"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "print(1)"}],
         "is_error": True},
        {"type": "text", "text": "keep going"},
        {"type": "future_block", "x": 1}]},
]


def test_a_user_turn_with_results_is_one_item_per_result_and_one_for_the_rest():
    conv = Conversation.parse(raw(body(CONVERSATION)), MESSAGES)
    items = conv.messages
    assert [MESSAGES.role(i) for i in items] == ["user", "assistant", "tool", "tool", "user"]
    assert items[2] is CONVERSATION[2]["content"][0] or items[2] == CONVERSATION[2]["content"][0]
    assert [MESSAGES.answers(i) for i in items[2:4]] == ["toolu_1", "toolu_2"]
    assert [c.name for c in MESSAGES.calls(items[1])] == ["Bash", "Bash"]
    assert MESSAGES.is_error(items[3]) and not MESSAGES.is_error(items[2])
    assert MESSAGES.text(items[3]) == "print(1)"
    assert MESSAGES.text(items[4]) == "keep going"


def test_untouched_items_render_as_the_clients_own_turns():
    data = raw(body(CONVERSATION))
    conv = Conversation.parse(data, MESSAGES)
    conv.set_messages(list(conv.messages))  # changed, yet every item the client's
    assert orjson.loads(conv.to_bytes()) == orjson.loads(data)
    rendered = MESSAGES.render(conv.body)["messages"]
    split_from = conv.body[ORIGINS][id(conv.messages[2])][0]
    assert rendered[2] is split_from  # the split turn comes back as the very object it was split from
    assert rendered[0] is conv.messages[0] and rendered[1] is conv.messages[1]


def test_a_changed_result_rejoins_its_turn_in_place_and_a_new_user_item_joins_the_last_turn():
    conv = Conversation.parse(raw(body(CONVERSATION)), MESSAGES)
    items = list(conv.messages)
    items[3] = MESSAGES.replaced(items[3], "[stored]")
    items.append(MESSAGES.message("user", "<agent_status>x</agent_status>"))
    conv.set_messages(items)
    sent = orjson.loads(conv.to_bytes())
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    last = sent["messages"][2]["content"]
    assert [b["type"] for b in last] == ["tool_result", "tool_result", "text", "future_block", "text"]
    assert last[1]["content"] == "[stored]" and last[1]["is_error"] is True
    assert last[4]["text"] == "<agent_status>x</agent_status>"
    assert sent["messages"][1] == CONVERSATION[1]  # thinking and its signature as they came


def test_a_system_item_joins_the_user_turn_it_sits_in():
    conv = Conversation.parse(raw(body(CONVERSATION[:1])), MESSAGES)
    conv.set_messages([*conv.messages, MESSAGES.message("system", "status")])
    sent = orjson.loads(conv.to_bytes())
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "fix the bug"},
                                                             {"type": "text", "text": "status"}]}]


def test_breakpoints_go_on_the_last_block_never_on_thinking():
    conv = Conversation.parse(raw(body(CONVERSATION)), MESSAGES)
    items = conv.messages
    assert MESSAGES.with_breakpoint(items[0], "anthropic")["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert MESSAGES.with_breakpoint(items[2], "anthropic", "1h")["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    thinking_last = {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]}
    assert MESSAGES.with_breakpoint(thinking_last, "anthropic") is None
    sys_marked = body(CONVERSATION, system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}])
    assert MESSAGES.fixed_marks(sys_marked) == [300]


@pytest.mark.parametrize("change,message", [
    (lambda b: b.pop("max_tokens"), "max_tokens: Field required"),
    (lambda b: b["messages"][0].update(role="system"), "messages.0.role: Input should be 'user' or 'assistant'"),
    (lambda b: b["messages"][2]["content"].insert(0, {"type": "tool_result", "tool_use_id": "toolu_x"}),
     "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x"),
    (lambda b: b["messages"][2]["content"].pop(1),
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_2"),
    (lambda b: b["messages"][2]["content"].append({"text": "no type"}), "messages.2.content.4.type: Field required"),
    (lambda b: b["messages"][0].update(content=[{"type": "tool_result", "tool_use_id": "t"}]),
     "messages.0.content.0: unexpected `tool_use_id`"),
    (lambda b: b.update(messages=[]), "messages: at least one message is required"),
])
def test_bad_input_is_a_400_naming_the_field(change, message):
    b = json.loads(json.dumps(body(CONVERSATION)))
    change(b)
    with pytest.raises(BadRequest) as e:
        MESSAGES.parse(raw(b))
    assert e.value.message.startswith(message)
    envelope = json.loads(e.value.anthropic_body())
    assert envelope == {"type": "error", "error": {"type": "invalid_request_error", "message": e.value.message}}


def test_consecutive_turns_of_one_role_are_accepted_as_the_api_combines_them():
    b = body([{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
              {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
              {"role": "assistant", "content": "more"},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}])
    conv = Conversation.parse(raw(b), MESSAGES)
    assert conv.to_bytes() == raw(b)


def test_a_messages_request_finds_the_route_whose_upstream_speaks_anthropic():
    s = build_settings({"routes": [{"name": "claude", "upstream": {"base_url": "https://api.anthropic.com/v1"}}]},
                       env={})
    assert resolve_route(s, None, {}, "claude-x", "anthropic").name == "claude"
    assert resolve_route(s, None, {}, "gpt-4o", "openai").name == "default"
    with pytest.raises(BadRequest, match="does not translate between APIs: use route 'claude'"):
        resolve_route(s, "default", {}, "claude-x", "anthropic")
    gateway = build_settings({"upstream": {"base_url": "http://litellm:4000/v1"}}, env={})
    assert resolve_route(gateway, None, {}, "claude-x", "anthropic").name == "default"  # speaks both
    only_openai = build_settings({}, env={})
    with pytest.raises(BadRequest, match=r"add a route whose upstream speaks it \(upstream.api: anthropic\)"):
        resolve_route(only_openai, None, {}, "claude-x", "anthropic")


def test_anthropic_overflow_wording_is_learned_in_the_proxys_tokens():
    msg = {"type": "error", "error": {"type": "invalid_request_error",
                                      "message": "prompt is too long: 240000 tokens > 200000 maximum"}}
    # we counted 200,000 prompt + 10,000 budget; Claude's tokenizer said 240,000: 5/6 of the room is ours
    assert overflow_limit(orjson.dumps(msg), 210_000, 10_000) == 200_000 * 200_000 // 240_000
    budget = {"type": "error", "error": {"type": "invalid_request_error", "message":
              "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000, decrease input "
              "length or `max_tokens` and try again"}}
    assert overflow_limit(orjson.dumps(budget), 190_000 + 20_000, 20_000) == 180_000 + 20_000
    assert overflow_limit(orjson.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                                                   "message": "other"}}), 1000, 0) is None
