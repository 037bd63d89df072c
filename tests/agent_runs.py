"""Synthetic agent conversations shared by the tests that drive traffic through the proxy."""

from __future__ import annotations

import json

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("bash", "edit")]


def conversation(turns: int) -> list[dict]:
    """A coding-agent history over 1024 tokens (so the provider caches it), one bash call per turn."""
    msgs = [{"role": "system", "content": "You are a coding agent. " + "Be careful. " * 300},
            {"role": "user", "content": "Fix the failing test in tests/test_core.py"}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                     "function": {"name": "bash", "arguments": json.dumps({"cmd": f"sed -n {i},+40p core.py"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i}: value = {i * 7}\n" * 60})
    return msgs
