"""Offload: oversized tool results and user messages are stored whole and replaced by a preview.

One `cat` of a log puts 50k-800k characters into the history and every later
turn pays for it again. Offloading keeps it out of the prompt without losing
it: the text goes to the tenant's archive, the prompt gets a bounded preview
naming a handle, and the model reads the rest with the proxy-owned
`context_read` tool.

Byte-stable: the decision and placeholder for a piece of content are recorded
the first time and replayed verbatim afterwards, whatever the settings say
then, on any replica. The record is the route's (proxy/store/decisions.py):
another route decides the same content by its own thresholds. The text is
stored, for every route of the tenant, before the rewritten request leaves.

Never a stall: hashing, counting and previewing a big new text run off the
event loop (proxy/offloop.py); a replayed decision costs none of them.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import compress, count, repeat
from typing import Any, ClassVar

from pydantic import BaseModel

from proxy import offloop
from proxy.lru import LRU
from proxy.request import Conversation, RequestContext
from proxy.request.events import Offloaded
from proxy.rewrite.context_read.tool import read_tool_name
from proxy.rewrite.first_send import FirstSend
from proxy.rewrite.marks import OFFLOAD
from proxy.rewrite.preview import PreviewShape, build_placeholder, error_matcher
from proxy.rewrite.settings import MIN_THRESHOLD_TOKENS, OffloadSettings, Peers
from proxy.store.archive import Archive, content_handle
from proxy.store.decisions import Decisions
from proxy.store.keys import route_key
from proxy.tokens.counter import default_counter, is_estimated
from proxy.wire.codec import Codec, Item, add_call_names, call_names

# Texts under MIN_THRESHOLD_TOKENS UTF-8 bytes (so tokens) can never have been offloaded: not even looked up.
DECISION_KIND = "offload"
_DECISION_CACHE = 20_000  # (tenant, handle) decisions remembered in process (one Offload per route)


def sized_text(wire: Codec, m: Item) -> str | None:
    """The text of a message that may be big enough to have been offloaded (cheap checks first)."""
    if wire.role(m) not in ("tool", "user"):
        return None
    text = wire.text(m)
    if text is None or len(text) < MIN_THRESHOLD_TOKENS // 4:
        return None
    if len(text) < MIN_THRESHOLD_TOKENS and len(text.encode("utf-8", "surrogatepass")) < MIN_THRESHOLD_TOKENS:
        return None
    return text


def _sized(wire: Codec, messages: list[Item]) -> list[tuple[int, Item, str]]:
    return [(i, m, text) for i, m in enumerate(messages) if (text := sized_text(wire, m)) is not None]


@dataclass
class _Seen:
    """What offload needs of a client history so far: tool-call names, and the messages big enough to matter."""

    wire: Codec
    names: dict[str | None, str] = field(default_factory=dict)
    sized: list[tuple[int, str]] = field(default_factory=list)  # client positions and texts

    def copy(self) -> _Seen:
        return _Seen(self.wire, dict(self.names), list(self.sized))

    def add(self, i: int, m: Item) -> None:
        add_call_names(self.wire, self.names, m)
        text = sized_text(self.wire, m)
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


async def _scan(conv: Conversation, owner: object) -> _Found | None:
    """The candidates, following only the messages the session's memo does not know; None: scan them all.

    The client's messages are folded (resumed where the previous request of the
    session left off); the proxy's own messages among them (re-inserted statuses)
    are looked at directly. Anything unusual takes the plain way.
    """
    memo = conv.memo
    if memo is None:
        return None
    client, msgs = conv.client_messages, conv.messages
    wire = conv.wire
    seen = await memo.fold((owner, "offload"), client, lambda: _Seen(wire), _Seen.add, _Seen.copy)
    known = bisect_left(seen.sized, memo.known, key=operator.itemgetter(0))
    if msgs is client:
        return _Found(seen.names, seen.sized, known, None, [])
    at = dict(zip(map(id, msgs), count()))
    ours = set(map(id, client))
    if len(ours) != len(client) or sum(map(at.__contains__, ours)) != len(client):
        return None  # a client message was taken out (a status it sent back): its calls would not count
    others = [msgs[j] for j in compress(count(), map(operator.not_, map(ours.__contains__, map(id, msgs))))]
    if any(wire.calls(m) for m in others):
        return None
    return _Found(seen.names, seen.sized, known, at,
                  [(at[id(m)], m, text) for m in others if (text := sized_text(wire, m)) is not None])


class Offload:
    name: ClassVar[str] = "offload"
    Settings: ClassVar[type[BaseModel]] = OffloadSettings
    needs_counts: ClassVar[bool] = False  # it counts its own candidates, off the loop, only the undecided ones

    def __init__(self, settings: OffloadSettings, peers: Peers) -> None:
        self.settings = settings
        self._errors = error_matcher(settings.error_pattern) if settings.preview_error_lines else None
        self._decided: LRU[tuple[str, str], dict[str, Any] | bool] = LRU(_DECISION_CACHE)
        self._handles: LRU[bytes, tuple[str, str]] = LRU(_DECISION_CACHE)  # message digest -> (handle, what)
        self._first_send = FirstSend()

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        s = self.settings
        if len(conv.raw) < MIN_THRESHOLD_TOKENS and conv.messages is conv.client_messages:
            return conv  # no text in the body has the bytes a candidate needs (JSON spells a text in as many or more)
        found = await self._candidates(conv)
        if not found:  # no text big enough: nothing to decide, replay or store (most requests of most sessions)
            return conv
        read_name = read_tool_name(conv)
        archive = Archive(ctx.store, ctx.tenant, s.retention_days, ctx.archive_quota)
        records = Decisions(ctx.store, ctx.tenant, ctx.route.name, s.retention_days)
        decisions = await self._decisions(records, ctx.tenant, found, ctx.window)
        messages = list(conv.messages)
        events = []
        for j in compress(count(), map(operator.is_not, decisions, repeat(False))):  # not those known to stay
            (i, handle, text, what), decision = found[j], decisions[j]
            new = False  # whether this request decided it on this route (counted once per route, by that request)
            if decision is None:
                decision, new = await self._decide(archive, records, conv, messages[i], handle, text, what,
                                                   read_name, ctx.window, unsent=ctx.purpose == "count")
                self._remember(ctx.tenant, handle, decision or False)
                if not decision:
                    continue
            elif decision.get("unsent") and ctx.purpose != "count":  # stored by a count: the first turn counts it
                new = await self._first_send.claim(  # per route, as the decision is
                    ctx.store, route_key(ctx.tenant, ctx.route.name, "sent", DECISION_KIND, handle), archive.ttl)
            messages[i] = conv.wrote(conv.wire.with_text(messages[i], decision["placeholder"]), OFFLOAD, handle)
            events.append(Offloaded(handle, decision["tokens"], decision["tokens"] - decision["preview_tokens"], new))
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
        found = await _scan(conv, self)
        if found is None:
            names: list[dict[str | None, str]] = []
            return [_row(i, text, await self._handle(conv, m, text, names))
                    for i, m, text in _sized(conv.wire, conv.messages)]
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

    async def _handle(self, conv: Conversation, m: Item, text: str,
                      names: list[dict[str | None, str]]) -> tuple[str, str]:
        """(handle, what) of a candidate, computed once per digest; `names` is filled in when first needed."""
        digest = conv.digest(m)
        known = self._handles.get(digest)
        if known is None:
            wire = conv.wire
            role = wire.role(m)
            if role == "user":
                what = "user message"
            else:
                if not names:
                    names.append(call_names(wire, conv.messages))
                what = f"tool result of {names[0].get(wire.answers(m), wire.result_name(m) or 'a tool')}"
            handle = await offloop.run_if(len(text), content_handle, f"{role}:{what}", text)
            known = (handle, what)
            self._handles.put(digest, known)
        return known

    async def _decisions(self, records: Decisions, tenant: str, found: list[tuple[int, str, str, str]],
                         window: int) -> list[Any]:
        handles = list(map(operator.itemgetter(1), found))
        known = list(map(self._decided.get, zip(repeat(tenant), handles)))
        missing = list(compress(handles, map(operator.is_, known, repeat(None))))
        if missing:
            roles = {h: "user" if what == "user message" else "tool" for _, h, _, what in found}

            def adopt(handle: str, old: Any) -> bool:  # a record of before routes: only if this route offloads it
                return isinstance(old, dict) and old.get("tokens", 0) > self.settings.threshold(roles[handle], window)

            fetched = dict(zip(missing, await records.get(DECISION_KIND, missing, adopt)))
            for j in list(compress(count(), map(operator.is_, known, repeat(None)))):
                known[j] = fetched.get(handles[j])
            for h in missing:
                decision = fetched.get(h)
                if decision is not None:
                    self._remember(tenant, h, decision)
        return known

    async def _decide(self, archive: Archive, records: Decisions, conv: Conversation, message: Item, handle: str,
                      text: str, what: str, read_name: str, window: int,
                      unsent: bool) -> tuple[dict[str, Any] | None, bool]:
        """The decision that stands for this content on this route, and whether this call recorded it (False
        when another request or replica recorded one first). `unsent`: recorded by a request that sends no turn
        (a count), so the first turn that sends it counts it (proxy/rewrite/first_send.py)."""
        s = self.settings
        limit = s.threshold(conv.wire.role(message), window)
        model = conv.model
        tokens = await conv.count_prepared(message)
        if tokens <= limit:
            return None, False
        shape = PreviewShape(s.preview_head_lines, s.preview_tail_lines, s.preview_line_chars, s.preview_max_share,
                             s.preview_error_lines)
        placeholder = await offloop.run_if(
            len(text), build_placeholder, text, what=what, handle=handle, tool=read_name, tokens=tokens, shape=shape,
            count=lambda t: default_counter.count_text(t, model), approx=is_estimated(text), errors=self._errors)
        if placeholder is None:
            return None, False
        await archive.put_text(handle, text)
        decision: dict[str, Any] = {"placeholder": placeholder, "tokens": tokens,
                                    "preview_tokens": default_counter.count_text(placeholder, model)}
        if unsent:
            decision["unsent"] = True
        stands = await records.record(DECISION_KIND, handle, decision)
        return stands, stands is decision

    def _remember(self, tenant: str, handle: str, decision: dict[str, Any] | bool) -> None:
        self._decided.put((tenant, handle), decision)
