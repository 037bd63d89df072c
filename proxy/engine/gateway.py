"""The context engine behind a gateway: Headroom's contract (`POST /v1/compress`, `GET /v1/retrieve/{hash}`).

LiteLLM's `headroom` guardrail (and Portkey's, Tyk's, agentgateway's webhook)
posts `{messages, model}`: the chat rows it lets the engine change (older
user rows and tool results; never system or assistant rows, the last user
row or the newest tool exchange) and takes back exactly as many rows, matched
by position, each replacing the one it sent. Behind it is the proxy's own
engine, as far as a row-by-row engine goes: the route's offload, recorded and
replayed like every turn's (the gateway re-sends the whole history each turn
and gets the same bytes back, so the provider's cache keeps hitting), with the
gateway's retrieval marker (`[Retrieve more: hash=<hex>]`, the handle's hex,
declared in `ccr_hashes`) in place of the proxy's read call; the stored text
is read back by `GET /v1/retrieve/{hash}`. The engine never sees the provider:
its calls are in the session's figures without usage.

Leaving the rows alone is always an answer: any failure inside (a store down,
a transform's bug) answers the input unchanged, said in `x-ctxproxy-degraded`
and the request's log line and metrics, never an error (a gateway's default,
fail_closed, would turn one into a 502 for its user). A route with
`audit: true` answers every call unchanged and records what it would have done.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import parse_qs

import orjson

from proxy.engine.routing import api_key_of, tenant_id
from proxy.engine.run import Answer, Inbound, context, failed, start
from proxy.errors import BadRequest, NotFound, ProxyError, StoreUnavailable
from proxy.request import Conversation, ReadTool, RequestContext
from proxy.request.events import CompactionInEffect, Degraded, Offloaded
from proxy.rewrite.context_read.tool import respond
from proxy.rewrite.pipeline import run_pipeline
from proxy.rewrite.preview import GATEWAY_TOOL
from proxy.state import ProxyState
from proxy.store import StoreError
from proxy.store.archive import HANDLE_PREFIX, Archive, is_handle
from proxy.tokens.counter import default_counter
from proxy.wire.chat.codec import CHAT

JSON = [(b"content-type", b"application/json")]
_GATEWAY_TRANSFORMS = ("offload", "compress")  # row by row: compress clears losslessly only (layers, transform.py)
_MAX_RETRIEVED_LINES = 400  # of a text read back for a query: its matching lines


async def compress(st: ProxyState, inbound: Inbound) -> Answer:
    """`POST /v1/compress`: the rows the gateway sent, each as the route's engine rewrites it."""
    flow = start(st, inbound, CHAT, kind="compress")
    try:
        rows, model = _rows(await inbound.read())
        raw = orjson.dumps({"model": model or "", "messages": rows})
        conv = await Conversation.read(raw, CHAT)
        ctx = dataclasses.replace(await context(st, inbound, conv, flow), stream=False, purpose="engine")
    except ProxyError as err:
        return failed(flow, err)
    before = default_counter.count_messages(conv.client_messages, model)
    audit = ctx.route.audit
    shaped = await _shaped(st, conv, ctx)
    degraded = [e.header for e in shaped.kinds(Degraded)]
    offloads = [e for e in shaped.events if isinstance(e, Offloaded)]
    after = default_counter.count_messages(shaped.messages, model) if shaped.changed else before
    outcome = "audit" if audit else "degraded" if degraded else "rewritten" if shaped.changed else "unchanged"
    flow.headers["x-ctxproxy-engine"] = outcome
    if degraded:
        flow.headers["x-ctxproxy-degraded"] = degraded[0]
    metrics = st.accounting.metrics
    metrics.engine.labels(ctx.route.name, outcome).inc()
    flow.log.update(engine=outcome, tokens_before=before, tokens_after=after)
    if audit:  # what it would have done, said; nothing of it done
        flow.headers.update({"x-ctxproxy-audit-tokens-after": str(after),
                            "x-ctxproxy-audit-offloads": str(len(offloads))})
        metrics.audit_tokens.labels(ctx.route.name, "before").inc(before)
        metrics.audit_tokens.labels(ctx.route.name, "after").inc(after)
        answer = _answer(conv.client_messages, before, before, [], [])
    else:
        # accepted: the gateway takes the rows as answered (the provider's answer to them is not seen here)
        await flow.sent(shaped, ctx)
        flow.answered(200)
        named = (shaped.written_at(i) for i in range(len(shaped.messages)))  # the handles the rows name
        hashes = list(dict.fromkeys(w[1].removeprefix(HANDLE_PREFIX) for w in named if w and w[1]))
        transforms = ["ctxproxy:offload"] * bool(offloads) + ["ctxproxy:clear"] * bool(shaped.kinds(CompactionInEffect))
        answer = _answer(shaped.messages, before, after, transforms, hashes)
    flow.end(200)
    return Answer(200, JSON, flow.headers, answer)


