"""Sending the rewritten request upstream, and the one retry a context overflow earns.

When the provider rejects the request as longer than the model's context
(`context_length_exceeded` and its other spellings, proxy/upstream/windows.py),
the window it names is learned for the tenant, route and model, the client's
request is rewritten again for that window, and sent once more.

Every provider call of a request goes through `provider_call`: traced (proxy/telemetry/),
it is a CLIENT span of its kind (the turn, the retry, a hidden read round, count_tokens,
a pass-through) and carries that span's `traceparent`; off, the headers go as they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from proxy.accounting.figures import carry_events
from proxy.config import UpstreamSettings
from proxy.logs import event
from proxy.request import Conversation, RequestContext
from proxy.request.flow import Flow
from proxy.rewrite.context_read.loop import Send
from proxy.rewrite.pipeline import shape
from proxy.state import ProxyState
from proxy.telemetry.base import Headers, RequestTrace
from proxy.upstream.client import read_answer, upstream_url
from proxy.upstream.windows import overflow_limit

R = TypeVar("R")
W = TypeVar("W")


@dataclass
class Sent:
    """What went upstream (after a retry: the retried request) and the provider's first response."""

    conv: Conversation
    ctx: RequestContext
    resp: httpx.Response
    url: str
    send: Send  # for the hidden rounds: more requests to the same place


async def send_upstream(st: ProxyState, conv: Conversation, ctx: RequestContext, flow: Flow) -> Sent:
    """The request sent; while the provider answers, it is remembered for the session's next turn and the flow
    says it was sent (its observers measure it then: `while_answered`)."""
    url = upstream_url(ctx.route.upstream, conv.wire.upstream_path(ctx.model, ctx.stream), ctx.upstream_query)

    async def send(payload: bytes, kind: str = "turn") -> httpx.Response:
        resp = await provider_call(st, flow.trace, kind, "POST", url, ctx.upstream_headers, payload,
                                   ctx.route.upstream, ctx.model)
        flow.t_answered = time.perf_counter()
        return resp

    async def sent(conv: Conversation, ctx: RequestContext, kind: str) -> httpx.Response:
        async def meanwhile() -> None:
            await st.memo.remember(ctx.tenant, ctx.session, conv)
            await flow.sent(conv, ctx)

        payload = await conv.rendered()
        resp, _ = await while_answered(send(payload, kind), meanwhile)
        return resp

    flow.t_sent = time.perf_counter()
    resp = await sent(conv, ctx, "turn")
    if resp.status_code == 400 and ctx.model:
        resp, conv, ctx = await _retry_if_overflow(st, resp, url, conv, ctx, flow, sent)
    return Sent(conv, ctx, resp, url, functools.partial(send, kind="read_round"))


Resend = Callable[[Conversation, RequestContext, str], Awaitable[httpx.Response]]


async def _retry_if_overflow(st: ProxyState, resp: httpx.Response, url: str, conv: Conversation,
                             ctx: RequestContext, flow: Flow, resend: Resend
                             ) -> tuple[httpx.Response, Conversation, RequestContext]:
    """On a context overflow, learn the window it names, rewrite to fit, and try once more."""
    content = await read_answer(resp, url)
    reserve = conv.wire.output_reserve(conv.body)
    limit = overflow_limit(content, conv.window_need(), reserve)
    if limit is None or limit >= ctx.window:
        return httpx.Response(resp.status_code, headers=resp.headers, content=content), conv, ctx
    await st.windows.learn(ctx.tenant, ctx.route.name, ctx.model or "", limit)
    flow.headers["x-ctxproxy-window-learned"] = str(limit)
    event("learned context window from provider", request_id=ctx.request_id, route=ctx.route.name,
          model=ctx.model, window=limit)
    ctx = dataclasses.replace(ctx, window=limit)
    first, conv = conv, await Conversation.read(conv.raw, conv.wire)
    carry_events(first, conv)  # what the first run stored (offloads, compactions) still counts
    st.memo.recall(ctx.tenant, ctx.session, conv)
    conv = await shape(st.pipelines[ctx.route.name], conv, ctx)
    return await resend(conv, ctx, "retry"), conv, ctx


async def provider_call(st: ProxyState, trace: RequestTrace, kind: str, method: str, url: str, headers: Headers,
                        payload: bytes | None, upstream: UpstreamSettings, model: str | None) -> httpx.Response:
    """One provider call of the request; while tracing is on, a CLIENT span of its `kind`."""
    if not trace.on:
        return await st.upstream.send(method, url, headers, payload, upstream)
    call = trace.upstream(kind, method, url, headers, model)
    try:
        resp = await st.upstream.send(method, url, call.headers, payload, upstream)
    except BaseException as exc:
        call.failed(exc)
        raise
    return call.answered(resp)


# Work done while the provider is answering: the proxy's CPU time overlaps the provider's, not adds to it.
# Once a request is on the wire the handler only waits for the answer's headers. What it does next with the
# request as sent (measuring it for the ledger, remembering it for the session's next turn) depends on the
# request alone, so it is done in that wait: for a 150k-token conversation the measure takes milliseconds
# that the provider spends anyway reading the body.
SEND_TURNS = 1  # loop turns given to the send before the work starts: it takes a connection and starts writing


async def while_answered(answer: Coroutine[Any, Any, R], work: Callable[[], Awaitable[W]]) -> tuple[R, W]:
    """`answer` (a request to the provider) and `work` done meanwhile; both results, the answer's errors first.

    When `work` fails the request is cancelled (nothing waits for it any more)."""
    task = asyncio.ensure_future(answer)
    try:
        for _ in range(SEND_TURNS):
            await asyncio.sleep(0)
        done = await work()
    except BaseException:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise
    return await task, done
