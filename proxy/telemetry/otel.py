"""The OpenTelemetry side of tracing: imported only when tracing is on (proxy/telemetry/__init__.py).

Spans of one client request (one trace, continuing the client's `traceparent`):
- `ctxproxy POST /v1/responses` (SERVER): the whole request, until the response
  or its stream has ended, with the request's figures (proxy/telemetry/attributes.py);
- `ctxproxy transform <name>` (INTERNAL): each pipeline step;
- `chat <model>` (CLIENT): each provider call - the turn, the retry after a context
  overflow, each hidden read round, each summary call - whose W3C `traceparent`
  is the one sent to the provider, ending when its body has been read;
- `ctxproxy store <op>` (CLIENT): each store call made inside the request.

The provider is this app's own (never the global one), exporting OTLP/HTTP
protobuf through a BatchSpanProcessor configured from the settings' OTEL_*
variables, so the request path only queues ended spans.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.logs import LOGGER_NAME
from proxy.redact import redact
from proxy.telemetry.attributes import minus, request_attributes, usage_attributes
from proxy.telemetry.base import Headers, RequestTrace, Tracing, UpstreamCall

if TYPE_CHECKING:
    from proxy.request.flow import Flow
    from proxy.wire.usage import Usage

SCOPE = "ctxproxy"
_W3C = TraceContextTextMapPropagator()
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_DEFAULT_ENDPOINT_PATH = "/v1/traces"
_NOT_CHAT = frozenset({"count_tokens", "passthrough"})  # provider calls that are no model turn: named for what they are
# Where OpenTelemetry judges a client's traceparent and tracestate (too long, a malformed member): it sets one it
# cannot use aside, as W3C Trace Context has a receiver do (no traceparent: the request starts its own trace),
# and warns, once per request, with the header's text. A client could have such lines written at will: not logged.
_CLIENT_HEADER_LOGGERS = ("opentelemetry.trace.propagation.tracecontext", "opentelemetry.trace.span")


def _endpoint(env: Mapping[str, str]) -> str:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces (the spec's rule)."""
    signal = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if signal:
        return signal
    return env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + _DEFAULT_ENDPOINT_PATH


def _pairs(text: str) -> dict[str, str]:
    """`k=v,k2=v2` (OTEL_EXPORTER_OTLP_HEADERS, OTEL_RESOURCE_ATTRIBUTES)."""
    out = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out


def _number(env: Mapping[str, str], name: str) -> float | None:
    try:
        return float(env[name]) if name in env else None
    except ValueError:
        return None


def _own_logs() -> None:
    """OpenTelemetry's own lines (an export that failed) written as ctxproxy's JSON lines, by its handler, once
    setup_logging has set one; not as logging's plain-text last resort on stderr. Its warnings about a client's
    trace headers not at all (_CLIENT_HEADER_LOGGERS)."""
    for name in _CLIENT_HEADER_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    ours = logging.getLogger(LOGGER_NAME)
    if ours.handlers and not ours.propagate:  # as setup_logging leaves it (a test's handler would propagate)
        library = logging.getLogger("opentelemetry")
        library.handlers[:] = ours.handlers
        library.propagate = False


def provider_from(env: Mapping[str, str]) -> TracerProvider:
    """A TracerProvider exporting OTLP/HTTP protobuf, configured from `env` alone (not the process's)."""
    attributes: dict[str, Any] = _pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    attributes["service.name"] = env.get("OTEL_SERVICE_NAME") or attributes.get("service.name") or "ctxproxy"
    headers = _pairs(env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS") or "")
    timeout = _number(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or _number(env, "OTEL_EXPORTER_OTLP_TIMEOUT")
    exporter = OTLPSpanExporter(endpoint=_endpoint(env), headers=headers or None,
                                timeout=timeout / 1000 if timeout else None)
    delay, size = _number(env, "OTEL_BSP_SCHEDULE_DELAY"), _number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=delay,
                                                   max_export_batch_size=int(size) if size else None))
    return provider


def _exception_text(exc: BaseException) -> dict[str, str]:
    """The message and stack trace record_exception would export, secrets masked (they override its own): a span
    leaves the process like a log line does."""
    trace_text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"exception.message": redact(str(exc)), "exception.stacktrace": redact(trace_text)}


class OtelTracing(Tracing):
    on = True

    def __init__(self, env: Mapping[str, str]) -> None:
        _own_logs()
        self.provider = provider_from(env)
        self.tracer = self.provider.get_tracer(SCOPE)

    def request(self, method: str, path: str, headers: Sequence[tuple[str, str]], provider: str,
                operation: str = "turn", transport: str = "http") -> RequestTrace:
        carrier = {k.lower(): v for k, v in headers if k.lower() in _TRACE_HEADERS}
        parent = _W3C.extract(carrier) if carrier else None
        attributes = {"http.request.method": method, "url.path": path, "gen_ai.provider.name": provider,
                      "gen_ai.system": provider, "ctxproxy.operation": operation, "ctxproxy.transport": transport}
        if operation != "passthrough":  # a pass-through request may be anything: models, files, embeddings
            attributes["gen_ai.operation.name"] = "chat"
        span = self.tracer.start_span(f"ctxproxy {method} {path}", context=parent, kind=SpanKind.SERVER,
                                      attributes=attributes)
        return OtelRequestTrace(self.tracer, span, provider)

    @contextmanager
    def store_call(self, op: str) -> Iterator[None]:
        current = trace.get_current_span()
        if not current.is_recording():  # not inside a traced request (background writes): no span
            yield
            return
        with self.tracer.start_as_current_span(f"ctxproxy store {op}", kind=SpanKind.CLIENT,
                                               attributes={"db.operation.name": op}):
            yield

    def shutdown(self) -> None:
        self.provider.force_flush()
        self.provider.shutdown()


