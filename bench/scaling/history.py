"""The real history the requests carry, and the request bodies made of it."""

from __future__ import annotations

import glob
import os
from typing import Any

from bench.paths import traces_dir
from bench.scaling.config import MODEL


def build_history(n_max: int, corpus: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools): n_max real messages from the mini-swe-agent trajectories, as described above.

    `corpus`: the trajectory directory; default ``$CTXPROXY_TRACES_DIR``."""
    import orjson

    corpus = traces_dir(corpus)
    paths = sorted(glob.glob(os.path.join(corpus, "*mini-swe-agent*.json")))
    if not paths:
        raise SystemExit(f"no mini-swe-agent trajectories in {corpus}")
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    for k, path in enumerate(paths):
        with open(path, "rb") as f:
            data = orjson.loads(f.read())
        msgs = data["messages"]
        if not messages:
            messages.append(msgs[0])
            tools = data.get("tools") or []
        for m in msgs[1:]:
            if m.get("role") == "system":
                continue
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "id": f"t{k}_{c.get('id')}"} for c in m["tool_calls"]]
            if m.get("role") == "tool" and m.get("tool_call_id"):
                m["tool_call_id"] = f"t{k}_{m['tool_call_id']}"
            messages.append(m)
            if len(messages) >= n_max:
                return messages, tools
    raise SystemExit(f"only {len(messages)} messages in the mini-swe-agent trajectories, {n_max} asked")


def variant(message: dict[str, Any], k: int) -> dict[str, Any]:
    """The same message with new text (a new digest), role and tool-call ids unchanged."""
    m = dict(message)
    c = m.get("content")
    if isinstance(c, str) or c is None:
        m["content"] = (c or "") + f" [variant {k}]"
    elif isinstance(c, list):
        m["content"] = [*c, {"type": "text", "text": f"[variant {k}]"}]
    return m


def body(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    """A request body of `messages` (and `tools`)."""
    import orjson

    b: dict[str, Any] = {"model": MODEL, "messages": messages}
    if tools:
        b["tools"] = tools
    return orjson.dumps(b)
