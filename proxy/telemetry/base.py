"""The tracing hooks every stage calls, as no-ops: what `proxy.telemetry.setup` returns while tracing is off, and
the base the OpenTelemetry implementation (proxy/telemetry/otel.py) overrides."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from proxy.wire.usage import Usage

Headers = list[tuple[str, str]]


class UpstreamCall:
    """One call to the provider as a span; this base is the no-op."""

    headers: Headers = []  # the request's headers, with the call's own traceparent when tracing

    def answered(self, resp: httpx.Response) -> httpx.Response:
        """The provider's response; the call's span ends when its body has been read or closed."""
        return resp

    def failed(self, exc: BaseException) -> None:
        """The call raised before an answer."""

    def usage(self, usage: Usage | None) -> None:
        """What this one call was billed, when only the caller knows it (a summary call)."""


class RequestTrace:
    """One client request's spans; this base is the no-op every request has while tracing is off."""

    on = False

    def activate(self) -> AbstractContextManager[None]:
        """The request's span as the current one while the handler runs (its children nest under it)."""
        return nullcontext()

    def phase(self, name: str, **attributes: Any) -> AbstractContextManager[None]:
        """A child span (a transform) current while its body runs."""
        return nullcontext()

    def upstream(self, kind: str, method: str, url: str, headers: Headers, model: str | None) -> UpstreamCall:
        """A CLIENT span for one provider call (`kind`: turn, retry, read_round, summary)."""
        return UpstreamCall()

    def within(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """A streamed answer read with the request's span current (its hidden rounds' store reads nest under
        it): the stream is relayed after the handler returned, outside the context `activate` set."""
        return chunks

    # An observer of the request's flow (proxy/request/flow.py; typed Any: that layer is above this one)
    async def sent(self, flow: Any) -> None:
        """The request went upstream."""

    def answered(self, flow: Any) -> None:
        """The provider answered."""

    def ended(self, flow: Any) -> None:
        """The request ended (relayed whole, its stream ended, or failed): its span ends, with its figures."""

    def end(self, status: int | None, error: str | None) -> None:
        """The request ended outside a flow (cancelled, or a proxy bug): its span ends."""


class Tracing:
    """The app's tracer; this base is `OFF`."""

    on = False

    def request(self, method: str, path: str, headers: Sequence[tuple[str, str]], provider: str,
                operation: str = "turn", transport: str = "http") -> RequestTrace:
        """The SERVER span of one client request, a child of the client's `traceparent` if it sent one.
        `operation` (turn, count_tokens, passthrough) and `transport` (http, websocket) become its
        `ctxproxy.operation` and `ctxproxy.transport`: an operator filters the agent's turns from the rest."""
        return NO_TRACE

    def store_call(self, op: str) -> AbstractContextManager[None]:
        """A span for one store call, when it is made inside a traced request."""
        return nullcontext()

    def shutdown(self) -> None:
        """Export what is pending and stop (the app's lifespan ends)."""


NO_TRACE = RequestTrace()
OFF = Tracing()
