"""The Gemini API's shapes for the read-back loop (proxy/rewrite/context_read/loop.py).

A reply's calls are its first candidate's `functionCall` parts; the
conversation goes on with the candidate's parts as a model turn (thought parts
and `thoughtSignature`s included, as the API requires) and the proxy's
`functionResponse`s as the next user turn. Streamed, chunks carry no numbering:
the client gets every chunk of every round, the proxy's call parts taken out
as they pass (a call arrives whole, in one chunk), and one last chunk, its
finish held until the round ends, whose usage covers every round.
"""

from __future__ import annotations

from typing import Any

from proxy.wire import jsonio
from proxy.wire.read_shape import BaseShape, Call, IllFormed, Reply, call_arguments, loaded


def reply_parts(data: Any) -> list[Any] | None:
    """The first candidate's parts of a GenerateContentResponse ([] for a candidate without content); None if
    `data` is not one."""
    candidates = data.get("candidates") if isinstance(data, dict) else None
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
        return None
    content = candidates[0].get("content")
    parts = content.get("parts") if isinstance(content, dict) else []
    return parts if isinstance(parts, list) else None


def _merged(parts: list[Any]) -> list[Any]:
    """Streamed text pieces joined into one part (a part with anything besides its text, such as a signature or a
    thought flag, stays as it came)."""
    out: list[Any] = []
    for p in parts:
        if out and isinstance(p, dict) and set(p) == {"text"} and isinstance(out[-1], dict) \
                and set(out[-1]) == {"text"} and isinstance(p["text"], str) and isinstance(out[-1]["text"], str):
            out[-1] = {"text": out[-1]["text"] + p["text"]}
        else:
            out.append(p)
    return out


def _with_parts(data: dict[str, Any], parts: list[Any], *, finish: bool = True) -> dict[str, Any]:
    """The chunk with its first candidate's parts replaced (and, `finish` False, its finish taken off)."""
    candidate = dict(data["candidates"][0])
    content = candidate.get("content")
    candidate["content"] = {**(content if isinstance(content, dict) else {"role": "model"}), "parts": parts}
    if not finish:
        candidate.pop("finishReason", None)
    return {**data, "candidates": [candidate, *data["candidates"][1:]]}


class GeminiReadShape(BaseShape):
    """Gemini chunks carry no numbering across rounds: the shape is its own stream state, each round afresh."""

    ends_with = "a finishReason"
    usage_field = "usageMetadata"

    def is_ours(self, part: Any) -> bool:
        fc = part.get("functionCall") if isinstance(part, dict) else None
        return isinstance(fc, dict) and fc.get("name") == self.tool

    def _reply(self, data: dict[str, Any], parts: list[Any], usage: Any) -> Reply:
        ours, sent = [], []  # sent: the parts as the next round carries them back
        for p in parts:
            if self.is_ours(p):
                fc = p["functionCall"]
                ours.append(Call(fc["id"] if isinstance(fc.get("id"), str) else None, call_arguments(fc.get("args"))))
                if not ours[-1].arguments:  # unwritable args: answered as bad arguments, sent back empty
                    p = {**p, "functionCall": {**fc, "args": {}}}
            sent.append(p)
        calls = sum(1 for p in parts if isinstance(p, dict) and isinstance(p.get("functionCall"), dict))
        return Reply(data, ours, calls - len(ours), [{"role": "model", "parts": _merged(sent)}], usage)

    def reply(self, content: bytes) -> Reply:
        data = loaded(content)
        parts = reply_parts(data)
        if parts is None:
            raise IllFormed("not a GenerateContentResponse with a candidate")
        return self._reply(data, parts, data.get("usageMetadata"))

    def without_ours(self, reply: Reply) -> dict[str, Any]:
        parts = reply_parts(reply.data) or []
        return _with_parts(reply.data, [p for p in parts if not self.is_ours(p)])

    def stream_state(self) -> GeminiReadShape:
        return self

    def round(self, hidden: bool) -> GeminiRound:
        return GeminiRound(self, hidden)


class GeminiRound:
    def __init__(self, shape: GeminiReadShape, hidden: bool) -> None:
        self.shape, self.hidden = shape, hidden
        self.finished = False
        self.parts: list[Any] = []  # every part of the round, in order (the model turn that continues it)
        self.usage: Any = None
        self.took = False  # a call of the proxy's was taken out of a chunk
        self._held: list[tuple[bytes, dict[str, Any]]] = []  # the finishing chunk, until the round ends

    def event(self, data: Any, raw: bytes) -> bytes:
        if not isinstance(data, dict):
            raise IllFormed("an event that is not a chunk")
        if isinstance(data.get("usageMetadata"), dict):
            self.usage = data["usageMetadata"]
        parts = reply_parts(data)
        candidates = data.get("candidates")
        if parts is None or not isinstance(candidates, list):
            if candidates is not None:
                raise IllFormed("a chunk whose candidates are not objects")
            return _plain(data) if self.hidden else raw  # a prompt's feedback, usage alone
        self.parts += parts
        ours = [p for p in parts if self.shape.is_ours(p)]
        self.took = self.took or bool(ours)
        visible = [p for p in parts if not self.shape.is_ours(p)] if ours else parts
        if candidates[0].get("finishReason"):
            self.finished = True
            if self.took or self.hidden:  # what it says now, its finish when the round ends
                self._held.append((raw, _with_parts(data, [])))
                return _plain(_with_parts(data, visible, finish=False)) if visible else b""
            self._held.append((raw, data))
            return b""
        if ours:
            return _plain(_with_parts(data, visible)) if visible else b""
        return _plain(data) if self.hidden else raw

    @property
    def hid(self) -> bool:
        return self.took

    def held(self) -> list[bytes]:
        return [raw for raw, _ in self._held]

    def reply(self) -> Reply:
        return self.shape._reply({}, self.parts, self.usage)

    def closing(self, reply: Reply, usage: Any) -> list[bytes]:
        """The held finishing chunk, with every round's usage."""
        out = []
        for raw, data in self._held:
            if usage is None and not self.took and not self.hidden:
                out.append(raw)
                continue
            out.append(_plain({**data, "usageMetadata": usage} if usage is not None else data))
        return out


def _plain(data: dict[str, Any]) -> bytes:
    """A chunk the proxy writes (rebuilt, or from a hidden round): one clean `data:` event."""
    return b"data: " + jsonio.dumps_any(data) + b"\n\n"
