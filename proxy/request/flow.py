"""One client request as the turn engine runs it, and the observers that watch it (mitmproxy's flows and addons).

The engine fills in a `Flow` as it goes and says three moments of it, each once
per request sent upstream: `sent` (the rewritten request is on its way: what it
was, while the provider reads it), `answered` (the answer's status is known,
its hidden rounds done for a whole answer: the last moment to add a response
header) and `ended` (however the request ends, exactly once). Accounting,
tracing and the log line are observers: each reads the flow and what the one
before it added (accounting's timeline entry), and none of them can fail the
request - an observer that raises is logged and the request goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.logs import log
from proxy.request import Conversation, ReadRounds, RequestContext
from proxy.telemetry.base import NO_TRACE, RequestTrace
from proxy.wire.codec import Codec
from proxy.wire.usage import Usage


@dataclass
class Known:
    """What the engine learned of a request, for counting its answer where no ledger does (proxy/http/answers.py)."""

    kind: str = "other"  # turn | count | passthrough | compress | retrieve | other (a path the proxy does not serve)
    route: str | None = None
    model: str | None = None
    tenant: str | None = None
    session: str | None = None
    error: str | None = None  # the proxy's error code, when it refused
    request_id: str | None = None
    accounted: bool = False  # a ledger records this request: not counted here


class Observer(Protocol):
    """Reacts to a request's moments; reads the flow, adds to its headers or log fields, never fails it."""

    async def sent(self, flow: Flow) -> None: ...

    def answered(self, flow: Flow) -> None: ...

    def ended(self, flow: Flow) -> None: ...


@dataclass
class Flow:
    request_id: str
    t0: float
    log: dict[str, object]  # the fields of the request's one log line
    headers: dict[str, str]  # the proxy's own headers on the answer
    known: Known
    wire: Codec  # the client's API: its errors take that shape
    observers: list[Observer] = field(default_factory=list)
    trace: RequestTrace = NO_TRACE  # its spans (proxy/telemetry/), current while the engine runs it
    ctx: RequestContext | None = None
    conv: Conversation | None = field(default=None, repr=False)  # as sent upstream (after a retry: the retried)
    t_sent: float = 0.0  # when the rewritten request went upstream (0: it never did)
    t_answered: float = 0.0  # when the provider's answer (its headers) arrived
    status: int = 0
    error: str | None = None
    accepted: bool = False  # the provider answered with a 2xx: it processed (and cached) the prompt
    usage: Usage | None = None  # every provider call of the turn, summed (hidden rounds included)
    rounds: ReadRounds | None = None  # the hidden read-back rounds, when a transform took over the answer
    entry: dict[str, Any] | None = None  # the timeline entry accounting recorded (tracing reads its figures)
    done: bool = False

    async def sent(self, conv: Conversation, ctx: RequestContext) -> None:
        """The rewritten request is on its way upstream (done while the provider reads it)."""
        self.conv, self.ctx, self.t_sent = conv, ctx, self.t_sent or time.perf_counter()
        for o in self.observers:
            try:
                await o.sent(self)
            except Exception:  # noqa: BLE001 - an observer is never the reason a request fails
                _failed(o, self)

    def answered(self, status: int) -> None:
        """The provider's answer is in (its status; for a whole answer, after the hidden rounds)."""
        self.status, self.accepted = status, status < 300
        self._each("answered")

    def end(self, status: int, error: str | None = None, **log: object) -> None:
        """The request ended: each observer told once (a second end is no-op)."""
        if self.done:
            return
        self.done = True
        self.status, self.error = status, error
        if error is not None:
            self.known.error = error
        self.log.update({k: v for k, v in log.items() if v is not None})
        self._each("ended")

    def _each(self, moment: str) -> None:
        for o in self.observers:
            try:
                getattr(o, moment)(self)
            except Exception:  # noqa: BLE001 - an observer is never the reason a request fails
                _failed(o, self)


def _failed(observer: Observer, flow: Flow) -> None:
    log.exception("observer failed", extra={"fields": {"request_id": flow.request_id,
                                                       "observer": type(observer).__name__}})
