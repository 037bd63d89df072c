"""Offload: oversized tool results and user messages are stored whole and replaced by a preview.

One `cat` of a log puts 50k-800k characters into the history and every later
turn pays for it again. Offloading keeps it out of the prompt without losing
it: the text goes to the tenant's archive, the prompt gets a bounded preview
naming a handle, and the model reads the rest with the proxy-owned
`context_read` tool.

Byte-stable: the decision and placeholder for a piece of content are recorded
the first time and replayed verbatim afterwards, whatever the settings say
then, on any replica. The text is stored before the rewritten request leaves.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from proxy.archive import Archive, content_handle
from proxy.conversation import Conversation, Event, RequestContext
from proxy.preview import PreviewShape, build_placeholder
from proxy.readback import tool_name_for
from proxy.tokens import default_counter

# The smallest threshold allowed; texts under this many UTF-8 bytes (so tokens)
# can never have been offloaded, so they are not even looked up.
MIN_THRESHOLD_TOKENS = 256
DECISION_KIND = "offload"
_USER_SHARE_FACTOR = 2  # a user message may take twice the window share a tool result may
_DECISION_CACHE = 20_000  # (tenant, handle) decisions remembered in process


class OffloadSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    tool_result_tokens: int = Field(default=20_000, ge=MIN_THRESHOLD_TOKENS)  # offload a tool result over this
    user_message_tokens: int = Field(default=50_000, ge=MIN_THRESHOLD_TOKENS)  # ... a user message over this
    preview_head_lines: int = Field(default=10, ge=0)  # first lines shown in the placeholder
    preview_tail_lines: int = Field(default=5, ge=0)  # last lines shown
    preview_line_chars: int = Field(default=200, ge=40)  # each preview line cut to this many characters
    preview_max_share: float = Field(default=0.25, gt=0, lt=1)  # a preview costs at most this share of the original
    retention_days: float = Field(default=7, gt=0)  # how long stored text stays readable
    # Thresholds never exceed this share of the model's window (twice it for user messages), so a
    # small local model gets early offloading without retuning (32k window: tool results over 8k tokens).
    max_window_share: float = Field(default=0.25, gt=0, le=1)


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") in ("text", "input_text")
                 and isinstance(p.get("text"), str)]
        return "\n".join(texts) if texts else None
    return None


def _with_placeholder(message: dict[str, Any], placeholder: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": placeholder}
    parts, placed = [], False
    for p in content:
        if isinstance(p, dict) and p.get("type") in ("text", "input_text") and isinstance(p.get("text"), str):
            if not placed:
                parts.append({**p, "text": placeholder})
                placed = True
            continue
        parts.append(p)
    return {**message, "content": parts}


def _call_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    names = {}
    for m in messages:
        for call in m.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                names[call.get("id")] = call["function"].get("name") or "?"
    return names


class Offload:
    name: ClassVar[str] = "offload"
    Settings: ClassVar[type[BaseModel]] = OffloadSettings

    def __init__(self, settings: OffloadSettings) -> None:
        self.settings = settings
        self._decided: OrderedDict[tuple[str, str], dict[str, Any] | bool] = OrderedDict()
        self._handles: OrderedDict[bytes, tuple[str, str]] = OrderedDict()  # message digest -> (handle, what)

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        s = self.settings
        tools = conv.body.get("tools")
        read_name = tool_name_for(tools or [])
        archive = Archive(ctx.store, ctx.tenant, s.retention_days)
        found = self._candidates(conv)
        decisions = await self._decisions(archive, ctx.tenant, [c[1] for c in found])
        messages = list(conv.messages)
        events = []
        for (i, handle, text, what), decision in zip(found, decisions):
            if decision is False:
                continue
            if decision is None:
                decision = await self._decide(archive, conv, messages[i], handle, text, what, read_name, ctx.window)
                self._remember(ctx.tenant, handle, decision or False)
                if not decision:
                    continue
            messages[i] = _with_placeholder(messages[i], decision["placeholder"])
            events.append(Event("offload", {"handle": handle, "tokens": decision["tokens"],
                                            "saved": decision["tokens"] - decision["preview_tokens"]}))
        if events:
            conv.set_messages(messages)
            conv.events.extend(events)
        return conv

    def _candidates(self, conv: Conversation) -> list[tuple[int, str, str, str]]:
        """Messages big enough to have been offloaded, with their handles (hashed once per content)."""
        messages = conv.messages
        names = None
        out = []
        for i, m in enumerate(messages):
            role = m.get("role")
            if role not in ("tool", "function", "user"):
                continue
            text = _text_of(m.get("content"))
            if text is None or len(text) < MIN_THRESHOLD_TOKENS // 4:
                continue
            if len(text) < MIN_THRESHOLD_TOKENS and len(text.encode("utf-8", "surrogatepass")) < MIN_THRESHOLD_TOKENS:
                continue
            digest = conv.digest(m)
            known = self._handles.get(digest)
            if known is None:
                if role == "user":
                    what = "user message"
                else:
                    names = names if names is not None else _call_names(messages)
                    what = f"tool result of {names.get(m.get('tool_call_id'), m.get('name') or 'a tool')}"
                known = self._handles[digest] = (content_handle(f"{role}:{what}", text), what)
                if len(self._handles) > _DECISION_CACHE:
                    self._handles.popitem(last=False)
            out.append((i, known[0], text, known[1]))
        return out

    async def _decisions(self, archive: Archive, tenant: str, handles: list[str]) -> list[Any]:
        known = [self._decided.get((tenant, h)) for h in handles]
        missing = [h for h, d in zip(handles, known) if d is None]
        if missing:
            fetched = dict(zip(missing, await archive.decisions(DECISION_KIND, missing)))
            known = [d if d is not None else fetched.get(h) for h, d in zip(handles, known)]
            for h in missing:
                if fetched.get(h) is not None:
                    self._remember(tenant, h, fetched[h])
        return known

    async def _decide(self, archive: Archive, conv: Conversation, message: dict[str, Any], handle: str, text: str,
                      what: str, read_name: str, window: int) -> dict[str, Any] | None:
        s = self.settings
        if message.get("role") == "user":  # the task itself: offloaded only when truly huge for the window
            limit = min(s.user_message_tokens, int(window * s.max_window_share * _USER_SHARE_FACTOR))
        else:
            limit = min(s.tool_result_tokens, int(window * s.max_window_share))
        limit = max(MIN_THRESHOLD_TOKENS, limit)
        model = conv.body.get("model")
        tokens = default_counter.count_message(message, model)
        if tokens <= limit:
            return None
        shape = PreviewShape(s.preview_head_lines, s.preview_tail_lines, s.preview_line_chars, s.preview_max_share)
        placeholder = build_placeholder(text, what=what, handle=handle, tool=read_name, tokens=tokens, shape=shape,
                                        count=lambda t: default_counter.count_text(t, model))
        if placeholder is None:
            return None
        await archive.put_text(handle, text)
        decision = {"placeholder": placeholder, "tokens": tokens,
                    "preview_tokens": default_counter.count_text(placeholder, model)}
        return await archive.record(DECISION_KIND, handle, decision)

    def _remember(self, tenant: str, handle: str, decision: dict[str, Any] | bool) -> None:
        self._decided[(tenant, handle)] = decision
        self._decided.move_to_end((tenant, handle))
        if len(self._decided) > _DECISION_CACHE:
            self._decided.popitem(last=False)
