"""Usage and cache accounting: per request, per session timeline, per route/model counters, metrics.

Every figure comes from one request's `Figures` (proxy/accounting/figures.py), so the
headers, the timeline, the counters, /metrics, the dashboard and `ctxproxy
stats` agree. Everything is written to the store (figures survive restarts and
add up across replicas) in batches off the request path, so accounting never
adds to the client's latency and a failing store never fails a request; a
reader of this process first writes what is pending (`settle`), so a request
is visible as soon as its response has completed.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from proxy import offloop
from proxy.accounting import inspector
from proxy.accounting.figures import Figures, measure
from proxy.accounting.ledger import Ledger
from proxy.accounting.metrics import Metrics
from proxy.accounting.prefix_check import PrefixCheck, Trace, compare, expiry_cause
from proxy.logs import event, log
from proxy.lru import LRU
from proxy.request import Conversation, RequestContext
from proxy.rewrite.compress.history import system_end
from proxy.rewrite.context_read.rate import HandleCounts, ReadBack, read_back
from proxy.rewrite.events import Compacted, CompactionInEffect
from proxy.store import Store, StoreError
from proxy.store.keys import session_key, tenant_key
from proxy.tokens.counter import default_counter, message_digest
from proxy.wire import jsonio
from proxy.wire.usage import Usage, parse_usage

if TYPE_CHECKING:
    from proxy.request import ReadRounds as Rounds

HOUR = 3600
TIMELINE_MAX = 500  # requests kept per session timeline
INSPECT_MAX = 100  # requests per session whose inspector record is kept (the newest)
TEXTS_MAX = 5000  # distinct texts kept per session for the inspector (a status or placeholder is stored once)
RETENTION = 30 * 86_400  # seconds session timelines and summaries are kept
_TRACES_CACHED = 1_000
# Counters per tenant, route, model and hour; see README "What the figures mean".
FIELDS = ("requests", "errors", "prompt", "cached", "reported_prompt", "cacheable", "completion", "own_calls",
          "own_prompt", "own_cached", "client_tokens", "sent_tokens", "saved_offload", "saved_compress", "breaks",
          "offloads", "compactions", "read_rounds", "handles_given", "handles_read")
# The same counters per session (requests are counted in the session index).
SESSION_FIELDS = tuple(f for f in FIELDS if f not in ("requests", "reported_prompt"))

SESSIONS_PREFIX = "sessions:"  # counters sessions:{tenant}:{session} = requests: the session index
SESSION_STATS_PREFIX = "sessstat:"  # counters sessstat:{tenant}:{session}|{field}
FLUSH_DELAY = 0.05  # seconds a batch gathers requests before one round of store writes
MAX_PENDING = 5000  # timeline entries waiting for the store, at most (memory stays bounded)


def session_record_key(tenant: str, session: str) -> str:
    return tenant_key(tenant, "session", session)


def timeline_key(tenant: str, session: str) -> str:
    return session_key(tenant, session, "timeline")


def inspect_key(tenant: str, session: str) -> str:
    return session_key(tenant, session, "inspect")


def texts_key(tenant: str, session: str) -> str:
    return session_key(tenant, session, "texts")


def stats_prefix(tenant: str) -> str:
    return f"stats:{tenant}:"


def derived(t: dict[str, Any]) -> dict[str, Any]:
    """Figures that follow from the counters, the same way everywhere (stats, sessions)."""
    saved = t.get("client_tokens", 0) - t.get("sent_tokens", 0)
    given = t.get("handles_given", 0)
    return {"saved_tokens": saved,
            "added_tokens": t.get("saved_offload", 0) + t.get("saved_compress", 0) - saved,
            "readback_rate": round(t.get("handles_read", 0) / given, 4) if given else None}


async def session_summaries(store: Store, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """What /ctx/v1/sessions shows per session, assembled from counters and blind-written records
    (no read-modify-write, so concurrent requests of one session never lose an update)."""
    if not pairs:
        return []
    keys = [session_record_key(t, s) for t, s in pairs]
    metas = await store.get_many(keys)
    firsts = await store.get_many([k + ":first" for k in keys])
    breaks = await store.get_many([k + ":break" for k in keys])
    tenants = {t for t, _ in pairs}
    stats: dict[str, int | float] = {}
    for t in tenants:
        stats.update(await store.counters(f"{SESSION_STATS_PREFIX}{t}:"))
    requests: dict[str, int | float] = {}
    for t in tenants:
        requests.update(await store.counters(f"{SESSIONS_PREFIX}{t}:"))
    out = []
    for (t, s), meta, first, brk in zip(pairs, metas, firsts, breaks):
        if meta is None:
            continue
        row = orjson.loads(meta)
        base = f"{SESSION_STATS_PREFIX}{t}:{s}|"
        counts = {f: stats.get(base + f, 0) for f in SESSION_FIELDS}
        row.update(first=orjson.loads(first) if first else row.get("last"),
                   requests=requests.get(f"{SESSIONS_PREFIX}{t}:{s}", 0), **counts, **derived(counts),
                   last_break=orjson.loads(brk) if brk else None)
        out.append(row)
    return out


@dataclass
class Outcome:
    """What happened to one chat request, filled in as the response completes."""

    status: int = 0
    usage: Usage | None = None  # every provider call of the turn, summed (hidden read-back rounds included)
    own: list[tuple[str, Usage]] = field(default_factory=list)  # (kind, usage) of the proxy's own calls
    overhead_s: float = 0.0
    upstream_s: float = 0.0
    error: str | None = None
    accepted: bool = False  # the provider answered the request with a 2xx: it was processed (and cached)


class Accountant:
    def __init__(self, store: Store, metrics: Metrics, log_content: bool = False) -> None:
        self.store, self.metrics, self.log_content = store, metrics, log_content
        self._traces: LRU[tuple[str, str], Trace] = LRU(_TRACES_CACHED)
        self._batch = _Batch()
        self._flusher: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()
        self._gathering = False  # the flusher is waiting for its batch to fill
        self._firsts_written: set[str] = set()
        self._handles = HandleCounts(store, RETENTION)

    async def open(self, ctx: RequestContext, conv: Conversation, outcome: Outcome) -> Ledger:
        """The request's ledger: measured once, here; closed once, by the handler (proxy/accounting/ledger.py).

        Measuring walks every message (digests, counts, the alignment, the inspector's roles): on the pool
        for a big body (proxy/offloop.py body_is_light), so that closing the ledger walks none of them."""
        if offloop.body_is_light(len(conv.raw), len(conv.messages)):
            trace, figures, roles = self._measure(conv, ctx)
        else:
            trace, figures, roles = await offloop.run(self._measure, conv, ctx)
        return Ledger(self, ctx, conv, trace, figures, await self.check(ctx, trace), outcome, roles=roles)

    def _measure(self, conv: Conversation, ctx: RequestContext) -> tuple[Trace, Figures, str]:
        trace = self.trace(conv, ctx)
        return trace, measure(conv, trace), inspector.roles(conv)

    def trace(self, conv: Conversation, ctx: RequestContext) -> Trace:
        model = conv.model
        sent = list(conv.messages)
        for i, m in conv.unmarked.items():  # cache markers are not content
            sent[i] = m
        tools = conv.tools or []
        digests = conv.digests(sent)
        compaction = max((e.version for e in conv.kinds(CompactionInEffect)), default=0)
        system = system_end(conv.wire, conv.client_messages)
        prefix = conv.prefix  # the top-level system prompt, where the API has one: counted with the tools
        return Trace(raw=conv.digests(conv.client_messages), system=system, sent=digests, counts=conv.counts(sent),
                     tools=message_digest({"tools": tools}) if tools else b"",
                     tool_names=conv.wire.tool_names(tools),
                     tool_tokens=default_counter.count_tools(tools, model) + conv.prefix_tokens(),
                     compaction=compaction, prefix=conv.digest(prefix) if prefix is not None else b"")

    async def check(self, ctx: RequestContext, trace: Trace) -> PrefixCheck:
        """This request against the session's previous one the provider accepted."""
        key = (ctx.tenant, ctx.session)
        prev = self._traces.get(key)
        if prev is None:
            try:
                raw = await self.store.get_json(session_key(ctx.tenant, ctx.session, "trace"))
                prev = Trace.from_json(raw) if raw else None
            except StoreError:
                prev = None
            if prev is not None:
                self._keep_trace(key, prev)
        return compare(prev, trace)

    def _keep_trace(self, key: tuple[str, str], trace: Trace) -> None:
        self._traces.put(key, trace)

    def record(self, ctx: RequestContext, conv: Conversation, trace: Trace, check: PrefixCheck, outcome: Outcome,
               figures: Figures, rounds: Rounds | None = None, roles: str | None = None) -> dict[str, Any]:
        """Metrics now; the store in the background. Returns fields for the request's log line.

        Only a request the provider accepted becomes the session's previous
        request (what the next one's cached prefix is measured against).
        """
        key = (ctx.tenant, ctx.session)
        previous = self._traces.get(key)
        if outcome.accepted:
            self._keep_trace(key, trace)
        try:
            read = read_back(rounds, conv)
            entry = self._entry(ctx, check, outcome, figures, rounds, read)
            inspect = inspector.record(ctx.request_id, conv, trace, figures,
                                       inspector.read_rounds(conv.wire, read.messages, read.usages, conv.model), roles)
            texts = inspector.new_texts(conv, trace, figures, previous, self.log_content, read.messages)
            self._metrics(ctx, entry, outcome, figures)
        except Exception:  # accounting must never be the reason a request fails
            log.exception("accounting failed", extra={"fields": {"request_id": ctx.request_id}})
            return {}
        self._queue(ctx, trace if outcome.accepted else None, entry, figures, inspect, texts, read.handles)
        if not self.log_content:
            return {}
        known = set(previous.raw) if previous is not None else set()
        return {"client_messages": [{"index": i, "message": m} for i, (d, m)
                                    in enumerate(zip(trace.raw, conv.client_messages)) if d not in known]}

    def _entry(self, ctx: RequestContext, check: PrefixCheck, o: Outcome, f: Figures, rounds: Rounds | None,
               read: ReadBack) -> dict[str, Any]:
        u, ok = o.usage, o.accepted
        return {
            "ts": round(time.time(), 3), "request_id": ctx.request_id, "route": ctx.route.name, "model": ctx.model,
            "status": o.status, "error": o.error, "stream": ctx.stream, "accepted": ok,
            "prompt": u.prompt if u else None, "cached": u.cached if u else None,
            "completion": u.completion if u else None, "cacheable": check.cacheable if ok else 0,
            "previous": check.previous, "break": expiry_cause(check, u.cached if u else None) if ok else None,
            "offloaded": f.placeholders, "offloaded_new": len(f.offloads_new),
            "client_tokens": f.client_tokens if ok else None, "sent_tokens": f.sent_tokens if ok else None,
            "saved": f.saved if ok else None, "saved_offload": f.saved_offload if ok else None,
            "saved_compress": f.saved_compress if ok else None, "added": f.added if ok else None,
            "compacted": f.compacted, "compactions": len(f.compactions),
            "read_rounds": rounds.done if rounds is not None else 0, "read_handles": len(read.handles),
            "own_calls": len(o.own), "own_prompt": sum(x.prompt for _, x in o.own),
            "own_cached": sum(x.cached or 0 for _, x in o.own),
            "overhead_ms": round(o.overhead_s * 1000, 3), "upstream_ms": round(o.upstream_s * 1000, 3),
            "degraded": f.degraded,
        }

    def _metrics(self, ctx: RequestContext, e: dict[str, Any], o: Outcome, f: Figures) -> None:
        m, labels = self.metrics, (ctx.route.name, self.metrics.model_label(ctx.model))
        m.requests.labels(*labels, str(o.status)).inc()
        if e["prompt"] is not None:
            m.prompt.labels(*labels).inc(e["prompt"])
            m.completion.labels(*labels).inc(e["completion"])
        if e["cached"] is not None:
            m.cached.labels(*labels).inc(e["cached"])
        m.cacheable.labels(*labels).inc(e["cacheable"])
        for kind, usage in o.own:
            m.own_prompt.labels(*labels, kind).inc(usage.prompt)
        if e["offloaded_new"]:
            m.offloads.labels(*labels).inc(e["offloaded_new"])
        for layer in f.compactions:
            m.compactions.labels(*labels, layer).inc()
        if o.accepted:
            m.client_tokens.labels(*labels).inc(f.client_tokens)
            m.sent_tokens.labels(*labels).inc(f.sent_tokens)
            for by, amount in (("offload", f.saved_offload), ("compress", f.saved_compress)):
                if amount > 0:  # a counter never goes down; the exact net is client - sent
                    m.saved.labels(*labels, by).inc(amount)
        if e["read_rounds"]:
            m.read_rounds.labels(*labels).inc(e["read_rounds"])
        if e["break"]:
            m.breaks.labels(*labels, e["break"]).inc()
        if e["degraded"]:
            m.degraded.labels(*labels).inc()
        m.overhead.labels(*labels).observe(o.overhead_s)
        if o.upstream_s:
            m.upstream.labels(*labels).observe(o.upstream_s)

    def _queue(self, ctx: RequestContext, trace: Trace | None, e: dict[str, Any], f: Figures,
               inspect: dict[str, Any], texts: list[dict[str, Any]], reads: list[str]) -> None:
        """Fold one request into the pending batch: counters add up, the latest trace and meta win."""
        ok = e["accepted"]
        values = {
            "requests": 1, "errors": int(e["status"] >= 400), "prompt": e["prompt"] or 0,
            "cached": e["cached"] or 0, "reported_prompt": (e["prompt"] or 0) if e["cached"] is not None else 0,
            "cacheable": e["cacheable"], "completion": e["completion"] or 0, "own_calls": e["own_calls"],
            "own_prompt": e["own_prompt"], "own_cached": e["own_cached"],
            "client_tokens": e["client_tokens"] or 0, "sent_tokens": e["sent_tokens"] or 0,
            "saved_offload": e["saved_offload"] or 0, "saved_compress": e["saved_compress"] or 0,
            "breaks": int(bool(e["break"])), "offloads": e["offloaded_new"], "compactions": e["compactions"],
            "read_rounds": e["read_rounds"],
        }
        group = f"{stats_prefix(ctx.tenant)}{ctx.route.name}|{ctx.model or ''}"
        hour = int(e["ts"] // HOUR)
        b = self._batch
        for bucket in ("all", f"h{hour}"):
            for k, v in values.items():
                if v:
                    b.amounts[f"{group}|{bucket}|{k}"] += v
        sess = f"{ctx.tenant}:{ctx.session}"
        b.amounts[f"{SESSIONS_PREFIX}{sess}"] += 1
        for k in SESSION_FIELDS:
            if values.get(k):
                b.amounts[f"{SESSION_STATS_PREFIX}{sess}|{k}"] += values[k]
        if trace is not None:
            b.traces[session_key(ctx.tenant, ctx.session, "trace")] = trace.to_json()
        b.metas[session_record_key(ctx.tenant, ctx.session)] = {"session": ctx.session, "route": ctx.route.name,
                                                         "model": ctx.model, "last": e["ts"]}
        b.firsts.setdefault(session_record_key(ctx.tenant, ctx.session) + ":first", e["ts"])
        if e["break"]:
            b.breaks[session_record_key(ctx.tenant, ctx.session) + ":break"] = e["break"]
        if ok and f.given:
            b.given.append((ctx.tenant, ctx.session, group, hour, f.given))
        if reads:
            b.reads.append((ctx.tenant, reads))
        if len(b.logs) < MAX_PENDING:
            b.logs.append((timeline_key(ctx.tenant, ctx.session), jsonio.dumps(e)))
            b.inspects.append((inspect_key(ctx.tenant, ctx.session), jsonio.dumps(inspect)))
            b.texts += [(texts_key(ctx.tenant, ctx.session), jsonio.dumps(t)) for t in texts]
        else:
            b.dropped += 1  # the store cannot keep up: timelines lose entries, counters stay exact
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """Write what accumulated, in few store operations: under load a batch holds many requests."""
        self._gathering = True
        try:
            await asyncio.sleep(FLUSH_DELAY)
        except asyncio.CancelledError:  # drain(): write now
            pass
        self._gathering = False
        await self.settle()

    async def settle(self) -> None:
        """Write everything pending now, and wait for a write in progress: a reader of this process then
        sees every request whose response has completed."""
        async with self._writing:
            while self._batch.logs or self._batch.amounts:
                b, self._batch = self._batch, _Batch()
                if b.dropped:
                    event("accounting backlog: timeline entries dropped", dropped=b.dropped)
                try:
                    await self._write(b)
                except StoreError as err:
                    event("accounting not stored: store unavailable", requests=len(b.logs), error=str(err))

    async def _write(self, b: _Batch) -> None:
        await self._count_handles(b)  # before the counters are written: it adds to them
        await self.store.incr_many(dict(b.amounts))
        for key, value in b.traces.items():
            await self.store.put_json(key, value, ttl=RETENTION)
        for key, value in b.metas.items():
            await self.store.put_json(key, value, ttl=RETENTION)
        for key, value in b.breaks.items():
            await self.store.put_json(key, value, ttl=RETENTION)
        for key, ts in b.firsts.items():
            if key not in self._firsts_written:
                await self.store.put_json_if_absent(key, ts, ttl=RETENTION)
                if len(self._firsts_written) > _TRACES_CACHED:
                    self._firsts_written.clear()
                self._firsts_written.add(key)
        if b.texts:
            await self.store.append_logs(b.texts, max_len=TEXTS_MAX, ttl=RETENTION)
        await self.store.append_logs(b.inspects, max_len=INSPECT_MAX, ttl=RETENTION)
        await self.store.append_logs(b.logs, max_len=TIMELINE_MAX, ttl=RETENTION)

    async def _count_handles(self, b: _Batch) -> None:
        def count(group: str, hour: int, sess: str, name: str) -> None:
            self._count(b, group, hour, sess, name)

        for tenant, session, group, hour, handles in b.given:
            await self._handles.given(tenant, session, group, hour, handles, count)
        for tenant, handles in b.reads:
            await self._handles.read(tenant, handles, count)

    def _count(self, b: _Batch, group: str, hour: int, sess: str, name: str) -> None:
        for bucket in ("all", f"h{hour}"):
            b.amounts[f"{group}|{bucket}|{name}"] += 1
        b.amounts[f"{SESSION_STATS_PREFIX}{sess}|{name}"] += 1
        route, _, model = group[group.index(":", len("stats:")) + 1:].partition("|")
        (self.metrics.handles_given if name == "handles_given" else self.metrics.handles_read).labels(
            route, model).inc()

    async def drain(self) -> None:
        """Write what is pending now and wait for it (shutdown, tests)."""
        if self._flusher is not None and self._gathering:
            self._flusher.cancel()  # only its wait: a write in progress is never interrupted
        while self._flusher is not None and not self._flusher.done():
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.settle()


@dataclass
class _Batch:
    amounts: defaultdict[str, int | float] = field(default_factory=lambda: defaultdict(int))
    traces: dict[str, Any] = field(default_factory=dict)
    metas: dict[str, Any] = field(default_factory=dict)
    breaks: dict[str, str] = field(default_factory=dict)
    firsts: dict[str, float] = field(default_factory=dict)
    logs: list[tuple[str, bytes]] = field(default_factory=list)
    inspects: list[tuple[str, bytes]] = field(default_factory=list)
    texts: list[tuple[str, bytes]] = field(default_factory=list)
    given: list[tuple[str, str, str, int, list[str]]] = field(default_factory=list)
    reads: list[tuple[str, list[str]]] = field(default_factory=list)
    dropped: int = 0


def usage_from_events(conv: Conversation) -> list[tuple[str, Usage]]:
    """The summarizer calls compactions made during this request (a retried pipeline run's included)."""
    out = []
    for e in [*conv.earlier_events, *conv.events]:
        if isinstance(e, Compacted):
            for u in e.summary_calls:
                parsed = parse_usage(u)
                if parsed:
                    out.append(("summary", parsed))
    return out
