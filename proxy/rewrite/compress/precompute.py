"""Summaries made ahead of time, so the request that crosses the compression trigger never waits for one.

When a session's prompt passes `compress.precompute` (a share of the window,
below `trigger`), the summary of the span the next compaction would replace is
written in the background: one at a time per session, across replicas (a
store lock with a renewed lease), and stored with a record of which span it
covers. The request that later crosses the trigger finds the record and, if
its messages still start with that span, replaces the span with the stored
summary at once; the messages that arrived since follow verbatim.

Byte stability is unchanged: the compaction that uses a precomputed summary
is recorded and replayed exactly like any other, and the summary text itself
is a recorded decision (the same span always gets the same summary).
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.logs import event
from proxy.lru import LRU
from proxy.request import Conversation, RequestContext
from proxy.rewrite.compress.history import chain, head_end, tail_start
from proxy.rewrite.compress.record import CompactionLog, View
from proxy.rewrite.compress.summarizer import SummarizerError, SummaryRejected
from proxy.rewrite.context_read.tool import read_tool_name
from proxy.rewrite.settings import CompressSettings
from proxy.store import StoreError
from proxy.store.archive import Archive
from proxy.store.decisions import SECONDS_PER_DAY, Decisions, adopt_any
from proxy.store.lease import renewed
from proxy.wire.codec import Codec


class Summaries(Protocol):
    """What a precompute needs of its Compress transform (proxy/rewrite/compress/transform.py): its settings, its
    lock's lease, its verbatim tail and the summary of a span (written once, reused by the crossing request)."""

    settings: CompressSettings
    lock_lease: float

    def tail_budget(self, window: int) -> int: ...

    async def summary_for(self, conv: Conversation, ctx: RequestContext, archive: Archive, h: int, t: int,
                          view: View, tool: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]: ...

_PLACEHOLDER_TOKENS = 60  # what a cleared tool result still costs, for the "will layer 1 do?" estimate
_TRACKED = 4096  # sessions whose precompute state is kept in process
_POLL_S = 0.05  # seconds between looks at a summary another request is still writing


@dataclass(frozen=True)
class Ready:
    """A precomputed summary that fits this request: the view's messages[h:upto] become `message`."""

    upto: int
    message: dict[str, Any]
    usage: list[Any]
    handle: str  # of the transcript it summarizes


def _key(log: CompactionLog, conv: Conversation, view: View) -> str:
    """Named by what the span follows (the recorded prefix in effect, or none), not by a version number:
    a client re-sending an older history after newer compactions finds the same claim as the first time."""
    base = chain(conv.digests(view.messages[:view.kept]))[-1].hex() or "raw"
    return f"{log.base}:precomputed:{base}"


def _span_chain(conv: Conversation, view: View, upto: int) -> str:
    return chain(conv.digests(view.messages[:upto]))[-1].hex()


