"""Compress: when the prompt passes `trigger` of the window, bring it down to `target`, cheapest layer first.

Layer 1 clears older tool results outside the recent window into the archive
(lossless: readable by handle). Layer 2, if still over, replaces the span
between the pinned head and the recent tail with one summary written by a
separate LLM call, plus an identifier list written by code and a handle to the
raw span. If the summarizer fails, layer 1 stands if it fits; if nothing fits,
the oldest middle span is archived behind a placeholder rather than let the
provider reject the request.

Each compaction is recorded and replayed verbatim (proxy/rewrite/compress/record.py), so
the rewritten prefix is byte-identical between compactions; each one breaks
the provider's cache once, so they are rare and large (trigger → target). A
request in which the client has the provider compact its history (Codex's
`compaction_trigger`) gets the recorded one replayed, never a new one.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, ClassVar

from pydantic import BaseModel

from proxy import offloop
from proxy.logs import event
from proxy.lru import LRU
from proxy.request import Conversation, RequestContext
from proxy.request.events import ClientCompacts, Compacted, CompactionInEffect, HistoryElsewhere
from proxy.rewrite.cache_hints import cache_fields
from proxy.rewrite.compress.history import Message, chain, head_end, identifiers, repair_pairing, tail_start, text_of
from proxy.rewrite.compress.precompute import Precomputer
from proxy.rewrite.compress.record import PREFIX_CACHE, CompactionLog, Kind, Record, View, replay
from proxy.rewrite.compress.summarizer import (
    IN_PLACE_PROMPT,
    SECTIONS,
    CachedPrefix,
    SummarizerDeclined,
    SummarizerError,
    SummarizerTarget,
    SummaryRejected,
    render,
    summarize,
    summarize_cached,
    summary_problem,
)
from proxy.rewrite.compress.summary_limit import within_limit
from proxy.rewrite.context_read.tool import read_tool_name
from proxy.rewrite.context_read.transform import has_placeholders, tools_as_sent
from proxy.rewrite.first_send import FirstSend
from proxy.rewrite.marks import (
    ARCHIVE,
    CLEARED,
    PLACEHOLDER_MARK,
    SUMMARY,
    SUMMARY_OPEN,
    SYNTHETIC,
    legacy_written,
)
from proxy.rewrite.preview import read_call
from proxy.rewrite.settings import CompressSettings, Peers
from proxy.store.archive import Archive, content_handle
from proxy.store.decisions import SECONDS_PER_DAY, Decisions, adopt_any
from proxy.store.lease import renewed
from proxy.tokens.counter import REPLY_PRIMING_TOKENS, default_counter
from proxy.wire.codec import Codec, call_names

_LOCK_POLL = 0.1  # seconds between checks while another request of the session compacts
# The session's compaction lock has a short lease, renewed while its holder works
# (proxy/store/lease.py): a holder killed mid-summary frees it within this many seconds.
LOCK_LEASE_S = 5.0
# The longest a live holder compacts, so the longest a waiter waits for it: the cached-shape
# summary call, then perhaps the transcript one, each up to summary_timeout, plus slack.
_SUMMARY_CALLS_WAITED = 2
_WAIT_SLACK_S = 10
_SUMMARIZER_WINDOW_SHARE = 0.85  # of the window, for transcript + answer (the rest: prompt, framing, slack)
_MIN_TRANSCRIPT_TOKENS = 500
_MIN_SUMMARY_TOKENS, _MAX_SUMMARY_TOKENS = 256, 2000  # the scaled summary length limit's bounds
# ... and its scale: a summary is carried by every turn until the next compaction, so at 32k it takes 1,000
# tokens (a thirty-second), beside the identifier list and the verbatim tail
_WINDOW_PER_SUMMARY_TOKEN = 32


def summary_tokens(s: CompressSettings, window: int) -> int:
    """The summary's length limit: configured, else scaled to the window."""
    if s.summary_max_tokens is not None:
        return s.summary_max_tokens
    return max(_MIN_SUMMARY_TOKENS, min(_MAX_SUMMARY_TOKENS, window // _WINDOW_PER_SUMMARY_TOKEN))


def room_after(s: CompressSettings, window: int) -> int:
    """The most a compaction may leave: halfway from target to trigger, so the next turns have room to grow."""
    return int((s.target + max(s.target, s.trigger)) / 2 * window)


def marked_at_end(conv: Conversation, prefix: list[Message], limit: int) -> list[Message]:
    """The prefix with a cache breakpoint on its last markable item, where the provider reads its cache only at
    breakpoints (Anthropic's Messages API): the summary call then reads what the agent's turns wrote (the
    provider looks 20 blocks back from a breakpoint). Within the 4 allowed, the client's own counted."""
    wire = conv.wire
    if not wire.reads_cache_at_breakpoints:
        return prefix
    if len(wire.fixed_marks(conv.body)) + sum(wire.has_breakpoint(m) for m in prefix) >= limit:
        return prefix
    for i in range(len(prefix) - 1, -1, -1):
        if wire.has_breakpoint(prefix[i]):
            return prefix  # already marked at its end
        marked = wire.with_breakpoint(prefix[i], "anthropic")
        if marked is not None:
            return [*prefix[:i], marked, *prefix[i + 1:]]
    return prefix


class Compress:
    name: ClassVar[str] = "compress"
    Settings: ClassVar[type[BaseModel]] = CompressSettings

    def __init__(self, settings: CompressSettings, peers: Peers) -> None:
        self.settings = settings
        self.peers = peers
        self._prefixes: LRU[str, list[Any]] = LRU(PREFIX_CACHE)
        # The latest record of each session this process alone serves (ctx.shared false), or None for none: read
        # from the store once, then kept as this process writes them, so a request asks the store for nothing.
        self._heads: LRU[str, tuple[Record | None]] = LRU(PREFIX_CACHE)
        self.lock_lease = LOCK_LEASE_S
        self.precomputer = Precomputer(self)
        self._first_send = FirstSend()

    def tail_budget(self, window: int) -> int:
        """Tokens of newest messages kept verbatim (CompressSettings.recent_tokens)."""
        return self.settings.recent_tokens(window)

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        s = self.settings
        if conv.wire.history_elsewhere(conv.body):  # only the new items are here: nothing to compact
            conv.events.append(HistoryElsewhere())
            return conv
        # The client compacts its own history with this request (Codex's compaction_trigger, Claude Code's
        # summary request): what is recorded is replayed (the same prefix, the same bytes), but nothing new is
        # compacted or precomputed.
        own = ctx.client_compacts
        if own:
            conv.events.append(ClientCompacts())
        raw = conv.messages
        counts = conv.counts(raw)
        fixed = conv.fixed_tokens() + conv.wire.output_reserve(conv.body)
        digests = conv.digests(raw)
        log = self._log(ctx)
        # Replayed for every request that carries a recorded span, under the trigger or not: the trigger counted
        # the compacting turn's answer reserve, and a later request may reserve less (a count has none at all).
        view = await self._replayed(conv, log, raw, digests, counts, ctx.shared)
        if ctx.purpose == "count" and not conv.wire.output_reserve(conv.body):  # a count reserves as the turns do
            fixed += view.reserve
        await self._count_unsent(conv, ctx, log, view)
        over = sum(view.counts) + fixed > s.trigger * ctx.window
        if over and not own:
            view = await self._compact_locked(conv, ctx, log, raw, digests, counts, view, fixed)
            await self._count_unsent(conv, ctx, log, view)  # one another request wrote while this one waited
        elif not own and ctx.purpose != "engine":  # a gateway's rows: no summary is ever written for them
            await self.precomputer.maybe_start(conv, ctx, log, view, fixed)
        if view.kept:
            # a gateway's rows hold no calls (it keeps the assistant rows): nothing to pair, and none may go
            paired = view.messages if ctx.purpose == "engine" else repair_pairing(conv.wire, view.messages)
            for m, kind in zip(view.messages, _kinds(conv.wire, view)):
                if kind is not None:
                    conv.wrote(m, *kind)
            present = set(map(id, view.messages))
            for m in paired:
                if id(m) not in present:  # a call's missing result, filled in
                    conv.wrote(m, SYNTHETIC)
            conv.set_messages(paired)
            conv.events.append(CompactionInEffect(view.version, view.kept))
        return conv

    def _log(self, ctx: RequestContext) -> CompactionLog:
        return CompactionLog(ctx.store, ctx.tenant, ctx.session, ctx.route.name,
                             self.settings.retention_days * SECONDS_PER_DAY)

    async def _count_unsent(self, conv: Conversation, ctx: RequestContext, log: CompactionLog, view: View) -> None:
        """A compaction a count wrote is this turn's to count, if this turn is the first to send it."""
        if view.unsent is None or ctx.purpose != "turn" or not view.kept:
            return
        if await self._first_send.claim(ctx.store, log.sent_key(view.version), log.ttl):
            d = dict(view.unsent)
            conv.events.append(Compacted(d.pop("layer"), d.pop("before"), d.pop("after"), d))

    async def _replayed(self, conv: Conversation, log: CompactionLog, raw: list[Message], digests: list[bytes],
                        counts: list[int], shared: bool = True) -> View:
        known = None if shared else self._heads.get(log.base)
        if known is None:
            known = (await log.latest(self._prefixes),)
            if not shared:
                self._heads.put(log.base, known)
        record = known[0]
        # the same prefix objects every request (cached in self._prefixes): counted once, then looked up
        prefix_counts = conv.counts(record.prefix) if record else None
        return replay(record, raw, digests, counts, prefix_counts)

    async def _compact_locked(self, conv: Conversation, ctx: RequestContext, log: CompactionLog,
                              raw: list[Message], digests: list[bytes], counts: list[int], view: View,
                              fixed: int) -> View:
        s = self.settings
        token = await ctx.store.acquire_lock(log.lock_name, LOCK_LEASE_S)
        # Another request of this session is compacting: wait for its result. A live holder renews
        # its short lease; a dead one (killed mid-summary) stops, and its lock is ours a lease later.
        deadline = time.monotonic() + s.summary_timeout * _SUMMARY_CALLS_WAITED + _WAIT_SLACK_S
        while token is None:
            if time.monotonic() >= deadline:
                return view
            await asyncio.sleep(_LOCK_POLL)
            fresh = await self._replayed(conv, log, raw, digests, counts)
            if fresh.version > view.version:
                return fresh
            token = await ctx.store.acquire_lock(log.lock_name, LOCK_LEASE_S)
        async with renewed(ctx.store, log.lock_name, token, LOCK_LEASE_S):
            view = await self._replayed(conv, log, raw, digests, counts)
            before = sum(view.counts) + fixed
            if before <= s.trigger * ctx.window:
                return view
            made: dict[int, Kind] = {}  # what this compaction writes, by object
            result = await self._layers(conv, ctx, log, view, fixed, made)
            if result is None:
                return view
            new, layer, detail = result
            before_kinds = dict(zip(map(id, view.messages), _kinds(conv.wire, view)))
            new.kinds = [made.get(id(m)) or before_kinds.get(id(m)) for m in new.messages[:new.kept]]
            after = sum(new.counts) + fixed
            if after >= before:  # nothing to gain: forward as is rather than break the cache for nothing
                return view
            cut = new.raw_index(new.kept)
            upto = await offloop.run_unless_light(digests[:cut], chain, digests, cut)  # a hash per message
            # recorded as prompt sizes (proxy/request.py prompt_tokens); the answer's reserve apart
            reserve = fixed - conv.fixed_tokens()
            extra = fixed - conv.head_tokens()  # reply priming and the reserve: in the trigger, not in the prompt
            done = Compacted(layer, before - extra, after - extra, {**detail, "output_reserve": reserve})
            await log.write(view.version + 1, cut, upto[-1], layer, new.messages[:new.kept],
                            unsent=done.as_record() if ctx.purpose != "turn" else None, reserve=reserve,
                            kinds=new.kinds)
            self._heads.pop(log.base)  # read again, as written
            new.version = view.version + 1
            conv.events.append(done)
            event("compacted", request_id=ctx.request_id, session=ctx.session, layer=layer,
                  tokens_before=done.before, tokens_after=done.after, output_reserve=reserve, version=new.version)
            return new

    async def _layers(self, conv: Conversation, ctx: RequestContext, log: CompactionLog, view: View,
                      fixed: int, made: dict[int, Kind]) -> tuple[View, str, dict[str, Any]] | None:
        """The first layer that brings the prompt under the target; each message it writes said in `made`."""
        s, model, wire = self.settings, conv.model, conv.wire
        msgs, counts = view.messages, view.counts
        h = head_end(wire, msgs)
        # The kept tail must leave room under the target, or a compaction cannot get there.
        t = tail_start(wire, msgs, counts, self.tail_budget(ctx.window), max(h, view.kept),
                       calls=ctx.purpose != "engine")
        if t <= h or t < view.kept:
            return None
        archive = Archive(ctx.store, ctx.tenant, s.retention_days, ctx.archive_quota)
        tool = read_tool_name(conv)

        def with_tail(head: list[Message], counts_head: list[int]) -> View:
            return View(head + msgs[t:], counts_head + counts[t:], len(head), view.raw_index(t), view.version)

        ours = set(conv.written) | {id(m) for m, kind in zip(msgs, _kinds(wire, view)) if kind is not None}
        cleared, cleared_counts, n = await self._clear(wire, msgs[:t], counts[:t], h, archive, tool, model, made, ours)
        layer1 = with_tail(cleared, cleared_counts)
        if sum(layer1.counts) + fixed <= s.target * ctx.window or (ctx.purpose == "engine" and n):
            return layer1, "clear", {"cleared": n}  # a gateway's rows: lossless clearing only, row for row
        if ctx.purpose == "engine":
            return None

        span = msgs[h:t]
        # Every result must leave room to grow, or the next request compacts (and breaks the cache) again.
        room = room_after(s, ctx.window)
        why: dict[str, Any] = {}
        ready = await self.precomputer.ready(conv, ctx, log, view) if s.summary and s.precompute else None
        if ready is not None:
            made[id(ready.message)] = (SUMMARY, ready.handle)
            layer2 = View(msgs[:h] + [ready.message] + msgs[ready.upto:],
                          counts[:h] + default_counter.message_counts([ready.message], model) + counts[ready.upto:],
                          h + 1, view.raw_index(ready.upto), view.version)
            if sum(layer2.counts) + fixed <= room:
                return layer2, "summary", {"summarized": ready.upto - h, "summary_calls": ready.usage,
                                           "precomputed": True}
            if ready.upto < t:  # what arrived since the summary was made: its tool results cleared, losslessly
                cleared, cleared_counts, n = await self._clear(wire, msgs[:t], counts[:t], ready.upto, archive, tool,
                                                               model, made, ours)
                head = msgs[:h] + [ready.message] + cleared[ready.upto:t]
                head_counts = layer2.counts[:h + 1] + cleared_counts[ready.upto:t]
                both = with_tail(head, head_counts)
                if n and sum(both.counts) + fixed <= room:
                    return both, "summary", {"summarized": ready.upto - h, "cleared": n,
                                             "summary_calls": ready.usage, "precomputed": True}
            event("precomputed summary leaves no room; summarizing the current span", request_id=ctx.request_id,
                  session=ctx.session, tokens=sum(layer2.counts) + fixed, room=room)
            # its call is in the figures already (accounted when it was answered); named here for the log line
            why = {"summary_calls": list(ready.usage)}
        if s.summary and not await ctx.store.get(log.breaker):
            try:
                summary, usage, handle = await self.summary_for(conv, ctx, archive, h, t, view, tool)
                made[id(summary)] = (SUMMARY, handle)
                head = msgs[:h] + [summary]
                layer2 = with_tail(head, counts[:h] + default_counter.message_counts([summary], model))
                earlier = why.get("summary_calls", [])
                if sum(layer2.counts) + fixed <= room:
                    return layer2, "summary", {"summarized": len(span), "summary_calls": earlier + usage}
                why = {"summary_rejected": "the summary leaves no room under the trigger",
                       "summary_calls": earlier + usage}
                event("summary leaves no room under the trigger; archiving instead", request_id=ctx.request_id)
            except SummaryRejected as e:
                why = {"summary_rejected": e.reason, "summary_calls": why.get("summary_calls", []) + e.usage}
                event("summary rejected; falling back", request_id=ctx.request_id, session=ctx.session,
                      reason=e.reason)
                await ctx.store.put(log.breaker, b"1", ttl=s.breaker_cooldown)
            except SummarizerError as e:
                why = {**why, "summary_rejected": str(e)}
                event("summarizer failed; falling back", request_id=ctx.request_id, session=ctx.session, error=str(e))
                await ctx.store.put(log.breaker, b"1", ttl=s.breaker_cooldown)
        if n and sum(layer1.counts) + fixed <= room:  # over target but with room: forward without a summary
            return layer1, "clear", {"cleared": n, "fallback": True, **why}
        full = await offloop.run_unless_light(span, render, wire, span)
        handle = await offloop.run_if(len(full), content_handle, "span", full)
        await archive.put_text(handle, full)
        text = (f"{PLACEHOLDER_MARK} {len(span)} earlier messages ({sum(counts[h:t]):,} tokens) were archived to "
                f"fit the context window and could not be summarized. Read them with {read_call(tool, handle)}]")
        note = wire.message("user", text)
        made[id(note)] = (ARCHIVE, handle)
        bare = with_tail(msgs[:h] + [note], counts[:h] + default_counter.message_counts([note], model))
        # The identifiers of what was archived go with it, as under a summary, where there is room for them:
        # without them a later summary cannot know the names the archived messages (or their summary) held.
        room_left = min(ctx.window * s.identifiers_max_share, room - sum(bare.counts) - fixed)
        listing = await offloop.run_unless_light(span, self._identifier_listing, wire, span, model, room_left) \
            if room_left > 0 else ""
        if not listing:
            return bare, "archive", {"archived": len(span), **why}
        note = wire.message("user", text + "\n" + listing)
        made[id(note)] = (ARCHIVE, handle)
        return with_tail(msgs[:h] + [note], counts[:h] + default_counter.message_counts([note], model)), "archive", \
            {"archived": len(span), **why}

    def _cached_prefix(self, conv: Conversation, ctx: RequestContext, view: View, t: int) -> CachedPrefix | None:
        """The agent's request up to the tail, as its provider cached it; None when the cached shape can't be used."""
        s, model = self.settings, conv.model
        if s.summary_prompt != "cached" or s.summary_model not in (None, model):
            return None
        tools = tools_as_sent(self.peers.context_read, conv.wire, conv.tools, has_placeholders(conv))
        instruction = default_counter.count_text(IN_PLACE_PROMPT, model)
        if sum(view.counts[:t]) + default_counter.count_tools(tools, model) + instruction + conv.prefix_tokens() \
                + REPLY_PRIMING_TOKENS + summary_tokens(s, ctx.window) > ctx.window:
            return None
        extra = {**conv.wire.summary_fields(conv.body), **cache_fields(self.peers.cache_hints, conv, ctx)}
        limit = self.peers.cache_hints.max_breakpoints if self.peers.cache_hints else 4  # Anthropic's limit
        return CachedPrefix(marked_at_end(conv, view.messages[:t], limit), tools, extra)

    async def _clear(self, wire: Codec, msgs: list[Message], counts: list[int], h: int, archive: Archive, tool: str,
                     model: Any, made: dict[int, Kind], ours: set[int]) -> tuple[list[Message], list[int], int]:
        """Tool results over min_clear_tokens stored and replaced by a placeholder, losslessly; never what the
        proxy wrote itself (`ours`: by object; a placeholder's mark: a client's copy of one)."""
        names = await offloop.run_unless_light(msgs, call_names, wire, msgs)
        out, out_counts, n = list(msgs), list(counts), 0
        async for span in offloop.spans(h, len(msgs)):  # the loop gets a turn between spans of messages
            for i in span:
                m = msgs[i]
                if wire.role(m) != "tool":
                    continue
                name = names.get(wire.answers(m)) or "tool"
                text = text_of(wire, m)
                if counts[i] < self.settings.min_clear_tokens or id(m) in ours \
                        or name in self.settings.exclude_tools or text.startswith(PLACEHOLDER_MARK):
                    continue
                handle = await offloop.run_if(len(text), content_handle, f"tool:tool result of {name}", text)
                await archive.put_text(handle, text)
                out[i] = wire.replaced(m, f"{PLACEHOLDER_MARK} cleared tool result of {name} ({counts[i]:,} "
                                                 f"tokens); read it back with {read_call(tool, handle)}]")
                made[id(out[i])] = (CLEARED, handle)
                out_counts[i] = default_counter.count_message(out[i], model)
                n += 1
        return out, out_counts, n

    def _identifier_listing(self, wire: Codec, span: list[Any], model: Any, budget: float) -> str:
        """The span's identifiers, ranked, verbatim, within `budget` tokens: code-written, never paraphrased."""
        ids: list[str] = []
        for ident in identifiers(wire, span, self.settings.identifiers_cap):
            budget -= default_counter.count_text(ident, model) + 1
            if budget < 0:
                break
            ids.append(ident)
        return "\n## Identifiers (verbatim from the compacted messages)\n" + "\n".join(ids) if ids else ""

    async def summary_for(self, conv: Conversation, ctx: RequestContext, archive: Archive, h: int, t: int,
                          view: View, tool: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        """The summary message for view.messages[h:t], the usage of its calls and its handle.

        Reused verbatim if this span was summarized before on this route (by a precompute too): a summary
        is written by the route's summarizer settings, so another route's is not this route's decision.
        """
        s, model, wire = self.settings, conv.model, conv.wire
        span = view.messages[h:t]
        full = await offloop.run_unless_light(span, render, wire, span)
        handle = await offloop.run_if(len(full), content_handle, "span", full)
        records = Decisions(ctx.store, ctx.tenant, ctx.route.name, s.retention_days)
        (known,) = await records.get("summary", [handle], adopt_any)  # this route chose to summarize the span
        if known is not None:
            return known, [], handle
        budget, answer_tokens = s.summary_input_tokens, summary_tokens(s, ctx.window)
        if s.summary_model in (None, model):  # the summarizer shares the agent's window: leave room to answer
            budget = min(budget, int(ctx.window * _SUMMARIZER_WINDOW_SHARE) - answer_tokens)
        target = SummarizerTarget(wire, ctx.upstream, ctx.route.upstream, ctx.upstream_headers,
                                  s.summary_model or model or "gpt-4o-mini", max(budget, _MIN_TRANSCRIPT_TOKENS),
                                  answer_tokens, s.summary_timeout, functools.partial(ctx.own_calls.billed, ctx,
                                                                                      "summary"), ctx.trace)
        facts = s.facts if s.strategy == "facts" else ()
        answer, prefix = None, self._cached_prefix(conv, ctx, view, t)
        if prefix is not None:
            try:
                answer = await summarize_cached(target, prefix, facts)
            except SummarizerDeclined:  # refused or a tool call: the transcript shape may still work
                pass
        text, usage = answer or await summarize(target, span, facts)
        tokens = sum(view.counts[h:t])
        problem = summary_problem(text, tokens, target.model, () if facts else SECTIONS)
        if problem is not None:
            raise SummaryRejected(problem, usage)
        text = within_limit(text, answer_tokens, model)
        await archive.put_text(handle, full)
        listing = await offloop.run_unless_light(span, self._identifier_listing, wire, span, model,
                                                 ctx.window * s.identifiers_max_share)
        message = wire.message("user", (
            f"{SUMMARY_OPEN}\n{PLACEHOLDER_MARK} {len(span)} earlier messages ({tokens:,} tokens) were compacted "
            f"into this summary; the full transcript: {read_call(tool, handle)}]\n\n{text}\n{listing}\n"
            f"</context_summary>"))
        return await records.record("summary", handle, message), usage, handle


def _kinds(wire: Codec, view: View) -> list[Kind]:
    """What each message of the view's recorded prefix is, as its record says (read from the text only for a
    record written before records kept their kinds)."""
    if view.kinds is not None:
        return view.kinds
    return [legacy_written(wire.first_text(m)) for m in view.messages[:view.kept]]
