"""Tracing (OpenTelemetry), off by default and then free: the no-op objects every hook checks first.

Tracing is on when the settings' environment (`Settings.otel_env`, the OTEL_*
variables) names an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OTEL_SDK_DISABLED is not "true",
OTEL_TRACES_EXPORTER (default otlp) includes otlp, the OTLP protocol is
http/protobuf (the default), and the `otel` extra is installed
(`pip install 'ctxproxy[otel]'`). Otherwise `setup` returns `OFF` and nothing of
OpenTelemetry's SDK or exporter is imported: every hook on the request path is
one attribute check (`if tracing.on:` / `if trace.on:`) on these objects.

Each app holds its own `Tracing` (its own TracerProvider, never the global
one), so two apps in one process trace apart, and the app's shutdown flushes it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from proxy.logs import event

if TYPE_CHECKING:
    import httpx

    from proxy.accounting.ledger import Ledger
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

    def opened(self, ledger: Ledger) -> None:
        """The request's accounting, read when the request ends."""

    def end(self, status: int | None, error: str | None) -> None:
        """The request ended (relayed whole, its stream ended, or failed): its span ends, with its figures."""


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

_TRUE = ("true", "1", "yes", "on")
PROTOCOL = "http/protobuf"  # the one OTLP transport the extra carries


def why_off(env: Mapping[str, str]) -> str | None:
    """Why tracing stays off with these OTEL_* variables (the module docstring's switch); None: it is on."""
    if not (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return "no OTLP endpoint"
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return "OTEL_SDK_DISABLED"
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "otlp" not in exporters:
        return f"OTEL_TRACES_EXPORTER={env.get('OTEL_TRACES_EXPORTER')} (only otlp is supported)"
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or PROTOCOL
    if protocol.strip().lower() != PROTOCOL:
        return f"OTLP protocol {protocol} (only {PROTOCOL} is supported)"
    return None


def enabled(env: Mapping[str, str]) -> bool:
    return why_off(env) is None


def setup(env: Mapping[str, str]) -> Tracing:
    """The app's tracing from its OTEL_* variables: `OFF` unless enabled and the extra is installed."""
    reason = why_off(env)
    if reason is not None:
        if reason != "no OTLP endpoint":  # asked for, but not in a way it can be done: say so once, at start
            event("tracing stays off", reason=reason)
        return OFF
    try:
        from proxy.telemetry.otel import OtelTracing
    except ImportError as e:
        event("tracing requested (OTEL_EXPORTER_OTLP_ENDPOINT) but the otel extra is not installed: "
              "pip install 'ctxproxy[otel]'; tracing stays off", missing=str(e))
        return OFF
    return OtelTracing(env)