class Precomputer:
    """Starts background summaries for one Compress transform and hands them to the crossing request.

    Which span is precomputed is decided by the first request of a compaction cycle past
    `precompute` and claimed in the store, so every replica (and a restart) agrees on it; the
    request crossing the trigger waits for a claimed summary still being written rather than
    summarizing another span itself. What goes upstream is then a function of the requests, not
    of how fast the background call was.
    """

    def __init__(self, compress: Summaries) -> None:
        self.compress = compress
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen: LRU[tuple[str, str], str] = LRU(_TRACKED)  # session -> claim key last claimed or found

    def past_precompute(self, total: int, window: int) -> bool:
        """Whether a prompt of `total` tokens is past where a summary is precomputed (a summarizing route only)."""
        s = self.compress.settings
        return bool(s.summary and s.precompute and total > s.precompute * window)

    async def maybe_start(self, conv: Conversation, ctx: RequestContext, log: CompactionLog, view: View,
                          fixed: int) -> None:
        """Claim and start the background summary if this request is past `precompute` and none is claimed."""
        total = sum(view.counts) + fixed
        if not self.past_precompute(total, ctx.window):
            return
        s = self.compress.settings
        k = (ctx.tenant, ctx.session)
        key = _key(log, conv, view)
        if self._seen.get(k) == key:
            return
        span = self._span(conv.wire, ctx, view)
        if span is None or not self._summary_needed(conv.wire, view, span, total, ctx.window):
            return
        h, t = span
        ttl = s.retention_days * SECONDS_PER_DAY
        claim = {"upto": t, "chain": _span_chain(conv, view, t), "state": "pending"}
        if not await ctx.store.put_json_if_absent(key, claim, ttl=ttl):
            self._remember(k, key)  # claimed before (another replica, or before a restart)
            return
        token = await ctx.store.acquire_lock(key + ":lock", self.compress.lock_lease)
        if token is None:  # cannot happen for a fresh claim unless the store lost it: leave it to the waiters
            await ctx.store.put_json(key, {**claim, "state": "failed"}, ttl=ttl)
            return
        self._remember(k, key)
        snapshot = copy.copy(conv)  # the request goes on being rewritten; the summary works on this moment
        snapshot.body, snapshot.events = dict(conv.body), list(conv.events)
        task = asyncio.get_running_loop().create_task(self._run(snapshot, ctx, log, view, span, key, claim, token))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def ready(self, conv: Conversation, ctx: RequestContext, log: CompactionLog, view: View) -> Ready | None:
        """The precomputed summary for this request; waits while a live holder is still writing it."""
        s = self.compress.settings
        key = _key(log, conv, view)
        deadline = time.monotonic() + self.longest_s()
        record = await ctx.store.get_json(key)
        while isinstance(record, dict) and record.get("state") == "pending":
            token = await ctx.store.acquire_lock(key + ":lock", self.compress.lock_lease)
            if token is not None:  # nobody holds it: its writer died; summarize here as if never claimed
                await ctx.store.release_lock(key + ":lock", token)
                record = await ctx.store.get_json(key)
                if isinstance(record, dict) and record.get("state") == "pending":
                    return None
                break
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(_POLL_S)
            record = await ctx.store.get_json(key)
        if not isinstance(record, dict) or record.get("state") != "done":
            return None
        upto = record.get("upto")
        h = head_end(conv.wire, view.messages)
        if not isinstance(upto, int) or not max(h, view.kept) < upto < len(view.messages):
            return None
        if _span_chain(conv, view, upto) != record.get("chain"):
            return None  # the client's history changed under it: not this span any more
        records = Decisions(ctx.store, ctx.tenant, ctx.route.name, s.retention_days)
        (message,) = await records.get("summary", [record["handle"]], adopt_any)
        if message is None:
            return None
        return Ready(upto, message, record.get("usage") or [], record["handle"])

    def busy(self) -> bool:
        """Whether a background summary is still being written (read from any thread: the set is copied)."""
        return any(not t.done() for t in self._tasks.copy())

    def longest_s(self) -> float:
        """The longest a background summary takes: its calls (cached shape, then transcript), plus slack."""
        return self.compress.settings.summary_timeout * 2 + 10

    def _remember(self, k: tuple[str, str], key: str) -> None:
        self._seen.put(k, key)

    def _span(self, wire: Codec, ctx: RequestContext, view: View) -> tuple[int, int] | None:
        """The span the next compaction would summarize if it happened now: (head end, tail start)."""
        h = head_end(wire, view.messages)
        t = tail_start(wire, view.messages, view.counts, self.compress.tail_budget(ctx.window), max(h, view.kept))
        return (h, t) if h < t and t >= view.kept else None

    def _summary_needed(self, wire: Codec, view: View, span: tuple[int, int], total: int, window: int) -> bool:
        """Whether clearing tool results alone would miss the target when the trigger is crossed."""
        s = self.compress.settings
        h, t = span
        clearable = sum(max(0, n - _PLACEHOLDER_TOKENS) for m, n in zip(view.messages[h:t], view.counts[h:t])
                        if wire.role(m) == "tool" and n >= s.min_clear_tokens)
        at_trigger = max(total, int(s.trigger * window))
        return at_trigger - clearable > s.target * window

    async def _run(self, conv: Conversation, ctx: RequestContext, log: CompactionLog, view: View,
                   span: tuple[int, int], key: str, claim: dict[str, Any], token: str) -> None:
        s = self.compress.settings
        h, t = span
        ttl = s.retention_days * SECONDS_PER_DAY
        outcome: dict[str, Any] = {**claim, "state": "failed"}
        try:
            async with renewed(ctx.store, key + ":lock", token, self.compress.lock_lease):
                try:
                    if await ctx.store.get(log.breaker):
                        return
                    archive = Archive(ctx.store, ctx.tenant, s.retention_days, ctx.archive_quota)
                    tool = read_tool_name(conv)
                    _, usage, handle = await self.compress.summary_for(conv, ctx, archive, h, t, view, tool)
                    outcome = {**claim, "state": "done", "handle": handle, "usage": usage}
                    event("summary precomputed", request_id=ctx.request_id, session=ctx.session, messages=t - h)
                except SummaryRejected as e:
                    event("precomputed summary rejected", request_id=ctx.request_id, session=ctx.session,
                          reason=e.reason)
                    await ctx.store.put(log.breaker, b"1", ttl=s.breaker_cooldown)
                except SummarizerError as e:
                    event("summary precompute failed", request_id=ctx.request_id, session=ctx.session, error=str(e))
                    await ctx.store.put(log.breaker, b"1", ttl=s.breaker_cooldown)
                finally:
                    await ctx.store.put_json(key, outcome, ttl=ttl)  # before the lock goes: waiters see it
        except StoreError as e:
            event("summary precompute skipped: store unavailable", request_id=ctx.request_id, error=str(e))
        except Exception as e:  # noqa: BLE001 - a background task must never take anything down
            event("summary precompute crashed", request_id=ctx.request_id, error=repr(e))