def _rows(raw: bytes) -> tuple[list[Any], str | None]:
    """The rows and the model of a compress request; a 400 for anything else."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("request body is not valid JSON", code="invalid_json") from None
    rows = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise BadRequest("messages: expected a list of message objects", param="messages")
    model = body.get("model")
    return rows, model if isinstance(model, str) else None


async def _shaped(st: ProxyState, conv: Conversation, ctx: RequestContext) -> Conversation:
    """The rows through the route's row-by-row transforms, the gateway's retrieval marker in its placeholders;
    the rows unchanged (and why: Degraded) if anything fails."""
    pipeline = [t for t in st.pipelines[ctx.route.name] if t.name in _GATEWAY_TRANSFORMS]
    conv.read_tool = ReadTool(GATEWAY_TOOL, 0, 0)
    st.memo.recall(ctx.tenant, ctx.session, conv)
    shaped = await run_pipeline(pipeline, conv, ctx)
    await st.memo.remember(ctx.tenant, ctx.session, shaped)
    return shaped


def _answer(rows: list[Any], before: int, after: int, transforms: list[str], hashes: list[str]) -> bytes:
    ratio = round(after / before, 4) if before else 1.0  # Headroom's: after / before, 1.0 when nothing changed
    return orjson.dumps({"messages": rows, "tokens_before": before, "tokens_after": after,
                         "tokens_saved": before - after, "compression_ratio": ratio,
                         "transforms_applied": transforms, "ccr_hashes": hashes})


async def retrieve(st: ProxyState, inbound: Inbound, digest: str) -> Answer:
    """`GET /v1/retrieve/{hash}[?query=]`: the text an engine call stored, whole or its lines matching the query;
    404 for a hash the tenant never stored."""
    flow = start(st, inbound, CHAT, kind="retrieve")
    handle = HANDLE_PREFIX + digest.lower()
    tenant = tenant_id(api_key_of(inbound.header_map()), st.settings.tenant_salt)
    try:
        text = await Archive(st.store, tenant, fallback=st.fallback).get_text(handle) if is_handle(handle) else None
        if text is None:
            raise NotFound(f"hash={digest[:64]} not found or expired", code="not_found")
    except StoreError:
        return failed(flow, StoreUnavailable("the store is unavailable right now; try again later"))
    except ProxyError as err:
        return failed(flow, err)
    query = _query(inbound.query).split()
    if query:  # the lines holding the phrase, else those holding any of its words
        for pattern in (r"\s+".join(map(_escaped, query)), "|".join(map(_escaped, query))):
            found = respond(text, {"pattern": f"(?i){pattern}", "limit": _MAX_RETRIEVED_LINES}, len(text) + 1, handle)
            if not found.startswith(f"[{handle}: 0 lines"):
                break
        text = found
    flow.log["tenant"] = tenant
    flow.end(200)
    return Answer(200, JSON, flow.headers, orjson.dumps({"hash": digest, "original_content": text}))


def _query(query: str) -> str:
    return " ".join(parse_qs(query).get("query", []))[:500]


def _escaped(word: str) -> str:
    return "".join(c if c.isalnum() else "\\" + c for c in word)

