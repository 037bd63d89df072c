"""The native Responses sessions (Codex CLI rollouts): loading them, and the request each turn sends.

The corpus of ``traces-native/`` (see its INDEX.md) keeps real sessions in the
API's own shape: ``items`` (messages, reasoning with its encrypted content,
function and custom tool calls and their outputs), ``tools`` and
``instructions``. Codex keeps no history on the provider (``store: false``):
every request sends the whole input so far. So a turn is the input up to and
including each tool output (the model is called again with the result), or
up to the last of a run of user messages (the user typed; Codex sends its
context messages and the prompt together). Each request carries what Codex
sends beside the input: ``prompt_cache_key`` = the session id and
``include: ["reasoning.encrypted_content"]``. The model is the replay's
``gpt-4o`` for every setting, so ``--window`` applies to it as to the chat
corpus (the sessions recorded gpt-5-codex and others; the mock bills all
models alike).

The Claude Code sessions of the same corpus (``api: "messages"``: ``items``
are Messages-API messages, ``system``, ``tools`` with ``input_schema``) are
``NativeMessagesTrace``: a turn is the input up to each user message (tool
results sent back, or the user typing), up to the last recorded request; each
request carries ``max_tokens`` and Claude Code's cache breakpoints
(``messages_items.request``), model ``gpt-4o`` likewise.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bench.paths import ROOT
from bench.replay import messages_items
from bench.replay.responses_items import to_messages
from bench.replay.settings import MODEL
from bench.replay.traces import corpus_files

SIBLING_NATIVE = os.path.join(os.path.dirname(ROOT), "shared", "traces-native")
CALLS = ("function_call", "custom_tool_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output")
INCLUDE = ["reasoning.encrypted_content"]


def default_native_dir(traces_dir: str | None = None) -> str | None:
    """``shared/traces-native`` beside the repository, else ``traces-native`` beside the chat corpus; None if
    neither exists (a worktree elsewhere finds it through the corpus directory it was given)."""
    near = [SIBLING_NATIVE] + ([os.path.join(os.path.dirname(os.path.abspath(traces_dir)), "traces-native")]
                               if traces_dir else [])
    return next((d for d in near if os.path.isdir(d)), None)


@dataclass
class NativeTrace:
    """One recorded Responses session: its items in order, the tools and instructions Codex sent."""

    id: str  # "01"
    name: str  # file name without .json
    items: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    instructions: str | None
    session_id: str
    last_input: int  # `last_request_input_len`: the input length of the last request the session recorded

    def turns(self, final: bool = False) -> list[int]:
        """Input lengths of the requests the session sent: after each tool output that leaves no call
        unanswered (parallel calls go back together), and after each run of user messages, up to the last
        recorded request (`last_input`). `final` also keeps a turn after it (a tool output Codex recorded but
        never sent, e.g. an interrupted call's "aborted"), as the chat replay's --final-turn sends the turn an
        agent that kept going would send next."""
        out = []
        pending: set[Any] = set()  # calls not answered yet: parallel calls are sent back once all have outputs
        for i, it in enumerate(self.items):
            nxt = self.items[i + 1] if i + 1 < len(self.items) else None
            if it.get("type") in CALLS:
                pending.add(it.get("call_id"))
            elif it.get("type") in OUTPUTS:
                pending.discard(it.get("call_id"))
                if not pending:
                    out.append(i + 1)
            elif _is_user(it) and not (nxt is not None and _is_user(nxt)):
                out.append(i + 1)
        return [i for i in out if final or i <= self.last_input]

    def view(self, i: int) -> list[dict[str, Any]]:
        """The input of turn `i` as chat messages (identifiers, pairing and preview checks read these)."""
        return to_messages(self.items[:i], self.instructions)

    def body(self, i: int) -> dict[str, Any]:
        """The request Codex sent at turn `i`: the whole input so far, nothing stored."""
        body: dict[str, Any] = {"model": MODEL}
        if self.instructions:
            body["instructions"] = self.instructions
        body["input"] = self.items[:i]
        if self.tools:
            body["tools"] = self.tools
        body.update(store=False, include=INCLUDE, prompt_cache_key=self.session_id)
        return body


def _is_user(item: dict[str, Any]) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == "user"


def load_native(directory: str, select: Iterable[str] | None = None) -> list[NativeTrace]:
    """The Responses sessions of `directory` in file order; `select` keeps those whose id is listed."""
    out = []
    for tid, name, data in corpus_files(directory, select):
        if data.get("api") != "responses":
            continue
        recorded = data.get("recorded") or {}
        out.append(NativeTrace(tid, name, data["items"], data.get("tools") or None, data.get("instructions"),
                               str(recorded.get("session_id") or data.get("id") or name),
                               int(data.get("last_request_input_len") or len(data["items"]))))
    if not out:
        raise SystemExit(f"replay: no Responses session (api: responses) in {directory}")
    return out


@dataclass
class NativeMessagesTrace:
    """One recorded Claude Code session: its Messages-API messages in order, the tools and system it sent."""

    id: str  # "08"
    name: str
    items: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    system: Any
    last_input: int  # `last_request_input_len`: the messages of the last request the session recorded

    def turns(self, final: bool = False) -> list[int]:
        """Input lengths of the requests the session sent: after each user message (tool results or the user's
        words), up to the last recorded request; `final` also keeps one after it."""
        out = [k + 1 for k, m in enumerate(self.items) if m.get("role") == "user"
               and not (k + 1 < len(self.items) and self.items[k + 1].get("role") == "user")]
        return [i for i in out if final or i <= self.last_input]

    def view(self, i: int) -> list[dict[str, Any]]:
        """The input of turn `i` as chat messages (identifiers, pairing and preview checks read these)."""
        return messages_items.to_messages({"system": self.system, "messages": self.items[:i]})

    def body(self, i: int) -> dict[str, Any]:
        """The request Claude Code sent at turn `i`, with its breakpoints and max_tokens."""
        return messages_items.request(MODEL, self.system, self.items[:i], self.tools)


def load_native_messages(directory: str, select: Iterable[str] | None = None) -> list[NativeMessagesTrace]:
    """The Claude Code sessions (api: messages) of `directory` in file order; none is not an error (the
    corpus may hold only Codex sessions)."""
    out = []
    for tid, name, data in corpus_files(directory, select):
        if data.get("api") != "messages":
            continue
        out.append(NativeMessagesTrace(tid, name, data["items"], data.get("tools") or None, data.get("system"),
                                       int(data.get("last_request_input_len") or len(data["items"]))))
    return out
