"""Accounting as an observer of the request's flow (proxy/request/flow.py): it never runs inside the send.

Its ledger (proxy/accounting/ledger.py) is opened when the request is sent -
measured while the provider reads it, so that adds nothing to the client's
wait - and replaced when an overflow retry sends another; when the answer is
in, its figures become the response's headers; when the request ends, the
ledger is closed once with how (its timeline entry left on the flow for
tracing, its fields for the log line).
"""

from __future__ import annotations

from proxy.accounting.accountant import Accountant
from proxy.accounting.ledger import Ledger, Outcome
from proxy.request.flow import Flow


class Accounted:
    """One request's accounting (a new one per request: it holds that request's ledger)."""

    def __init__(self, accountant: Accountant) -> None:
        self.accountant = accountant
        self.ledger: Ledger | None = None

    async def sent(self, flow: Flow) -> None:
        assert flow.ctx is not None and flow.conv is not None
        outcome = Outcome(overhead_s=flow.t_sent - flow.t0, own=list(flow.ctx.own_calls.made))
        self.ledger = await self.accountant.open(flow.ctx, flow.conv, outcome)
        flow.known.accounted = True  # closed once, however the request ends

    def answered(self, flow: Flow) -> None:
        ledger = self.ledger
        if ledger is None:
            return
        o = ledger.outcome
        o.upstream_s, o.accepted, ledger.rounds = max(0.0, flow.t_answered - flow.t_sent), flow.accepted, flow.rounds
        flow.headers.update(ledger.headers())
        if flow.rounds is not None and flow.rounds.done:  # the hidden calls' shared prefixes too
            cacheable = ledger.cacheable(flow.status)
            if cacheable is not None:
                flow.headers["x-ctxproxy-cacheable-tokens"] = str(cacheable)

    def ended(self, flow: Flow) -> None:
        ledger = self.ledger
        if ledger is None:
            return
        if flow.usage is not None:
            ledger.outcome.usage = flow.usage
        ledger.rounds = flow.rounds
        flow.log.update(ledger.close(flow.status, flow.error))
        flow.entry, flow.usage = ledger.entry, ledger.outcome.usage  # a failed turn's: its hidden rounds' usage
