"""What a Messages API request body must be before the proxy touches it, in Anthropic's words.

Strict where the proxy reads or where the provider would refuse anyway: the
body is an object; `model` a string; `max_tokens` present (not on
count_tokens); `messages` a non-empty list of `user` / `assistant` turns whose
content is a string or a list of blocks with a string `type`; every
`tool_result` answers a `tool_use` of the assistant turn just before it, and
every `tool_use` is answered in the user turn just after (the last turn
excepted). Consecutive turns of one role are accepted, as the API accepts
them: it combines them into one turn, and so does the pairing check. Unknown
block types and unknown top-level fields are not errors: they pass untouched.
Each message names the field, as Anthropic's own errors do.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest
from proxy.wire.body import check_writable, load_object


def parse_body(raw: bytes, *, need_max_tokens: bool = True) -> dict[str, Any]:
    body = load_object(raw)
    if not isinstance(body.get("model"), str):
        raise BadRequest("model: Field required" if "model" not in body else "model: Input should be a valid string",
                         param="model")
    if need_max_tokens:
        mt = body.get("max_tokens")
        if "max_tokens" not in body:
            raise BadRequest("max_tokens: Field required", param="max_tokens")
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise BadRequest("max_tokens: Input should be a positive integer", param="max_tokens")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise BadRequest("stream: Input should be a valid boolean", param="stream")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise BadRequest("system: Input should be a valid string or a list of text blocks", param="system")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools: Input should be a valid list", param="tools")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise BadRequest(f"tools.{i}.name: Field required", param=f"tools.{i}.name")
    if "messages" not in body:
        raise BadRequest("messages: Field required", param="messages")
    _check_messages(body["messages"])
    check_writable(body)
    return body


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise BadRequest("messages: Input should be a valid list", param="messages")
    if not messages:
        raise BadRequest("messages: at least one message is required", param="messages")
    turns: list[tuple[str, list[tuple[int, int, Any]]]] = []  # consecutive same-role messages combined
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages.{i}: Input should be a valid dictionary", param=f"messages.{i}")
        role = m.get("role")
        if role not in ("user", "assistant") and not (role == "system" and i > 0):
            hint = " (a system prompt goes in the top-level `system` field)" if role == "system" else ""
            raise BadRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'{hint}",
                             param=f"messages.{i}.role")
        content = m.get("content")
        if "content" not in m:
            raise BadRequest(f"messages.{i}.content: Field required", param=f"messages.{i}.content")
        blocks: list[tuple[int, int, Any]] = []
        if isinstance(content, list):
            for j, b in enumerate(content):
                if not isinstance(b, dict) or not isinstance(b.get("type"), str):
                    raise BadRequest(f"messages.{i}.content.{j}.type: Field required",
                                     param=f"messages.{i}.content.{j}.type")
                if b["type"] == "tool_result" and not isinstance(b.get("tool_use_id"), str):  # paired by it
                    raise BadRequest(f"messages.{i}.content.{j}.tool_use_id: Input should be a valid string",
                                     param=f"messages.{i}.content.{j}.tool_use_id")
                blocks.append((i, j, b))
        elif not isinstance(content, str):
            raise BadRequest(f"messages.{i}.content: Input should be a valid string or a list of content blocks",
                             param=f"messages.{i}.content")
        if role == "system":  # a mid-conversation instruction (Claude Code sends them): its placement is the
            continue           # provider's to judge, and it stands outside the tool_use / tool_result pairing
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    _check_pairing(turns)


def _check_pairing(turns: list[tuple[str, list[tuple[int, int, Any]]]]) -> None:
    asked: set[str] = set()  # tool_use ids of the assistant turn just before
    for n, (role, blocks) in enumerate(turns):
        if role == "assistant":
            asked = set()
            for i, j, b in blocks:
                if b["type"] == "tool_use":
                    if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                        raise BadRequest(f"messages.{i}.content.{j}: a tool_use block needs a string id and name",
                                         param=f"messages.{i}.content.{j}")
                    asked.add(b["id"])
            if asked and n + 1 < len(turns):
                answered = {b.get("tool_use_id") for _, _, b in turns[n + 1][1] if b["type"] == "tool_result"}
                missing = sorted(asked - answered)
                if missing:
                    i = blocks[-1][0]
                    raise BadRequest(f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                                     f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                                     f"corresponding `tool_result` block in the next message.",
                                     param=f"messages.{i}")
            continue
        for i, j, b in blocks:
            if b["type"] != "tool_result":
                continue
            tid = b.get("tool_use_id")
            if not isinstance(tid, str) or tid not in asked:
                raise BadRequest(f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                                 f"blocks: {tid}. Each `tool_result` block must have a corresponding `tool_use` "
                                 f"block in the previous message.", param=f"messages.{i}.content.{j}")
            content = b.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise BadRequest(f"messages.{i}.content.{j}.content: Input should be a valid string or a list "
                                 "of content blocks", param=f"messages.{i}.content.{j}.content")
        asked = set()
