"""One request's accounting: opened once its rewritten body is known, closed once when it ends.

The handler asks the accountant once (`Accountant.open`); what it gets back
measures the request as sent (trace, figures, the prefix check against the
session's previous request, all computed once), gives the response headers,
and is closed exactly once with how the request ended - relayed whole,
streamed, cut, or failed upstream - which records it (timeline, counters,
inspector, metrics) and returns the log line's fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Protocol

from proxy.accounting.figures import Figures
from proxy.accounting.prefix_check import PrefixCheck, PrefixTrace
from proxy.accounting.report import event_headers
from proxy.request import Conversation, ReadRounds, RequestContext
from proxy.wire.usage import Usage


@dataclass
class Outcome:
    """What happened to one chat request, filled in as the response completes."""

    status: int = 0
    usage: Usage | None = None  # every provider call of the turn, summed (hidden read-back rounds included)
    # (kind, usage) of the proxy's own calls made while this request ran, for its span; the figures count
    # them as each was answered (proxy/accounting/own_calls.py), not with the request
    own: list[tuple[str, Usage]] = field(default_factory=list)
    overhead_s: float = 0.0
    upstream_s: float = 0.0
    error: str | None = None
    accepted: bool = False  # the provider answered the request with a 2xx: it was processed (and cached)


class Recorder(Protocol):
    """Where a ledger records its request (proxy/accounting/accountant.py Accountant)."""

    def record(self, ctx: RequestContext, conv: Conversation, trace: PrefixTrace, check: PrefixCheck, outcome: Outcome,
               figures: Figures, rounds: ReadRounds | None = None, roles: str | None = None
               ) -> tuple[dict[str, Any] | None, dict[str, Any]]: ...

    def cacheable(self, conv: Conversation, trace: PrefixTrace, check: PrefixCheck, accepted: bool, status: int,
                  rounds: ReadRounds | None) -> int | None: ...


@dataclass
class Ledger:
    accountant: Recorder
    ctx: RequestContext
    conv: Conversation
    trace: PrefixTrace
    figures: Figures
    check: PrefixCheck
    outcome: Outcome
    rounds: ReadRounds | None = None
    roles: str | None = None  # the inspector's role codes of the client's messages, measured with the rest
    closed: dict[str, Any] | None = field(default=None, repr=False)
    entry: dict[str, Any] | None = field(default=None, repr=False)  # the timeline entry it recorded, once closed

    def headers(self) -> dict[str, str]:
        """What the proxy did to this request, as response headers."""
        return event_headers(self.conv, self.figures, self.check)

    def cacheable(self, status: int) -> int | None:
        """The turn's cacheable tokens once its hidden rounds are done (the timeline's figure)."""
        return self.accountant.cacheable(self.conv, self.trace, self.check, self.outcome.accepted, status,
                                         self.rounds)

    def close(self, status: int, error: str | None = None) -> dict[str, Any]:
        """Record how the request ended (once; a second close returns the first's fields); the log line's fields."""
        if self.closed is not None:
            return self.closed
        o = self.outcome
        o.status, o.error = status, error
        if o.usage is None:  # the turn failed after hidden rounds the provider billed
            o.usage = hidden_usage(self.rounds)
        self.entry, fields = self.accountant.record(self.ctx, self.conv, self.trace, self.check, o, self.figures,
                                                    self.rounds, self.roles)
        if self.rounds is not None:
            fields = {"read_rounds": self.rounds.done, **fields}
        self.closed = fields
        return fields


def hidden_usage(rounds: ReadRounds | None) -> Usage | None:
    """What the hidden rounds alone were billed (for a turn whose last call failed)."""
    return reduce(Usage.__add__, rounds.usages) if rounds is not None and rounds.usages else None