class _Call(UpstreamCall):
    """A provider call's span: ended when the request ends, at the time its body was read or closed."""

    def __init__(self, span: Span, kind: str, headers: Headers) -> None:
        self.span, self.kind, self.headers = span, kind, headers
        self.ended_at: int | None = None

    def answered(self, resp: httpx.Response) -> httpx.Response:
        self.span.set_attribute("http.response.status_code", resp.status_code)
        if resp.status_code >= 400:
            self.span.set_status(Status(StatusCode.ERROR))
            self.span.set_attribute("error.type", str(resp.status_code))
        resp.stream = _Timed(resp.stream, self)
        return resp

    def failed(self, exc: BaseException) -> None:
        self.span.set_status(Status(StatusCode.ERROR))
        self.span.set_attribute("error.type", type(exc).__name__)
        self.ended_at = time.time_ns()

    def usage(self, usage: Usage | None) -> None:
        self.span.set_attributes(usage_attributes(usage))

    def end(self) -> None:
        self.span.end(end_time=self.ended_at)


class _Timed(httpx.AsyncByteStream):
    """The response body as it was; notes when it was closed (read whole, or given up), for its call's span."""

    def __init__(self, inner: Any, call: _Call) -> None:
        self.inner, self.call = inner, call

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        if self.call.ended_at is None:
            self.call.ended_at = time.time_ns()
        await self.inner.aclose()


class OtelRequestTrace(RequestTrace):
    on = True

    def __init__(self, tracer: trace.Tracer, span: Span, provider: str) -> None:
        self.tracer, self.span, self.provider = tracer, span, provider
        self.context = trace.set_span_in_context(span)
        self.calls: list[_Call] = []
        self.done = False

    @contextmanager
    def activate(self) -> Iterator[None]:
        token = otel_context.attach(self.context)
        try:
            yield
        except asyncio.CancelledError:  # the client went away before an answer: the span still ends
            self.end(None, "cancelled")
            raise
        except BaseException as exc:  # not a ProxyError (those end the request normally): a proxy bug
            self.span.record_exception(exc, attributes=_exception_text(exc))
            self.end(500, "internal_error")
            raise
        finally:
            otel_context.detach(token)

    @contextmanager
    def phase(self, name: str, **attributes: Any) -> Iterator[None]:
        with self.tracer.start_as_current_span(f"ctxproxy {name}", attributes=attributes):
            yield

    def upstream(self, kind: str, method: str, url: str, headers: Headers, model: str | None) -> UpstreamCall:
        parent = otel_context.get_current()
        if not trace.get_current_span(parent).is_recording():  # a streamed answer's hidden round: not current
            parent = self.context
        where = httpx.URL(url)
        attributes: dict[str, Any] = {"gen_ai.provider.name": self.provider,
                                      "gen_ai.system": self.provider, "ctxproxy.upstream.kind": kind,
                                      "http.request.method": method, "server.address": where.host,
                                      "url.full": str(where.copy_with(query=None))}
        chat = kind not in _NOT_CHAT
        if chat:
            attributes["gen_ai.operation.name"] = "chat"
        if where.port:
            attributes["server.port"] = where.port
        if model:
            attributes["gen_ai.request.model"] = model
        name = ("chat" if chat else kind if kind != "passthrough" else method) + (f" {model}" if model else "")
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.CLIENT, attributes=attributes)
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(span))
        sent = [(k, v) for k, v in headers if k.lower() not in _TRACE_HEADERS] + list(carrier.items())
        call = _Call(span, kind, sent)
        self.calls.append(call)
        return call

    async def within(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        # attached and detached around each step, never across a yield: the same context each time
        it = aiter(chunks)
        try:
            while True:
                token = otel_context.attach(self.context)
                try:
                    chunk = await anext(it)
                except StopAsyncIteration:
                    return
                finally:
                    otel_context.detach(token)
                yield chunk
        finally:
            close = getattr(it, "aclose", None)
            if close is not None:
                await close()

    def ended(self, flow: Flow) -> None:
        self.end(flow.status, flow.error, flow)

    def end(self, status: int | None, error: str | None, flow: Flow | None = None) -> None:
        if self.done:
            return
        self.done = True
        if flow is not None:
            self.span.set_attributes(request_attributes(flow))
            self._call_usages(flow)
        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
        if error or (status or 0) >= 500:
            self.span.set_status(Status(StatusCode.ERROR))
            self.span.set_attribute("error.type", error or str(status))
        for call in self.calls:
            call.end()
        self.span.end()

    def _call_usages(self, flow: Flow) -> None:
        """Each turn call's own usage: the hidden rounds' as reported, the last one's the total less theirs."""
        turn = [c for c in self.calls if c.kind in ("turn", "retry", "read_round")]
        turn = turn[max((i for i, c in enumerate(turn) if c.kind != "read_round"), default=0):]
        total, rounds = flow.usage, flow.rounds
        hidden = list(rounds.usages) if rounds is not None else []
        if total is None or not turn or len(hidden) != len(turn) - 1:
            return
        for call, usage in zip(turn, [*hidden, minus(total, hidden)]):
            call.usage(usage)
