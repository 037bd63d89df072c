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

from proxy import offloop
from proxy.accounting import inspector
from proxy.accounting.counters import (
    HOUR,
    INSPECT_MAX,
    RETENTION,
    SESSION_STATS_PREFIX,
    TEXTS_MAX,
    TIMELINE_MAX,
    add_counts,
    group_of,
    inspect_key,
    session_record_key,
    texts_key,
    timeline_key,
)
from proxy.accounting.figures import Figures, measure
from proxy.accounting.ledger import Ledger, Outcome
from proxy.accounting.metrics import Metrics
from proxy.accounting.own_calls import own_call_counts, own_call_entry
from proxy.accounting.prefix_check import UNMEASURED, PrefixCheck, PrefixTrace, expiry_cause, hidden_cacheable
from proxy.accounting.previous import Previous
from proxy.logs import event, log
from proxy.request import Conversation, RequestContext
from proxy.request.events import CompactionInEffect, HistoryElsewhere
from proxy.rewrite.compress.history import system_end
from proxy.rewrite.context_read.rate import HandleCounts, ReadBack, read_back
from proxy.store import Store, StoreError
from proxy.store.base import Writes
from proxy.tokens.counter import message_digest
from proxy.wire import jsonio
from proxy.wire.usage import Usage

if TYPE_CHECKING:
    from proxy.request import ReadRounds as Rounds

_FIRSTS_REMEMBERED = 1_000  # sessions whose first-seen time this process knows is written
FLUSH_DELAY = 0.05  # seconds a batch gathers requests before one round of store writes
MAX_PENDING = 5000  # timeline entries waiting for the store, at most (memory stays bounded)


_OWN_TEXT_CHARS = 20_000  # of one message of an own call's prompt kept for the inspector


def _trigger(ctx: RequestContext) -> int | None:
    """The prompt size (tokens, the answer's reserve included) at which the route compacts; None: it never does."""
    compress = ctx.route.section("compress")
    return int(compress.trigger * ctx.window) if compress is not None and compress.enabled else None


