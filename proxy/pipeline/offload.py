"""Offload: oversized tool results and user messages are stored whole and replaced by a preview.

One `cat` of a log puts 50k-800k characters into the history and every later
turn pays for it again. Offloading keeps it out of the prompt without losing
it: the text goes to the tenant's archive, the prompt gets a bounded preview
naming a handle, and the model reads the rest with the proxy-owned
`context_read` tool.

Byte-stable: the decision and placeholder for a piece of content are recorded
the first time and replayed verbatim afterwards, whatever the settings say
then, on any replica. The text is stored before the rewritten request leaves.

Never a stall: hashing, counting and previewing a big new text run off the
event loop (proxy/offloop.py); a replayed decision costs none of them.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import compress, count, repeat
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy import offloop
from proxy.archive import Archive, content_handle
from proxy.conversation import Conversation, Event, RequestContext
from proxy.preview import PreviewShape, build_placeholder, error_matcher
from proxy.trajectory import DEFAULT_ERROR_PATTERN
from proxy.readback import tool_name_for
from proxy.tokens import default_counter, is_estimated

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
    # A preview also shows the lines matching this anywhere in the text, with their line numbers (RE2
    # syntax; by default the status bar's error pattern), at most `preview_error_lines` of them.
    error_pattern: str = DEFAULT_ERROR_PATTERN
    preview_error_lines: int = Field(default=10, ge=0)

    @field_validator("error_pattern")
    @classmethod
    def _re2(cls, v: str) -> str:
        if error_matcher(v) is None:
            raise ValueError("must be a regular expression in RE2 syntax (no backreferences or lookaround)")
        return v


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
    names: dict[Any, str] = {}
    for m in messages:
        add_call_names(names, m)
    return names


def add_call_names(names: dict[Any, str], m: dict[str, Any]) -> None:
    for call in m.get("tool_calls") or ():
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            names[call.get("id")] = call["function"].get("name") or "?"


def sized_text(m: dict[str, Any]) -> str | None:
    """The text of a message that may be big enough to have been offloaded (cheap checks first)."""
    if m.get("role") not in ("tool", "function", "user"):
        return None
    text = _text_of(m.get("content"))
    if text is None or len(text) < MIN_THRESHOLD_TOKENS // 4:
        return None
    if len(text) < MIN_THRESHOLD_TOKENS and len(text.encode("utf-8", "surrogatepass")) < MIN_THRESHOLD_TOKENS:
        return None
    return text


def _sized(messages: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], str]]:
    return [(i, m, text) for i, m in enumerate(messages) if (text := sized_text(m)) is not None]


@dataclass
class _Seen:
    """What offload needs of a client history so far: tool-call names, and the messages big enough to matter."""

    names: dict[Any, str] = field(default_factory=dict)
    sized: list[tuple[int, str]] = field(default_factory=list)  # client positions and texts

    def copy(self) -> _Seen:
        return _Seen(dict(self.names), list(self.sized))

    def add(self, i: int, m: dict[str, Any]) -> None:
        add_call_names(self.names, m)
        text = sized_text(m)
        if text is not None:
            self.sized.append((i, text))


def _row(i: int, text: str, handle_what: tuple[str, str]) -> tuple[int, str, str, str]:
    return i, handle_what[0], text, handle_what[1]


@dataclass
class _Found:
    names: dict[Any, str]  # over all of conv.messages
    sized: list[tuple[int, str]]  # the client's candidates: (client position, text)
    known: int  # the first `known` of them are messages the session's memo knows
    at: dict[int, int] | None  # id -> position in conv.messages; None: positions are the client's
    others: list[tuple[int, dict[str, Any], str]]  # the proxy's own messages (re-inserted statuses)


def _scan(conv: Conversation, owner: object) -> _Found | None:
    """The candidates, following only the messages the session's memo does not know; None: scan them all.

    The client's messages are folded (resumed where the previous request of the
    session left off); the proxy's own messages among them (re-inserted statuses)
    are looked at directly. Anything unusual takes the plain way.
    """
    memo = conv.memo
    if memo is None:
        return None
    client, msgs = conv.client_messages, conv.messages
    seen = memo.fold((owner, "offload"), client, _Seen, _Seen.add, _Seen.copy)
    known = bisect_left(seen.sized, memo.known, key=operator.itemgetter(0))
    if msgs is client:
        return _Found(seen.names, seen.sized, known, None, [])
    at = dict(zip(map(id, msgs), count()))
    ours = set(map(id, client))
    if len(ours) != len(client) or sum(map(at.__contains__, ours)) != len(client):
        return None  # a client message was taken out (a status it sent back): its calls would not count
    others = [msgs[j] for j in compress(count(), map(operator.not_, map(ours.__contains__, map(id, msgs))))]
    if any(m.get("tool_calls") for m in others):
        return None
    return _Found(seen.names, seen.sized, known, at,
                  [(at[id(m)], m, text) for m in others if (text := sized_text(m)) is not None])


def _estimated(message: dict[str, Any]) -> bool:
    """Whether the message's count is an estimate (a huge string: proxy/tokens.py)."""
    content = message.get("content")
    if isinstance(content, str):
        return is_estimated(content)
    return any(is_estimated(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


class Offload:
    name: ClassVar[str] = "offload"
    Settings: ClassVar[type[BaseModel]] = OffloadSettings
    needs_counts: ClassVar[bool] = False  # it counts its own candidates, off the loop, only the undecided ones

    def __init__(self, settings: OffloadSettings) -> None:
        self.settings = settings
        self._errors = error_matcher(settings.error_pattern) if settings.preview_error_lines else None
        self._decided: OrderedDict[tuple[str, str], dict[str, Any] | bool] = OrderedDict()
        self._handles: OrderedDict[bytes, tuple[str, str]] = OrderedDict()  # message digest -> (handle, what)

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        s = self.settings
        tools = conv.body.get("tools")
        read_name = tool_name_for(tools or [])
        archive = Archive(ctx.store, ctx.tenant, s.retention_days, ctx.archive_quota)
        found = await self._candidates(conv)
        decisions = await self._decisions(archive, ctx.tenant, list(map(operator.itemgetter(1), found)))
        messages = list(conv.messages)
        events = []
        for j in compress(count(), map(operator.is_not, decisions, repeat(False))):  # not those known to stay
            (i, handle, text, what), decision = found[j], decisions[j]
            new = False  # whether this request stored the content (offloads are counted once, by that request)
            if decision is None:
                decision, new = await self._decide(archive, conv, messages[i], handle, text, what, read_name,
                                                   ctx.window)
                self._remember(ctx.tenant, handle, decision or False)
                if not decision:
                    continue
            messages[i] = _with_placeholder(messages[i], decision["placeholder"])
            events.append(Event("offload", {"handle": handle, "tokens": decision["tokens"],
                                            "saved": decision["tokens"] - decision["preview_tokens"], "new": new}))
        if events:
            conv.set_messages(messages)
            conv.events.extend(events)
        return conv

    async def _candidates(self, conv: Conversation) -> list[tuple[int, str, str, str]]:
        """Messages big enough to have been offloaded, with their handles (hashed once per content).

        With the session's memo, the handles of the candidates it knows are
        those of the previous request, as long as this process still maps their
        digests to them; only new candidates are looked at.
        """
        found = _scan(conv, self)
        if found is None:
            names: list[dict[Any, str]] = []
            return [_row(i, text, await self._handle(conv, m, text, names)) for i, m, text in _sized(conv.messages)]
        memo, client = conv.memo, conv.client_messages
        assert memo is not None
        k = found.known
        digests, pairs = memo.previous.get((self, "handles"), ([], []))
        digests, pairs = digests[:k], pairs[:k]
        if len(pairs) != k or list(map(self._handles.get, digests)) != pairs:
            digests, pairs = [], []
        k = len(pairs)
        names = [found.names]
        for i, text in found.sized[k:]:
            digests.append(conv.digest(client[i]))
            pairs.append(await self._handle(conv, client[i], text, names))
        memo.facts[(self, "handles")] = (digests, pairs)
        if found.at is None:  # rows as the previous request had them, while the handles stand
            rows = memo.previous.get((self, "rows"), [])[:k]
            rows += [(i, h, text, what) for (i, text), (h, what) in zip(found.sized[len(rows):], pairs[len(rows):])]
            memo.facts[(self, "rows")] = rows
            return list(rows)
        at = found.at
        out = [(at[id(client[i])], h, text, what) for (i, text), (h, what) in zip(found.sized, pairs)]
        out += [_row(i, text, await self._handle(conv, m, text, names)) for i, m, text in found.others]
        out.sort(key=operator.itemgetter(0))
        return out

    async def _handle(self, conv: Conversation, m: dict[str, Any], text: str,
                      names: list[dict[Any, str]]) -> tuple[str, str]:
        """(handle, what) of a candidate, computed once per digest; `names` is filled in when first needed."""
        digest = conv.digest(m)
        known = self._handles.get(digest)
        if known is None:
            role = m.get("role")
            if role == "user":
                what = "user message"
            else:
                if not names:
                    names.append(_call_names(conv.messages))
                what = f"tool result of {names[0].get(m.get('tool_call_id'), m.get('name') or 'a tool')}"
            handle = await offloop.run_if(len(text), content_handle, f"{role}:{what}", text)
            known = self._handles[digest] = (handle, what)
            if len(self._handles) > _DECISION_CACHE:
                self._handles.popitem(last=False)
        return known

    async def _decisions(self, archive: Archive, tenant: str, handles: list[str]) -> list[Any]:
        known = list(map(self._decided.get, zip(repeat(tenant), handles)))
        missing = list(compress(handles, map(operator.is_, known, repeat(None))))
        if missing:
            fetched = dict(zip(missing, await archive.decisions(DECISION_KIND, missing)))
            for j in list(compress(count(), map(operator.is_, known, repeat(None)))):
                known[j] = fetched.get(handles[j])
            for h in missing:
                if fetched.get(h) is not None:
                    self._remember(tenant, h, fetched[h])
        return known

    async def _decide(self, archive: Archive, conv: Conversation, message: dict[str, Any], handle: str, text: str,
                      what: str, read_name: str, window: int) -> tuple[dict[str, Any] | None, bool]:
        """The decision that stands for this content, and whether this call recorded it (False when another
        request or replica recorded one first)."""
        s = self.settings
        if message.get("role") == "user":  # the task itself: offloaded only when truly huge for the window
            limit = min(s.user_message_tokens, int(window * s.max_window_share * _USER_SHARE_FACTOR))
        else:
            limit = min(s.tool_result_tokens, int(window * s.max_window_share))
        limit = max(MIN_THRESHOLD_TOKENS, limit)
        model = conv.body.get("model")
        tokens = await conv.count_prepared(message)
        if tokens <= limit:
            return None, False
        shape = PreviewShape(s.preview_head_lines, s.preview_tail_lines, s.preview_line_chars, s.preview_max_share,
                             s.preview_error_lines)
        placeholder = await offloop.run_if(
            len(text), build_placeholder, text, what=what, handle=handle, tool=read_name, tokens=tokens, shape=shape,
            count=lambda t: default_counter.count_text(t, model), approx=_estimated(message), errors=self._errors)
        if placeholder is None:
            return None, False
        await archive.put_text(handle, text)
        decision = {"placeholder": placeholder, "tokens": tokens,
                    "preview_tokens": default_counter.count_text(placeholder, model)}
        stands = await archive.record(DECISION_KIND, handle, decision)
        return stands, stands is decision

    def _remember(self, tenant: str, handle: str, decision: dict[str, Any] | bool) -> None:
        self._decided[(tenant, handle)] = decision
        self._decided.move_to_end((tenant, handle))
        if len(self._decided) > _DECISION_CACHE:
            self._decided.popitem(last=False)
