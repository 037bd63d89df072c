"""Agent status bar: terse key-value state, computed by code, as the last message of an agent request.

One transform acting at two moments. `restore`, before any transform rewrites
the request, measures the trajectory on the client's full history and, in
`append` mode, re-inserts every earlier status of the session at exactly its
original place with exactly its original bytes (recorded in the store), so the
prefix the provider cached stays identical. `apply`, after compression, appends
the new status, with context use as it will reach the provider.

No status goes after an item the API wants last (Codex's `compaction_trigger`:
that request is the provider compacting the history, not a turn), nor after the
assistant's own words (a prefill).

Modes: `append` keeps each status in the history (which compression later
folds in; the model sees how its state evolved); `replace` sends only the
latest (nothing accumulates; the cache still hits up to the end of the
previous turn, losing only the previous status itself). Either way each status
is new, uncached tokens on its request, so its length is its price: a full
status (every count, the clock) comes every `full_every` turns, and the turns
between carry only what the agent could not do without on that turn - the
turn, the context use, and whatever warns.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel

from proxy import offloop
from proxy.lru import LRU
from proxy.request import Conversation, RequestContext
from proxy.request.events import CompactionInEffect, Offloaded, StatusAdded, StatusSkipped
from proxy.rewrite.marks import STATUS, STATUS_OPEN
from proxy.rewrite.settings import Peers, StatusBarSettings
from proxy.rewrite.status_bar.clock import SessionClock
from proxy.rewrite.status_bar.trajectory import (
    ErrorLook,
    Progress,
    StatusAnchor,
    Trajectory,
    is_status,
    looks_like_error,
)
from proxy.store.keys import session_key
from proxy.tokens.counter import default_counter
from proxy.tokens.session_memo import RequestMemo, without
from proxy.wire.codec import Codec, Item
from proxy.wire.dialects import ANTHROPIC

_SESSIONS_CACHED = 1_000  # sessions whose recorded statuses are kept in process
_ERRORS_CACHED = 20_000  # tool results whose error look is remembered, by digest
_PREV_HEX = 16  # hex chars of the preceding message's digest stored with a status
# Renders of a status until the size it states includes its own tokens (a number's digits rarely change
# its token count: the second render is almost always exact).
_FIT_ROUNDS = 4


def _has_tool_result(wire: Codec, messages: list[Item]) -> bool:
    role = wire.role
    return any(role(m) == "tool" for m in messages)


async def _is_agent(conv: Conversation) -> bool:
    """It has tools, or results of tools: a walk over every message, on the pool when they are many (inline in a
    body under offloop.INLINE_CHARS bytes, which cannot hold many: not even measured)."""
    if conv.tools:
        return True
    if len(conv.raw) < offloop.INLINE_CHARS:
        return _has_tool_result(conv.wire, conv.messages)
    return await offloop.run_unless_light(conv.messages, _has_tool_result, conv.wire, conv.messages)


def _status_key(ctx: RequestContext) -> str:
    return session_key(ctx.tenant, ctx.session, "status")


class StatusBar:
    name: ClassVar[str] = "status_bar"
    Settings: ClassVar[type[BaseModel]] = StatusBarSettings
    needs_counts: ClassVar[bool] = False  # `restore` reads digests only (proxy/rewrite/pipeline.py)
    counted: ClassVar[bool] = False  # count_tokens counts no status: counting is not a turn

    def __init__(self, settings: StatusBarSettings, peers: Peers) -> None:
        self.settings = settings
        self.compressed = peers.compress is not None  # the context advice says the proxy will compact
        self.pattern = ErrorLook(settings.error_pattern)
        self._recorded: LRU[tuple[str, str], list[dict[str, Any]]] = LRU(_SESSIONS_CACHED)
        self._errors: LRU[bytes, bool] = LRU(_ERRORS_CACHED)
        self._clock = SessionClock()

    async def restore(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        if self.settings.agents_only and not await _is_agent(conv):
            return conv
        progress = await self._progress(conv)
        raw = conv.messages if not progress.statuses else without(conv.messages, progress.statuses)
        prev = conv.digest(raw[-1]).hex()[:_PREV_HEX] if raw else ""
        conv.owned[self.name] = StatusAnchor(progress.trajectory, len(raw), prev)
        if self.settings.mode != "append":
            return conv
        entries = await self._entries(ctx)
        at: dict[int, dict[str, Any]] = {}
        for e in entries:
            at.setdefault(e["k"], e)
        ks: list[int] = []
        statuses: list[Any] = []  # the codec's items
        for k in sorted(k for k in at if 1 <= k <= len(raw)):  # no Python step per message
            e = at[k]
            if e["prev"] == conv.digest(raw[k - 1]).hex()[:_PREV_HEX]:
                ks.append(k)
                # one object per recorded status, reused by later requests (its digest and count are memoized)
                statuses.append(e.get("_message") or e.setdefault(
                    "_message", conv.wire.message(self.settings.role, e["content"])))
        for status in statuses:
            conv.wrote(status, STATUS)
        if ks or raw is not conv.messages:
            conv.set_messages(conv.facts.insert(raw, ks, statuses))
        return conv

    async def _progress(self, conv: Conversation) -> Progress:
        """The trajectory of the client's history, resumed after the messages the session's memo knows."""
        is_error, todo, wire = (lambda m: self._is_error(conv, m)), self.settings.todo, conv.wire
        return await (conv.memo or RequestMemo(client=conv.client_messages)).fold(
            (self, "trajectory"), conv.messages, lambda: Progress(wire),
            lambda p, i, m: p.add_unless_status(i, m, is_error, todo), Progress.copy)

    def _is_error(self, conv: Conversation, message: Any) -> bool:
        """Whether a tool result looks like a failure, decided once per distinct result."""
        key = conv.digest(message)
        hit = self._errors.get(key)
        if hit is None:
            hit = looks_like_error(conv.wire, message, self.pattern)
            self._errors.put(key, hit)
        return hit

    async def _entries(self, ctx: RequestContext) -> list[dict[str, Any]]:
        key = (ctx.tenant, ctx.session)
        cached = self._recorded.get(key) or []
        new = await ctx.store.read_log(_status_key(ctx), start=len(cached))
        if new:
            cached = cached + [orjson.loads(x) for x in new]
        self._recorded.put(key, cached)
        return cached

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        anchor = conv.owned.get(self.name)
        if not isinstance(anchor, StatusAnchor):
            return conv
        traj, n, prev = anchor.trajectory, anchor.at, anchor.prev
        if conv.messages and is_status(conv.wire, conv.messages[-1]):
            return conv  # the status recorded for exactly this history (a retry): already in place
        if ctx.client_compacts:
            # Codex's compaction_trigger must stay the last item, Claude Code's summary request must end the prompt;
            # a status before either would only be summarized away
            conv.events.append(StatusSkipped("the client compacts its history with this request"))
            return conv
        if conv.messages and conv.wire.role(conv.messages[-1]) == "assistant":
            # the client prefills the answer: a status after it would end the turn it asked the model to continue
            conv.events.append(StatusSkipped("the request ends with the assistant's own words"))
            return conv
        if conv.messages and conv.wire.dialect is ANTHROPIC and conv.wire.role(conv.messages[-1]) == "system":
            # a mid-conversation system message ends the request: the API takes it last or before the answer
            conv.events.append(StatusSkipped("the request ends with a system message"))
            return conv
        now = time.time()
        clock = await self._clock.tick(ctx, now)
        model = conv.model
        without_status = conv.prompt_tokens(conv.messages)
        used = without_status
        for _ in range(_FIT_ROUNDS):  # the line states the prompt with this status in it: its own tokens too
            text = self.render(traj, conv, ctx.window, used, now - clock["first"], now - clock["last"], now,
                               compressed=self.compressed)
            status = conv.wire.message(self.settings.role, text)
            stated, used = used, without_status + default_counter.count_message(status, model)
            if used == stated:
                break
        if used + conv.wire.output_reserve(conv.body) > ctx.window:
            conv.events.append(StatusSkipped("would not fit the window"))
            return conv  # the status bar must never be the reason a request is rejected
        conv.set_messages([*conv.messages, conv.wrote(status, STATUS)])
        conv.events.append(StatusAdded())
        if self.settings.mode == "append":
            await ctx.store.append_log(_status_key(ctx), orjson.dumps({"k": n, "prev": prev, "content": text}))
        return conv

    def render(self, t: Trajectory, conv: Conversation, window: int, used: int, since_first: float,
               since_last: float, now: float, compressed: bool = False) -> str:
        """`compressed`: the route compacts history, so the context advice says so instead of "finish".

        Which turns get the full status is counted from the history, so every replica and restart picks
        the same ones; a short status has no clock line, so it is the same bytes for the same history.
        """
        s = self.settings
        full = t.turns % s.full_every == 0
        share = used / window if window else 0.0
        lines = [f"turn: {t.turns}"]
        if full:
            per_tool = ", ".join(f"{name}={c}" for name, c in sorted(t.calls.items(), key=lambda kv: (-kv[1], kv[0])))
            lines.append(f"tool_calls: {sum(t.calls.values())}" + (f" ({per_tool})" if per_tool else ""))
        if t.last_tool and (full or t.last_error):
            lines.append(f"last_tool: {t.last_tool} ({'error' if t.last_error else 'ok'})")
        if t.repeated > 1:
            lines.append(f"repeated_call: {t.last_call} x{t.repeated}")
        if full or t.consecutive_errors:
            lines.append(f"consecutive_errors: {t.consecutive_errors}")
        context = f"context: {share:.0%} ({used:,}/{window:,} tokens)"
        if full:
            lines.append(f"elapsed: {_duration(since_first)} total, {_duration(since_last)} since last request")
            compactions = max((e.version for e in conv.kinds(CompactionInEffect)), default=0)
            lines.append(f"{context}, offloaded {len(conv.kinds(Offloaded))}, compactions {compactions}")
            lines.append("time: " + time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(now)))
            if t.todo_open is not None:
                active = f"; in progress: {t.todo_active}" if t.todo_active else ""
                lines.append(f"todo: {t.todo_open} open, {t.todo_done} done{active}")
        else:
            lines.append(context)
        advice = s.context_compressed if compressed else s.context
        rules = ((t.repeated, s.repeated_call), (t.consecutive_errors, s.consecutive_errors), (share, advice))
        for value, rule in rules:
            if rule.text and value >= rule.at:
                lines.append(f"advice: {rule.text}")
        return STATUS_OPEN + "\n" + "\n".join(lines) + "\n</agent_status>"


def _duration(seconds: float) -> str:
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