class Accountant:
    def __init__(self, store: Store, metrics: Metrics, log_content: bool = False, shared: bool = False) -> None:
        """`shared`: other processes serve this proxy's sessions too (Previous: traces are read from the store)."""
        self.store, self.metrics, self.log_content, self.shared = store, metrics, log_content, shared
        self._previous = Previous(store, shared)
        self._trace_writes: set[asyncio.Task[None]] = set()
        self._batch = _Batch()
        self._flusher: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()
        self._gathering = False  # the flusher is waiting for its batch to fill
        self._firsts_written: set[str] = set()
        self._handles = HandleCounts(store, RETENTION)

    async def open(self, ctx: RequestContext, conv: Conversation, outcome: Outcome) -> Ledger:
        """The request's ledger: measured once, here; closed once, by the handler (proxy/accounting/ledger.py).

        Measuring walks every message (digests, counts, the alignment, the inspector's roles): on the pool
        for a heavy request (Conversation.heavy), so that closing the ledger walks none of them."""
        if conv.heavy:
            trace, figures, roles = await offloop.run(self._measure, conv, ctx)
        else:
            trace, figures, roles = self._measure(conv, ctx)
        return Ledger(self, ctx, conv, trace, figures, await self.check(ctx, conv, trace), outcome, roles=roles)

    def _measure(self, conv: Conversation, ctx: RequestContext) -> tuple[PrefixTrace, Figures, str]:
        trace = self.trace(conv, ctx)
        return trace, measure(conv, trace), inspector.roles(conv)

    def trace(self, conv: Conversation, ctx: RequestContext) -> PrefixTrace:
        sent = list(conv.messages)
        for i, m in conv.unmarked.items():  # cache markers are not content
            sent[i] = m
        tools = conv.tools or []
        digests = conv.digests(sent)
        compaction = max((e.version for e in conv.kinds(CompactionInEffect)), default=0)
        system = system_end(conv.wire, conv.client_messages)
        prefix = conv.prefix  # the top-level system prompt, where the API has one: counted with the tools
        return PrefixTrace(raw=conv.digests(conv.client_messages), system=system, sent=digests,
                           counts=conv.counts(sent), tools=message_digest({"tools": tools}) if tools else b"",
                           tool_names=conv.wire.tool_names(tools), tool_tokens=conv.head_tokens(),
                           compaction=compaction, prefix=conv.digest(prefix) if prefix is not None else b"")

    async def branch(self, tenant: str, session: str, model: str | None, raw: list[bytes]) -> str:
        """The branch of a session derived from its opening that a request belongs to (Previous.branch)."""
        return await self._previous.branch(tenant, session, model, raw)

    async def check(self, ctx: RequestContext, conv: Conversation, trace: PrefixTrace) -> PrefixCheck:
        """This request against the earlier one it could reuse a cached prefix of (proxy/accounting/previous.py);
        not measured when the provider holds the history (previous_response_id): the prompt is not all here."""
        if conv.kinds(HistoryElsewhere):
            return UNMEASURED
        return await self._previous.check(ctx.tenant, ctx.session, ctx.model, trace)

    def record(self, ctx: RequestContext, conv: Conversation, trace: PrefixTrace, check: PrefixCheck, outcome: Outcome,
               figures: Figures, rounds: Rounds | None = None, roles: str | None = None
               ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Metrics now; the store in the background. Returns its timeline entry (None: not recorded) and fields
        for the request's log line.

        Only a request the provider accepted becomes the previous request (what the next one's
        cached prefix is measured against).
        """
        previous = self._previous.last(ctx.tenant, ctx.session, ctx.model)
        traces = self._previous.keep(ctx.tenant, ctx.session, ctx.model, trace, opened=not check.previous) \
            if outcome.accepted and check.measured else {}
        try:
            read = read_back(rounds, conv)
            entry = self._entry(ctx, conv, trace, check, outcome, figures, rounds, read)
            inspect = inspector.record(ctx.request_id, conv, trace, figures,
                                       inspector.read_rounds(conv.wire, read.messages, read.usages, conv.model), roles)
            texts = inspector.new_texts(conv, trace, figures, previous, self.log_content, read.messages)
            self._metrics(ctx, entry, outcome, figures)
        except Exception:  # accounting must never be the reason a request fails
            log.exception("accounting failed", extra={"fields": {"request_id": ctx.request_id}})
            return None, {}
        self._queue(ctx, traces, entry, figures, inspect, texts, read.handles)
        if not self.log_content:
            return entry, {}
        known = set(previous.raw) if previous is not None else set()
        return entry, {"client_messages": [{"index": i, "message": m} for i, (d, m)
                                    in enumerate(zip(trace.raw, conv.client_messages)) if d not in known]}

    def cacheable(self, conv: Conversation, trace: PrefixTrace, check: PrefixCheck, accepted: bool, status: int,
                  rounds: Rounds | None) -> int | None:
        """Over every provider call of the turn the provider accepted, as its usage is summed: the first call's
        shared prefix, and each hidden round's (the whole prompt of the call before it). None: not measured."""
        if not check.measured:
            return None
        if not accepted:
            return 0
        if rounds is None or not rounds.done:
            return check.cacheable
        calls = rounds.done if status < 400 else max(0, len(rounds.usages) - 1)  # a failed round: not accepted
        first = len(conv.messages)
        return check.cacheable + hidden_cacheable(trace.prompt, conv.counts(rounds.messages[first:]), rounds.sent,
                                                  first, calls)

    def _entry(self, ctx: RequestContext, conv: Conversation, trace: PrefixTrace, check: PrefixCheck, o: Outcome,
               f: Figures, rounds: Rounds | None, read: ReadBack) -> dict[str, Any]:
        u, ok = o.usage, o.accepted
        engine = ctx.purpose == "engine"  # a gateway's call: what the provider made of the rows is not seen here
        cacheable = None if engine else self.cacheable(conv, trace, check, ok, o.status, rounds)
        return {
            "ts": round(time.time(), 3), "request_id": ctx.request_id, "kind": "engine" if engine else "turn",
            "route": ctx.route.name,
            "model": ctx.model, "status": o.status, "error": o.error, "stream": ctx.stream, "accepted": ok,
            "prompt": u.prompt if u else None, "cached": u.cached if u else None,
            "cache_write": u.cache_write if u else None,
            "completion": u.completion if u else None,
            "cacheable": cacheable, "previous": check.previous,
            "cacheable_billed": _billed(cacheable, u.prompt if u else None, _counted_prompt(conv, trace, rounds)),
            "break": expiry_cause(check, u.cached if u else None) if ok and check.measured else None,
            "output_reserve": f.reserve, **f.compaction_sizes(),
            "offloaded": f.placeholders, "offloaded_new": len(f.offloads_new),
            "client_tokens": f.client_tokens if ok else None, "sent_tokens": f.sent_tokens if ok else None,
            "saved": f.saved if ok else None, "saved_offload": f.saved_offload if ok else None,
            "saved_compress": f.saved_compress if ok else None, "added": f.added if ok else None,
            "compacted": f.compacted, "compactions": len(f.compactions),
            "read_rounds": rounds.done if rounds is not None else 0, "read_handles": len(read.handles),
            "overhead_ms": round(o.overhead_s * 1000, 3), "upstream_ms": round(o.upstream_s * 1000, 3),
            "degraded": f.degraded, "window": ctx.window, "trigger": _trigger(ctx),
        }

    def _metrics(self, ctx: RequestContext, e: dict[str, Any], o: Outcome, f: Figures) -> None:
        """Each figure into its series. A series is created as it always was (it is in /metrics from then on,
        at 0); an amount of 0 is not added to it (a no-op that takes the child's lock)."""
        m, labels = self.metrics, (ctx.route.name, self.metrics.model_label(ctx.model))
        of = m.of
        of(m.requests, *labels, str(o.status)).inc()
        if e["prompt"] is not None:
            _add(of(m.prompt, *labels), e["prompt"])
            _add(of(m.completion, *labels), e["completion"])
        if e["cached"] is not None:
            _add(of(m.cached, *labels), e["cached"])
        _add(of(m.cacheable, *labels), e["cacheable"] or 0)
        if e["offloaded_new"]:
            of(m.offloads, *labels).inc(e["offloaded_new"])
        for layer in f.compactions:
            of(m.compactions, *labels, layer).inc()
        if o.accepted:
            _add(of(m.client_tokens, *labels), f.client_tokens)
            _add(of(m.sent_tokens, *labels), f.sent_tokens)
            for by, amount in (("offload", f.saved_offload), ("compress", f.saved_compress)):
                if amount > 0:  # a counter never goes down; the exact net is client - sent
                    of(m.saved, *labels, by).inc(amount)
        if e["read_rounds"]:
            of(m.read_rounds, *labels).inc(e["read_rounds"])
        if e["break"]:
            of(m.breaks, *labels, e["break"]).inc()
        if e["degraded"]:
            of(m.degraded, *labels).inc()
        of(m.overhead, *labels).observe(o.overhead_s)
        if o.upstream_s:
            of(m.upstream, *labels).observe(o.upstream_s)

    def _queue(self, ctx: RequestContext, traces: dict[str, Any], e: dict[str, Any], f: Figures,
               inspect: dict[str, Any], texts: list[dict[str, Any]], reads: list[str]) -> None:
        """Fold one request into the pending batch: counters add up, the latest trace and meta win."""
        ok = e["accepted"]
        values = {
            "requests": 1, "errors": int(e["status"] >= 400), "prompt": e["prompt"] or 0,
            "cached": e["cached"] or 0, "cache_write": e.get("cache_write") or 0,
            "reported_prompt": (e["prompt"] or 0) if e["cached"] is not None else 0,
            "cacheable": e["cacheable"] or 0,
            "measured_cached": (e["cached"] or 0) if e["cacheable"] is not None else 0,
            "cacheable_billed": e["cacheable_billed"] or 0,
            "completion": e["completion"] or 0,
            "client_tokens": e["client_tokens"] or 0, "sent_tokens": e["sent_tokens"] or 0,
            "saved_offload": e["saved_offload"] or 0, "saved_compress": e["saved_compress"] or 0,
            "breaks": int(bool(e["break"])), "offloads": e["offloaded_new"], "compactions": e["compactions"],
            "read_rounds": e["read_rounds"],
        }
        group = group_of(ctx.tenant, ctx.route.name, ctx.model)
        hour = int(e["ts"] // HOUR)
        b = self._batch
        add_counts(b.amounts, ctx.tenant, ctx.session, group, hour, values)
        if self.shared and traces:
            self._write_traces(traces)
        else:
            b.traces.update(traces)
        self._session_records(ctx.tenant, ctx.session, ctx.route.name, ctx.model, e)
        if ok and f.given:
            b.given.append((ctx.tenant, ctx.session, group, hour, f.given))
        if reads:
            b.reads.append((ctx.tenant, reads))
        self._log(ctx.tenant, ctx.session, e, inspect, texts)

    def answered(self, kind: str, request_id: str, tenant: str, route: str, model: str | None, session: str | None,
                 status: int, error: str | None) -> None:
        """A response no ledger accounts (the proxy's own refusals, count_tokens, pass-through): counted per
        route, model and status, and in the session's timeline when the request names one. Never raises."""
        try:
            self.metrics.requests.labels(route, self.metrics.model_label(model), str(status)).inc()
            now = round(time.time(), 3)
            e = {"ts": now, "request_id": request_id, "kind": kind, "route": route, "model": model,
                 "status": status, "error": error, "accepted": False, "prompt": None, "cached": None,
                 "completion": None, "cacheable": None, "offloaded": 0, "offloaded_new": 0, "compactions": 0}
            add_counts(self._batch.amounts, tenant, session, group_of(tenant, route, model), int(now // HOUR),
                       {"requests": 1, "errors": int(status >= 400)})
            if session is not None:
                self._session_records(tenant, session, route, model, e)
                self._log(tenant, session, e, {"id": request_id, "kind": kind}, [])
            else:
                self._wake()
        except Exception:  # accounting must never be the reason a request fails
            log.exception("accounting failed", extra={"fields": {"request_id": request_id}})

    def own_call(self, ctx: RequestContext, kind: str, usage: Usage, status: int,
                 prompt: list[dict[str, Any]] | None = None) -> None:
        """One of the proxy's own calls, answered now: in the figures of the request that made it, once
        (proxy/accounting/own_calls.py); its prompt in the inspector, the client's content in it only with
        logging.log_content. Never raises."""
        try:
            e = own_call_entry(ctx, kind, usage, status)
            add_counts(self._batch.amounts, ctx.tenant, ctx.session, group_of(ctx.tenant, ctx.route.name, ctx.model),
                       int(e["ts"] // HOUR), own_call_counts(usage), request=False)
            labels = (ctx.route.name, self.metrics.model_label(ctx.model), kind)
            self.metrics.of(self.metrics.own_prompt, *labels).inc(usage.prompt)
            self.metrics.of(self.metrics.own_completion, *labels).inc(usage.completion)
            inspect: dict[str, Any] = {"id": e["request_id"], "kind": kind}
            if prompt is not None:
                inspect["sent"] = [{**m, "text": m["text"][:_OWN_TEXT_CHARS]} if m["own"] or self.log_content
                                     else {**m, "text": None} for m in prompt]
            self._log(ctx.tenant, ctx.session, e, inspect, [])
        except Exception:  # accounting must never be the reason a request fails
            log.exception("accounting failed", extra={"fields": {"request_id": ctx.request_id}})

    def _session_records(self, tenant: str, session: str, route: str, model: str | None, e: dict[str, Any]) -> None:
        b, key = self._batch, session_record_key(tenant, session)
        b.metas[key] = {"session": session, "route": route, "model": model, "last": e["ts"]}
        b.firsts.setdefault(key + ":first", e["ts"])
        if e.get("break"):
            b.breaks[key + ":break"] = e["break"]

    def _log(self, tenant: str, session: str, e: dict[str, Any], inspect: dict[str, Any],
             texts: list[dict[str, Any]]) -> None:
        """The timeline entry and its inspector record (appended together: the same position in both logs)."""
        b = self._batch
        if len(b.logs) < MAX_PENDING:
            b.logs.append((timeline_key(tenant, session), jsonio.dumps(e)))
            b.inspects.append((inspect_key(tenant, session), jsonio.dumps(inspect)))
            b.texts += [(texts_key(tenant, session), jsonio.dumps(t)) for t in texts]
        else:
            b.dropped += 1  # the store cannot keep up: timelines lose entries, counters stay exact
        self._wake()

    def _wake(self) -> None:
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
        if self._trace_writes:
            await asyncio.gather(*self._trace_writes, return_exceptions=True)
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
        """The batch in one store call (Store.write_batch: on SQLite one transaction and one thread hop, where
        a call per record took one each)."""
        await self._count_handles(b)  # before the counters are written: it adds to them
        firsts = {key: ts for key, ts in b.firsts.items() if key not in self._firsts_written}
        await self.store.write_batch(Writes(
            ttl=RETENTION, amounts=dict(b.amounts), records={**b.traces, **b.metas, **b.breaks},
            records_if_absent=firsts,
            logs=[(b.texts, TEXTS_MAX), (b.inspects, INSPECT_MAX), (b.logs, TIMELINE_MAX)]))
        if len(self._firsts_written) + len(firsts) > _FIRSTS_REMEMBERED:
            self._firsts_written.clear()
        self._firsts_written.update(firsts)

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

    def _write_traces(self, traces: dict[str, Any]) -> None:
        """With other workers serving the session, its next request may reach one of them at once: the trace it
        is measured against is written now, not with the batch (FLUSH_DELAY later)."""

        async def write() -> None:
            try:
                await self.store.write_batch(Writes(ttl=RETENTION, records=traces))
            except StoreError:
                pass  # the request's batch, written next, fails alike and is logged once for all its requests

        task = asyncio.get_running_loop().create_task(write())
        self._trace_writes.add(task)
        task.add_done_callback(self._trace_writes.discard)

    async def drain(self) -> None:
        """Write what is pending now and wait for it (shutdown, tests)."""
        if self._flusher is not None and self._gathering:
            self._flusher.cancel()  # only its wait: a write in progress is never interrupted
        while self._flusher is not None and not self._flusher.done():
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.settle()


def _add(child: Any, amount: float) -> None:
    """`child.inc(amount)` unless amount is 0 (a negative one still raises, as inc does)."""
    if amount:
        child.inc(amount)


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


def _counted_prompt(conv: Conversation, trace: PrefixTrace, rounds: Rounds | None) -> int:
    """The prompt tokens of every call of the turn by the proxy's count, as the provider's usage sums them: the
    first call's, and each hidden round's (the first call's prompt and the items the rounds appended before it)."""
    if rounds is None or not rounds.sent:
        return trace.prompt
    first = len(conv.messages)
    added = conv.counts(rounds.messages[first:])
    return trace.prompt + sum(trace.prompt + sum(added[:items - first]) for items in rounds.sent)


def _billed(cacheable: int | None, billed_prompt: int | None, counted_prompt: int) -> int | None:
    """The cacheable prefix in the provider's token units: the proxy's measure scaled by the provider's count of
    the prompt over the proxy's (efficiency compares it with what the provider cached, in those units)."""
    if not cacheable or not billed_prompt or not counted_prompt:
        return cacheable
    return min(billed_prompt, round(cacheable * billed_prompt / counted_prompt))
