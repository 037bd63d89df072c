"""A scripted model for the mock upstream (tests/mock_upstream.py) that drives a real agent binary.

`ShellAgent` is a script entry: a callable the mock asks for each reply. Given
the request a client sent, it answers the way a model working a task would:
with a call of the client's *own* shell tool, found by name in the request's
`tools` (Codex's `exec_command`, `shell_command` or `shell`; Claude Code's
`Bash`; Gemini CLI's `run_shell_command`, among a Gemini request's
`functionDeclarations`), whose command prints a big output, `calls` times,
then a final text.
The client runs each command for real and sends its output back, so the
history grows by one large tool result per turn, as in a real session.

A request that is not the agent's turn gets text, never a call: one that
offers none of those tools (a side request: a title, a transcript summary),
and one whose last user turn says not to call tools (Claude Code's own
compaction and the proxy's in-place summary call). The text is a summary
written under the headings the instruction asks for, so a summarizer that
checks for its headings accepts it. The proxy's `context_read` is never
called: the scripted model does not need what an offloaded result held.

Replies are counted in the agent, not read back from the history: a proxy
that compacts the history must not make the agent start over.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

# The arguments each known shell tool takes for one command line.
SHELL_TOOLS: dict[str, Callable[[str], dict[str, Any]]] = {
    "exec_command": lambda cmd: {"cmd": cmd},  # Codex's unified exec (its default)
    "shell_command": lambda cmd: {"command": cmd},  # Codex's string-command shell
    "shell": lambda cmd: {"command": ["bash", "-lc", cmd]},  # Codex's argv shell
    "Bash": lambda cmd: {"command": cmd, "description": "Print a long listing"},  # Claude Code
    # Gemini CLI: {command, description, dir_path?, is_background?, delay_ms?}, only `command` required
    "run_shell_command": lambda cmd: {"command": cmd, "description": "Print a long listing"},
}
_NO_TOOLS = re.compile(r"\bdo not (?:call|use) (?:any )?tools?\b", re.IGNORECASE)
_HEADING = re.compile(r"## ([A-Z][^,.\n#]*[^,.\n# ])")


def tool_names(body: dict[str, Any]) -> list[str]:
    """Every function tool's name in a Chat, Responses, Messages or Gemini request (Responses namespaces included;
    a Gemini tool's `functionDeclarations`)."""
    names: list[str] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        decls = tool.get("functionDeclarations", tool.get("function_declarations"))
        if isinstance(decls, list):
            names += [d["name"] for d in decls if isinstance(d, dict) and isinstance(d.get("name"), str)]
            continue
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
        if isinstance(name, str):
            names.append(name)
        names += tool_names({"tools": tool.get("tools")}) if isinstance(tool.get("tools"), list) else []
    return names


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            and p.get("type") in ("text", "input_text", None)]


def _gemini_texts(content: Any) -> list[str]:
    """A Gemini content's text parts (not its thoughts); a functionResponse carries no instruction."""
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p["text"] for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str)
            and not p.get("thought")]


def last_user_texts(body: dict[str, Any]) -> list[str]:
    """The texts of the request's last user turn: the trailing non-assistant messages (Chat, Responses), the
    last user message and the system messages after it (Messages), or the last content if it is the user's
    (Gemini); tool results carry no instruction."""
    if isinstance(body.get("contents"), list):
        last = body["contents"][-1] if body["contents"] else None
        return _gemini_texts(last) if isinstance(last, dict) and last.get("role", "user") == "user" else []
    items = body.get("input") if isinstance(body.get("input"), list) else body.get("messages")
    if isinstance(body.get("input"), str):
        return [body["input"]]
    texts: list[str] = []
    for item in reversed(items or []):
        if not isinstance(item, dict) or item.get("role") in ("assistant", None) or item.get("type") not in (
                None, "message"):
            break
        texts = _texts(item.get("content")) + texts
        if "messages" in body and item.get("role") != "system":  # a Messages turn is one message (and any
            break                                                # mid-conversation system messages after it)
    return texts


def summary_text(instruction: str, calls: int) -> str:
    """What a model asked to summarize writes: the headings the instruction names, each with a line."""
    facts = (f"The task was to run a long listing command; it ran {calls} time(s) and each run printed "
             "thousands of numbered lines with exit code 0. Nothing else was changed.")
    headings = list(dict.fromkeys(_HEADING.findall(instruction))) or ["Summary"]
    return "\n\n".join(f"## {h}\n{facts}" for h in headings)


class ShellAgent:
    """`calls` shell calls of `command`, then `final`; see the module docstring. Thread-safe.

    `{n}` in `command` is the call's number (from 1), so that each output differs, as a session's do.
    """

    def __init__(self, command: str, calls: int, final: str = "All done: the listing ran as asked.") -> None:
        self.command, self.calls, self.final = command, calls, final
        self.made = 0  # shell calls answered so far
        self.summaries = 0  # requests answered with a summary instead
        self.tools_seen: list[str] = []  # the shell tool of each call made
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str | dict[str, Any]:
        names = tool_names(body)
        tool = next((n for n in SHELL_TOOLS if n in names), None)
        asked = "\n".join(last_user_texts(body))
        with self._lock:
            if tool is None or _NO_TOOLS.search(asked):
                self.summaries += 1
                system = _texts(body.get("system")) + _gemini_texts(
                    body.get("systemInstruction", body.get("system_instruction")))
                instruction = asked if tool is not None else "\n".join(system) + asked
                return summary_text(instruction, self.made)
            if self.made >= self.calls:
                return self.final
            self.made += 1
            self.tools_seen.append(tool)
            command = self.command.replace("{n}", str(self.made))
        return {"tool_calls": [{"name": tool, "arguments": SHELL_TOOLS[tool](command)}]}
