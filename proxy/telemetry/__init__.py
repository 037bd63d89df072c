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

from collections.abc import Mapping

from proxy.logs import event
from proxy.telemetry.base import NO_TRACE as NO_TRACE
from proxy.telemetry.base import OFF as OFF
from proxy.telemetry.base import Headers as Headers
from proxy.telemetry.base import RequestTrace as RequestTrace
from proxy.telemetry.base import Tracing as Tracing
from proxy.telemetry.base import UpstreamCall as UpstreamCall

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

