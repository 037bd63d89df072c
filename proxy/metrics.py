"""Prometheus metrics, per process (Prometheus adds replicas up). Labelled by route and model, never session."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        rm = ("route", "model")
        self.requests = Counter("ctxproxy_requests", "Chat requests by outcome", (*rm, "status"), registry=r)
        self.prompt = Counter("ctxproxy_prompt_tokens", "Prompt tokens billed by the provider", rm, registry=r)
        self.cached = Counter("ctxproxy_cached_tokens", "Prompt tokens the provider served from cache", rm, registry=r)
        self.cacheable = Counter("ctxproxy_cacheable_tokens", "Prompt tokens repeating the session's previous "
                                 "request byte for byte", rm, registry=r)
        self.completion = Counter("ctxproxy_completion_tokens", "Completion tokens", rm, registry=r)
        self.own_prompt = Counter("ctxproxy_own_prompt_tokens", "Prompt tokens of the proxy's own calls",
                                  (*rm, "kind"), registry=r)
        self.offloads = Counter("ctxproxy_offloads", "Messages offloaded (first time)", rm, registry=r)
        self.compactions = Counter("ctxproxy_compactions", "Compactions by layer", (*rm, "layer"), registry=r)
        self.saved = Counter("ctxproxy_tokens_saved", "Prompt tokens removed by the proxy", (*rm, "by"), registry=r)
        self.client_tokens = Counter("ctxproxy_client_prompt_tokens", "Prompt tokens as the client sent them "
                                     "(proxy's count; requests the provider accepted)", rm, registry=r)
        self.sent_tokens = Counter("ctxproxy_sent_prompt_tokens", "Prompt tokens as sent upstream (proxy's count; "
                                   "requests the provider accepted): saved = client - sent", rm, registry=r)
        self.read_rounds = Counter("ctxproxy_read_rounds", "Hidden context_read rounds the proxy answered", rm,
                                   registry=r)
        self.handles_given = Counter("ctxproxy_handles_given", "Offload and cleared handles first put in a prompt",
                                     rm, registry=r)
        self.handles_read = Counter("ctxproxy_handles_read", "Of those, handles the model read back (first read)",
                                    rm, registry=r)
        self.breaks = Counter("ctxproxy_cache_breaks", "Cached prefixes broken, by cause", (*rm, "cause"), registry=r)
        self.degraded = Counter("ctxproxy_degraded_requests", "Requests forwarded unmodified: store down", rm,
                                registry=r)
        self.overhead = Histogram("ctxproxy_overhead_seconds", "Time in the proxy before the request left", rm,
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream = Histogram("ctxproxy_upstream_seconds", "Provider time to response headers", rm,
                                  buckets=_LATENCY_BUCKETS, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
