"""A crafted agent session with known figures, and the figures computed without the proxy's code.

Three requests through a 6,000-token window: the first offloads two tool
results, the second re-sends them (nothing new) and offloads one more, the
third adds six medium results, which triggers one compaction (lossless
clearing). Token counts are recomputed here with tiktoken o200k_base (the
mock's own encoding), from the client's bodies and from what the mock
upstream received, by the counting rules the README documents.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from mock_upstream import encoding

MODEL = "small-agent-model"
WINDOW = 6000
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {
    "cmd": {"type": "string"}}}}}]
DEFAULTS = {"offload": {"tool_result_tokens": 1000}, "compress": {"summary": False, "target": 0.5}}


def _result(tag: str, lines: int) -> str:
    return "\n".join(f"{tag} {i}: worker {i * 7919 % 100003} processed batch {i * 31 % 997} ok" for i in range(lines))


def _turn(i: int, text: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{i}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat log_{i}.txt"})}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": text}]


def requests() -> list[list[dict[str, Any]]]:
    """The three client histories, each extending the one before."""
    head = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Find which worker failed."}]
    r1 = head + _turn(1, _result("big-1", 90)) + _turn(2, _result("big-2", 90))
    r2 = r1 + _turn(3, _result("big-3", 90))
    r3 = r2 + [m for i in range(4, 10) for m in _turn(i, _result(f"mid-{i}", 45))]
    return [r1, r2, r3]


# --------------------------------------------------------------------------- counting, independently

def n(text: str) -> int:
    return len(encoding().encode_ordinary(text)) if text else 0


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def message_tokens(m: dict[str, Any]) -> int:
    """3 per message, its role, name (+1), text content, tool_call_id, and each tool call (3 + name + arguments)."""
    out = 3 + n(m["role"])
    if m.get("name") is not None:
        out += 1 + n(m["name"])
    content = m.get("content")
    if isinstance(content, str):
        out += n(content)
    elif isinstance(content, list):
        out += sum(n(p["text"]) for p in content)
    out += n(m.get("tool_call_id") or "")
    for c in m.get("tool_calls") or ():
        out += 3 + n(c["function"]["name"]) + n(c["function"]["arguments"])
    return out


def tool_tokens(tools: list[dict[str, Any]] | None) -> int:
    return sum(8 + n(_canonical(t.get("function", t))) for t in tools or ())


def prompt_tokens(body: dict[str, Any]) -> int:
    return sum(map(message_tokens, body["messages"])) + tool_tokens(body.get("tools"))


@dataclass
class Expected:
    """What one request saved, split the way the README defines it, from the two bodies alone."""

    saved: int
    offload: int
    compress: int
    added: int
    placeholders: int


def expected(client: dict[str, Any], sent: dict[str, Any]) -> Expected:
    """Tool results are matched by tool_call_id; statuses and the read tool are what the proxy added."""
    theirs = {m["tool_call_id"]: m for m in client["messages"] if m["role"] == "tool"}
    offload = compress = added = placeholders = 0
    for m in sent["messages"]:
        text = m.get("content") if isinstance(m.get("content"), str) else ""
        if text.startswith("<agent_status>"):
            added += message_tokens(m)
        elif m["role"] == "tool" and m != theirs[m["tool_call_id"]]:
            diff = message_tokens(theirs[m["tool_call_id"]]) - message_tokens(m)
            if " stored whole (" in text.split("\n", 1)[0]:
                offload += diff
                placeholders += 1
            else:
                assert text.startswith("[ctxproxy: cleared tool result"), text[:200]
                compress += diff
    others = [m for m in sent["messages"] if m["role"] != "tool" and not str(m.get("content")).startswith("<agent")]
    assert others == [m for m in client["messages"] if m["role"] != "tool"]  # nothing else was touched
    added += tool_tokens(sent.get("tools")) - tool_tokens(client.get("tools"))
    saved = prompt_tokens(client) - prompt_tokens(sent)
    assert saved == offload + compress - added
    return Expected(saved, offload, compress, added, placeholders)


@dataclass
class Run:
    session: str
    responses: list[httpx.Response] = field(default_factory=list)
    expected: list[Expected] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(getattr(e, name) for e in self.expected)


def drive(proxy: Any, upstream: Any, key: str, session: str) -> Run:
    """Send the three requests; what each saved is computed from the client's body and the mock's."""
    upstream.windows[MODEL] = WINDOW
    run = Run(session)
    for msgs in requests():
        body = {"model": MODEL, "messages": msgs, "tools": TOOLS}
        r = proxy.post("/v1/chat/completions", json=body, timeout=30,
                       headers={"authorization": f"Bearer {key}", "x-session-id": session})
        assert r.status_code == 200, r.text
        run.responses.append(r)
        run.expected.append(expected(body, upstream.requests[-1].json))
    return run


# --------------------------------------------------------------------------- a run with a summary, for the inspector

SUMMARY = ("## Goal and constraints\nFind which worker failed.\n## Decisions and why\nRead each worker log in turn.\n"
           "## Files and artifacts\nThe worker logs mid-2 to mid-9.\n## Verified state\nWorker 17 failed in batch "
           "731; the other workers are fine.\n## Open TODOs\nFind why worker 17 failed.\n## Approaches that failed\n"
           "None.\n## Next step\nRead worker 17's log.")
INSPECT_DEFAULTS = {"offload": {"tool_result_tokens": 1000}}  # compression with its LLM summary, status bar on


def answer(body: dict[str, Any]) -> str:
    """The mock's reply: the agent's requests end with the status bar; anything else is the summarizer."""
    last = body["messages"][-1].get("content")
    return "ok" if isinstance(last, str) and last.startswith("<agent_status>") else SUMMARY


def summary_requests() -> list[list[dict[str, Any]]]:
    """Request 1 offloads one result; request 2 adds eight medium ones, which compacts with a summary."""
    head = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Find which worker failed."}]
    r1 = head + _turn(1, _result("big-1", 90))
    r2 = r1 + [m for i in range(2, 10) for m in _turn(i, _result(f"mid-{i}", 45))]
    return [r1, r2]


def drive_summary(proxy: Any, upstream: Any, key: str, session: str) -> list[dict[str, Any]]:
    """Send the two requests; returns what the mock received for each agent request, in order."""
    upstream.windows[MODEL] = WINDOW
    upstream.script(*[answer] * 10)
    agent = []
    for msgs in summary_requests():
        r = proxy.post("/v1/chat/completions", timeout=30,
                       json={"model": MODEL, "messages": msgs, "tools": TOOLS},
                       headers={"authorization": f"Bearer {key}", "x-session-id": session})
        assert r.status_code == 200, r.text
        agent.append(upstream.requests[-1].json)
    assert agent[-1]["messages"][2]["content"].startswith("<context_summary>")  # the run compacted with a summary
    return agent
