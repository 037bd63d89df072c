"""Usage and cache accounting: per request, per session timeline, per route/model counters, metrics.

Everything is written to the store (figures survive restarts and add up across
replicas) in a background task after the response, so accounting never adds
to the client's latency and a failing store never fails a request.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
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
_TRACES_CACHED = 10_000
FIELDS = ("requests", "errors", "prompt", "cached", "reported_prompt", "cacheable", "completion", "own_calls",
          "own_prompt", "own_cached", "saved_offload", "saved_compress", "breaks", "offloads", "compactions")


SESSIONS_PREFIX = "sessions:"  # counters sessions:{tenant}:{session} = requests: the session index


def session_key(tenant: str, session: str) -> str:
    return f"t:{tenant}:session:{session}"


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
        self._tasks: set[asyncio.Task] = set()

    def trace(self, conv: Conversation, ctx: RequestContext) -> Trace:
        model = conv.body.get("model")
        unmarked = conv.notes.get("unmarked", {})  # cache markers are not content
        sent = [unmarked.get(i, m) for i, m in enumerate(conv.messages)]
        tools = conv.body.get("tools") or []
        digests = [conv.digest(m) for m in sent]
        compaction = max((e.detail.get("version", 0) for e in conv.events if e.kind == "compaction"), default=0)
        system = 0
        while system < len(conv.client_messages) and conv.client_messages[system].get("role") in ("system", "developer"):
            system += 1
        return Trace(raw=[conv.digest(m) for m in conv.client_messages], system=system, sent=digests,
                     counts=default_counter.message_counts(sent, model, digests),
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
        task = asyncio.get_running_loop().create_task(self._write(ctx, trace, entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        m, labels = self.metrics, (ctx.route.name, ctx.model or "")
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

    async def _write(self, ctx: RequestContext, trace: Trace, e: dict[str, Any]) -> None:
        base = f"t:{ctx.tenant}:s:{ctx.session}"
        values = {
            "requests": 1, "errors": int(e["status"] >= 400), "prompt": e["prompt"] or 0,
            "cached": e["cached"] or 0, "reported_prompt": (e["prompt"] or 0) if e["cached"] is not None else 0,
            "cacheable": e["cacheable"], "completion": e["completion"] or 0, "own_calls": e["own_calls"],
            "own_prompt": e["own_prompt"], "own_cached": e["own_cached"], "saved_offload": e["saved_offload"],
            "saved_compress": e["saved_compress"], "breaks": int(bool(e["break"])),
            "offloads": e["offloaded"], "compactions": int(bool(e["compacted"])),
        }
        hour = int(e["ts"] // HOUR)
        group = f"{stats_prefix(ctx.tenant)}{ctx.route.name}|{ctx.model or ''}"
        amounts = {f"{group}|{bucket}|{k}": v for bucket in ("all", f"h{hour}") for k, v in values.items() if v}
        amounts[f"{SESSIONS_PREFIX}{ctx.tenant}:{ctx.session}"] = 1
        try:
            await self.store.put_json(f"{base}:trace", trace.to_json(), ttl=RETENTION)
            await self.store.incr_many(amounts)
            await self.store.append_log(timeline_key(ctx.tenant, ctx.session), orjson.dumps(e), max_len=TIMELINE_MAX, ttl=RETENTION)
            summary = await self.store.get_json(session_key(ctx.tenant, ctx.session)) or {
                "session": ctx.session, "first": e["ts"], "requests": 0, "prompt": 0, "cached": 0, "breaks": 0}
            summary.update(last=e["ts"], route=ctx.route.name, model=ctx.model, requests=summary["requests"] + 1,
                           prompt=summary["prompt"] + (e["prompt"] or 0), cached=summary["cached"] + (e["cached"] or 0),
                           breaks=summary["breaks"] + int(bool(e["break"])), last_break=e["break"] or summary.get("last_break"))
            await self.store.put_json(session_key(ctx.tenant, ctx.session), summary, ttl=RETENTION)
        except StoreError as err:
            event("accounting not stored: store unavailable", request_id=ctx.request_id, error=str(err))

    async def drain(self) -> None:
        """Wait for pending writes (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


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
