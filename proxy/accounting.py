"""Usage and cache accounting: per request, per session timeline, per route/model counters, metrics.

Everything is written to the store (figures survive restarts and add up across
replicas) in a background task after the response, so accounting never adds
to the client's latency and a failing store never fails a request.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.conversation import Conversation, RequestContext
from proxy.logs import event, log
from proxy.metrics import Metrics
from proxy.prefix_check import PrefixCheck, Trace, compare, expiry_cause
from proxy.store import Store, StoreError
from proxy.tokens import default_counter, message_digest
from proxy.usage import Usage, parse_usage

HOUR = 3600
TIMELINE_MAX = 500  # requests kept per session timeline
RETENTION = 30 * 86_400  # seconds session timelines and summaries are kept
_TRACES_CACHED = 1_000
FIELDS = ("requests", "errors", "prompt", "cached", "reported_prompt", "cacheable", "completion", "own_calls",
          "own_prompt", "own_cached", "saved_offload", "saved_compress", "breaks", "offloads", "compactions")


SESSIONS_PREFIX = "sessions:"  # counters sessions:{tenant}:{session} = requests: the session index
SESSION_STATS_PREFIX = "sessstat:"  # counters sessstat:{tenant}:{session}|{prompt,cached,breaks}
FLUSH_DELAY = 0.05  # seconds a batch gathers requests before one round of store writes
MAX_PENDING = 5000  # timeline entries waiting for the store, at most (memory stays bounded)


def session_key(tenant: str, session: str) -> str:
    return f"t:{tenant}:session:{session}"


async def session_summaries(store: Store, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """What /ctx/v1/sessions shows per session, assembled from counters and blind-written records
    (no read-modify-write, so concurrent requests of one session never lose an update)."""
    if not pairs:
        return []
    keys = [session_key(t, s) for t, s in pairs]
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
        row.update(first=orjson.loads(first) if first else row.get("last"),
                   requests=requests.get(f"{SESSIONS_PREFIX}{t}:{s}", 0),
                   prompt=stats.get(base + "prompt", 0), cached=stats.get(base + "cached", 0),
                   breaks=stats.get(base + "breaks", 0), last_break=orjson.loads(brk) if brk else None)
        out.append(row)
    return out


def timeline_key(tenant: str, session: str) -> str:
    return f"t:{tenant}:s:{session}:timeline"


def stats_prefix(tenant: str) -> str:
    return f"stats:{tenant}:"


@dataclass
class Outcome:
    """What happened to one chat request, filled in as the response completes."""

    status: int = 0
    usage: Usage | None = None
    own: list[tuple[str, Usage]] = field(default_factory=list)  # (kind, usage) of the proxy's own calls
    overhead_s: float = 0.0
    upstream_s: float = 0.0
    error: str | None = None


class Accountant:
    def __init__(self, store: Store, metrics: Metrics) -> None:
        self.store, self.metrics = store, metrics
        self._traces: OrderedDict[tuple[str, str], Trace] = OrderedDict()
        self._batch = _Batch()
        self._flusher: asyncio.Task | None = None
        self._firsts_written: set[str] = set()

    def trace(self, conv: Conversation, ctx: RequestContext) -> Trace:
        model = conv.body.get("model")
        sent = list(conv.messages)
        for i, m in conv.notes.get("unmarked", {}).items():  # cache markers are not content
            sent[i] = m
        tools = conv.body.get("tools") or []
        digests = conv.digests(sent)
        compaction = max((e.detail.get("version", 0) for e in conv.events if e.kind == "compaction"), default=0)
        system = 0
        while system < len(conv.client_messages) and conv.client_messages[system].get("role") in ("system", "developer"):
            system += 1
        return Trace(raw=conv.digests(conv.client_messages), system=system, sent=digests, counts=conv.counts(sent),
                     tools=message_digest({"tools": tools}) if tools else b"",
                     tool_names=[str((t.get("function") or {}).get("name") or t.get("name")) for t in tools
                                 if isinstance(t, dict)],
                     tool_tokens=default_counter.count_tools(tools, model), compaction=compaction)

    async def check(self, ctx: RequestContext, trace: Trace) -> PrefixCheck:
        key = (ctx.tenant, ctx.session)
        prev = self._traces.get(key)
        if prev is None:
            try:
                raw = await self.store.get_json(f"t:{ctx.tenant}:s:{ctx.session}:trace")
                prev = Trace.from_json(raw) if raw else None
            except StoreError:
                prev = None
        return compare(prev, trace)

    def record(self, ctx: RequestContext, conv: Conversation, trace: Trace, check: PrefixCheck,
               outcome: Outcome) -> None:
        """Metrics now; the store in the background."""
        key = (ctx.tenant, ctx.session)
        self._traces[key] = trace
        self._traces.move_to_end(key)
        if len(self._traces) > _TRACES_CACHED:
            self._traces.popitem(last=False)
        try:
            entry = self._entry(ctx, conv, check, outcome)
            self._metrics(ctx, entry, outcome)
        except Exception:  # accounting must never be the reason a request fails
            log.exception("accounting failed", extra={"fields": {"request_id": ctx.request_id}})
            return
        self._queue(ctx, trace, entry)

    def _entry(self, ctx: RequestContext, conv: Conversation, check: PrefixCheck, o: Outcome) -> dict[str, Any]:
        u = o.usage
        cause = expiry_cause(check, u.cached if u else None)
        offloads = [e for e in conv.events if e.kind == "offload"]
        compact = next((e.detail for e in conv.events if e.kind == "compact"), None)
        own_prompt = sum(x.prompt for _, x in o.own)
        return {
            "ts": round(time.time(), 3), "request_id": ctx.request_id, "route": ctx.route.name, "model": ctx.model,
            "status": o.status, "error": o.error, "stream": ctx.stream,
            "prompt": u.prompt if u else None, "cached": u.cached if u else None,
            "completion": u.completion if u else None, "cacheable": check.cacheable, "previous": check.previous,
            "break": cause, "offloaded": len(offloads),
            "saved_offload": sum(e.detail["saved"] for e in offloads),
            "compacted": compact["layer"] if compact else None,
            "saved_compress": max(0, compact["before"] - compact["after"]) if compact else 0,
            "own_calls": len(o.own), "own_prompt": own_prompt,
            "own_cached": sum(x.cached or 0 for _, x in o.own),
            "overhead_ms": round(o.overhead_s * 1000, 3), "upstream_ms": round(o.upstream_s * 1000, 3),
            "degraded": any(e.kind == "degraded" for e in conv.events),
        }

    def _metrics(self, ctx: RequestContext, e: dict[str, Any], o: Outcome) -> None:
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
        if e["offloaded"]:
            m.saved.labels(*labels, "offload").inc(e["saved_offload"])
        if e["compacted"]:
            m.compactions.labels(*labels, e["compacted"]).inc()
            m.saved.labels(*labels, "compress").inc(e["saved_compress"])
        if e["break"]:
            m.breaks.labels(*labels, e["break"]).inc()
        if e["degraded"]:
            m.degraded.labels(*labels).inc()
        m.overhead.labels(*labels).observe(o.overhead_s)
        if o.upstream_s:
            m.upstream.labels(*labels).observe(o.upstream_s)

    def _queue(self, ctx: RequestContext, trace: Trace, e: dict[str, Any]) -> None:
        """Fold one request into the pending batch: counters add up, the latest trace and meta win."""
        values = {
            "requests": 1, "errors": int(e["status"] >= 400), "prompt": e["prompt"] or 0,
            "cached": e["cached"] or 0, "reported_prompt": (e["prompt"] or 0) if e["cached"] is not None else 0,
            "cacheable": e["cacheable"], "completion": e["completion"] or 0, "own_calls": e["own_calls"],
            "own_prompt": e["own_prompt"], "own_cached": e["own_cached"], "saved_offload": e["saved_offload"],
            "saved_compress": e["saved_compress"], "breaks": int(bool(e["break"])),
            "offloads": e["offloaded"], "compactions": int(bool(e["compacted"])),
        }
        group = f"{stats_prefix(ctx.tenant)}{ctx.route.name}|{ctx.model or ''}"
        b = self._batch
        for bucket in ("all", f"h{int(e['ts'] // HOUR)}"):
            for k, v in values.items():
                if v:
                    b.amounts[f"{group}|{bucket}|{k}"] += v
        sess = f"{ctx.tenant}:{ctx.session}"
        b.amounts[f"{SESSIONS_PREFIX}{sess}"] += 1
        for k in ("prompt", "cached", "breaks"):
            if values[k]:
                b.amounts[f"{SESSION_STATS_PREFIX}{sess}|{k}"] += values[k]
        b.traces[f"t:{ctx.tenant}:s:{ctx.session}:trace"] = trace.to_json()
        b.metas[session_key(ctx.tenant, ctx.session)] = {"session": ctx.session, "route": ctx.route.name,
                                                         "model": ctx.model, "last": e["ts"]}
        b.firsts.setdefault(session_key(ctx.tenant, ctx.session) + ":first", e["ts"])
        if e["break"]:
            b.breaks[session_key(ctx.tenant, ctx.session) + ":break"] = e["break"]
        if len(b.logs) < MAX_PENDING:
            b.logs.append((timeline_key(ctx.tenant, ctx.session), orjson.dumps(e)))
        else:
            b.dropped += 1  # the store cannot keep up: timelines lose entries, counters stay exact
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """Write what accumulated, in few store operations: under load a batch holds many requests."""
        await asyncio.sleep(FLUSH_DELAY)
        while self._batch.logs or self._batch.amounts:
            b, self._batch = self._batch, _Batch()
            if b.dropped:
                event("accounting backlog: timeline entries dropped", dropped=b.dropped)
            try:
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
                await self.store.append_logs(b.logs, max_len=TIMELINE_MAX, ttl=RETENTION)
            except StoreError as err:
                event("accounting not stored: store unavailable", requests=len(b.logs), error=str(err))

    async def drain(self) -> None:
        """Wait for pending writes (shutdown, tests)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.gather(self._flusher, return_exceptions=True)


@dataclass
class _Batch:
    amounts: defaultdict[str, int | float] = field(default_factory=lambda: defaultdict(int))
    traces: dict[str, Any] = field(default_factory=dict)
    metas: dict[str, Any] = field(default_factory=dict)
    breaks: dict[str, str] = field(default_factory=dict)
    firsts: dict[str, float] = field(default_factory=dict)
    logs: list[tuple[str, bytes]] = field(default_factory=list)
    dropped: int = 0


def usage_from_events(conv: Conversation) -> list[tuple[str, Usage]]:
    """The summarizer calls a compaction made during this request."""
    out = []
    for e in conv.events:
        if e.kind == "compact":
            for u in e.detail.get("summary_calls") or ():
                parsed = parse_usage(u)
                if parsed:
                    out.append(("summary", parsed))
    return out
