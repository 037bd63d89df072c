"""The proxy's own provider calls (summaries), accounted when each one is answered, not when a request uses it.

A summary may be written in the background (proxy/rewrite/compress/precompute.py) and used by a later
request, by no request at all (the session's last request started it, or the span it covers was
superseded), or fail after the provider billed it (an answer rejected as no summary). Accounted with the
request that used its result, the last two kinds were billed but in no figure. Accounted here instead, by
the process that made the call and as its answer arrives, each call counts exactly once whatever becomes of
its result; across replicas too, since one process makes each call (the store's lock per compaction).

A call is one entry of its session's timeline (kind "summary", `started_by` the request that made it,
synchronously or in the background), and its tokens go to the own_* counters of that request's tenant,
route, model and session and to ctxproxy_own_prompt_tokens and ctxproxy_own_completion_tokens (a summary's output
is billed too, at the provider's output price). It is not a client request: the `requests`
counters and the session's request count leave it out.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from proxy.request import RequestContext
from proxy.wire.usage import Usage

Account = Callable[[RequestContext, str, Usage, int, "list[dict[str, Any]] | None"], None]


class RequestOwnCalls:
    """One request's own calls (proxy.request.OwnCalls): each handed to the accountant as it is answered.

    `made` keeps them for the request's own span (proxy/telemetry/attributes.py), which tells how many
    calls its stages made; the figures come from the accountant alone, so nothing is counted twice."""

    def __init__(self, account: Account) -> None:
        self._account = account
        self.made: list[tuple[str, Usage]] = []

    def billed(self, ctx: RequestContext, kind: str, usage: Usage, status: int,
               prompt: list[dict[str, Any]] | None = None) -> None:
        """`prompt`: what the call sent, message by message (proxy/rewrite/compress/summarizer.py prompt_record)."""
        self.made.append((kind, usage))
        self._account(ctx, kind, usage, status, prompt)


def own_call_entry(ctx: RequestContext, kind: str, usage: Usage, status: int) -> dict[str, Any]:
    """The call's timeline entry: its own id (the inspector finds the turn by the turn's id), the request
    that made it, and what the provider billed (prompt, cached, completion, and the own_* a turn had)."""
    return {"ts": round(time.time(), 3), "request_id": "own_" + secrets.token_hex(8), "kind": kind,
            "started_by": ctx.request_id, "route": ctx.route.name, "model": ctx.model, "status": status,
            "error": None if status < 400 else f"http_{status}", "accepted": status < 300,
            "prompt": usage.prompt, "cached": usage.cached, "completion": usage.completion, "cacheable": None,
            "offloaded": 0, "offloaded_new": 0, "compactions": 0, **own_call_counts(usage)}


def own_call_counts(usage: Usage) -> dict[str, int | float]:
    """The counters one call adds to (proxy/accounting/counters.py FIELDS)."""
    return {"own_calls": 1, "own_prompt": usage.prompt, "own_cached": usage.cached or 0,
            "own_completion": usage.completion}


def numbered(timeline: list[dict[str, Any]]) -> list[str]:
    """Each entry's number as people read a session: its client requests 1, 2, 3... in order, and each of the
    proxy's own calls under the request that made it (`3.1`, `3.2`: summaries written for request 3, whether
    logged before it or after). A call whose request is not in the log goes under the request before it."""
    number: dict[str, int] = {}
    n = 0
    for e in timeline:
        if "started_by" not in e:
            n += 1
            number[str(e.get("request_id"))] = n
    out, under, last = [], dict[int, int](), 0
    for e in timeline:
        if "started_by" not in e:
            last = number[str(e.get("request_id"))]
            out.append(str(last))
            continue
        parent = number.get(str(e["started_by"]), last)
        under[parent] = under.get(parent, 0) + 1
        out.append(f"{parent}.{under[parent]}")
    return out
