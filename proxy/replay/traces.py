"""Recorded agent trajectories: reading them, and the requests an agent sent while recording them.

A trace file is JSON: an object with ``messages`` (OpenAI chat messages) and
optionally ``tools`` and ``model`` (the corpus format of ``proxy/examples/``,
whose other keys - ``source``, ``license``, ... - are kept but not used), or a
bare list of messages. Each assistant message at index i > 0 marks one turn:
the agent sent ``messages[:i]`` (with the tools) and the model answered with
message i. Replaying sends those requests again; the answers are ignored.

A Responses trace (``api: "responses"`` with ``items``: the shared
traces-native format) is read by proxy/replay/traces_responses.py, which also
converts chat trajectories into Responses requests for ``--api responses``;
a Messages trace (``api: "messages"``: Anthropic's Messages API, Claude Code)
likewise by proxy/replay/traces_messages.py, for ``--api messages``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from proxy.replay import traces_messages, traces_responses
from proxy.replay.trace_text import NativeTraceError

DEFAULT_MODEL = "gpt-4o"
# A recorded model name worth sending on: "gpt-4o", "claude-sonnet-4-20250514", "google/gemini-3-pro-preview".
# Free text such as "not recorded (demonstration)" or "gpt4" is not one; those traces use DEFAULT_MODEL.
_MODEL_ID = re.compile(r"^[A-Za-z][\w.:/]*-[\w.:/-]+$")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class TraceError(Exception):
    """A trace file that cannot be replayed; the message says why, in one line."""


@dataclass
class Trace:
    name: str
    path: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    model: str = DEFAULT_MODEL
    meta: dict[str, Any] = field(default_factory=dict)
    api: Literal["chat", "responses", "messages"] = "chat"  # the API its requests are sent in
    # api "responses": the input items (`tools` are then flat); api "messages": the Messages-shape messages
    # (`tools` then {name, description, input_schema})
    items: list[dict[str, Any]] | None = None
    instructions: str | None = None  # api "responses"
    ends: list[int] | None = None  # api "responses" / "messages": each turn's input length, in items
    native: bool = False  # recorded in the Responses or Messages API (no chat messages)
    system: Any = None  # api "messages": the top-level system prompt (a string or text blocks)

    def turns(self) -> list[int]:
        """Per turn, how much of the trace was sent: the index of the assistant message that answered it (chat),
        or the number of input items (Responses) or messages (Messages)."""
        if self.ends is not None:
            return list(self.ends)
        return [i for i, m in enumerate(self.messages) if i > 0 and m.get("role") == "assistant"]

    @property
    def entries(self) -> list[dict[str, Any]]:
        """What `turns()` counts: the messages, or the Responses items / Messages messages."""
        return self.items if self.api != "chat" and self.items is not None else self.messages

    def request(self, i: int) -> dict[str, Any]:
        """The request the agent sent for turn `i` (an entry of `turns()`) in the trace's API."""
        if self.api == "responses":
            return traces_responses.request(self.model, self.instructions, (self.items or [])[:i], self.tools)
        if self.api == "messages":
            return traces_messages.request(self.model, self.system, (self.items or [])[:i], self.tools)
        body: dict[str, Any] = {"model": self.model, "messages": self.messages[:i]}
        if self.tools:
            body["tools"] = self.tools
        return body


def _model_of(data: dict[str, Any]) -> str:
    for value in (data.get("model"), (data.get("origin") or {}).get("model") if isinstance(data.get("origin"), dict)
                  else None):
        if isinstance(value, str) and _MODEL_ID.match(value.strip()):
            return value.strip()
    return DEFAULT_MODEL


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise TraceError(f"'messages' must be a list, got {type(messages).__name__}")
    if not messages:
        raise TraceError("'messages' is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TraceError(f"messages[{i}] is a {type(m).__name__}, not an object")
        if m.get("role") not in _ROLES:
            raise TraceError(f"messages[{i}] has no valid role (got {m.get('role')!r})")
    return messages


def load_trace(path: str | Path) -> Trace:
    """Read one trace file; TraceError (one line) if it cannot be read or is not a trajectory."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError("no such file") from None
    except IsADirectoryError:
        raise TraceError("is a directory") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(getattr(e, "strerror", None) or str(e)) from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise TraceError(f"not valid JSON ({e})") from None
    if isinstance(data, dict) and (data.get("api") not in (None, "chat")
                                   or ("items" in data and "messages" not in data)):
        return _native(p, data)
    if isinstance(data, list):
        messages, tools, meta, model = _check_messages(data), None, {}, DEFAULT_MODEL
    elif isinstance(data, dict):
        if "messages" not in data:
            raise TraceError("a JSON object without 'messages'")
        messages = _check_messages(data["messages"])
        tools = data.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise TraceError("'tools' must be a list of objects")
        meta = {k: v for k, v in data.items() if k not in ("messages", "tools")}
        model = _model_of(data)
    else:
        raise TraceError(f"expected a JSON object with 'messages' or a list of messages, got {type(data).__name__}")
    trace = Trace(p.stem, str(p), messages, tools or None, model, meta)
    if not trace.turns():
        raise TraceError("no assistant message after the first message, so no turn to replay")
    return trace


def _native(p: Path, data: dict[str, Any]) -> Trace:
    if data.get("api") == "messages":
        return _native_messages(p, data)
    if data.get("api") not in ("responses", None):
        raise TraceError(f"a trace of the {data.get('api')!r} API; ctxproxy replay sends chat, Responses or "
                         "Messages requests")
    try:
        items, tools, instructions = traces_responses.check_native(data)
    except NativeTraceError as e:
        raise TraceError(str(e)) from None
    meta = {k: v for k, v in data.items() if k not in ("items", "tools", "instructions")}
    return Trace(p.stem, str(p), [], tools, _model_of(data), meta, api="responses", items=items,
                 instructions=instructions, ends=traces_responses.native_ends(items), native=True)


def _native_messages(p: Path, data: dict[str, Any]) -> Trace:
    try:
        items, tools, system, ends = traces_messages.check_native(data)
    except NativeTraceError as e:
        raise TraceError(str(e)) from None
    meta = {k: v for k, v in data.items() if k not in ("items", "tools", "system")}
    return Trace(p.stem, str(p), [], tools, _model_of(data), meta, api="messages", items=items, ends=ends,
                 native=True, system=system)


def example_paths() -> list[Path]:
    """The trajectories shipped in proxy/examples/ (MIT-licensed; each file names its source)."""
    folder = resources.files("proxy") / "examples"
    return sorted((Path(str(folder / name)) for name in (x.name for x in folder.iterdir())
                   if name.endswith(".json")), key=lambda x: x.name)


def as_responses(trace: Trace) -> Trace:
    """The trace as Responses requests (a native Responses trace as it is)."""
    if trace.api == "responses":
        return trace
    instructions, items, starts = traces_responses.convert_messages(trace.messages)
    return dataclasses.replace(trace, api="responses", items=items, instructions=instructions,
                               tools=traces_responses.convert_tools(trace.tools),
                               ends=[starts[i] for i in trace.turns()])


def as_messages(trace: Trace) -> Trace:
    """The trace as Messages requests (a native Messages trace as it is)."""
    if trace.api == "messages":
        return trace
    system, messages = traces_messages.convert_messages(trace.messages)
    return dataclasses.replace(trace, api="messages", items=messages, system=system,
                               tools=traces_messages.convert_tools(trace.tools),
                               ends=traces_messages.assistant_ends(messages), instructions=None)
