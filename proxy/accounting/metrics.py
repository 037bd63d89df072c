"""Prometheus metrics, per instance (Prometheus adds replicas up). Labelled by route and model, never session.

An instance of several worker processes (`serve --workers N`, proxy/cli/workers.py) is one scrape
target behind one port, so whichever worker answers the scrape adds up every worker's figures:
prometheus_client's multiprocess mode, each worker's values in files of the directory
`PROMETHEUS_MULTIPROC_DIR` names (set by the parent before any worker starts).

The `model` label is the client's own string, so it is bounded (ModelLabels):
a client sending thousands of made-up model names must not grow the scrape
(each name is a series in every metric) or the time to render it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from fnmatch import fnmatchcase
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from proxy.config import Settings
from proxy.upstream.windows import BUILTIN_WINDOWS

SHARED_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus_client when it is imported, and here
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


# Distinct names matching a known glob (gpt-4o*, a route's match) kept as themselves; past that, the glob.
MAX_MATCHED_MODELS = 200
# Distinct names the proxy knows nothing about kept as themselves; past that, OTHER.
MAX_OTHER_MODELS = 50
MAX_LABEL_CHARS = 128  # a longer model name is never a label of its own
OTHER = "other"


class ModelLabels:
    """The `model` label for a request's model: bounded, stable for the life of the process.

    Known models keep their name: those configured under `models:`. Names that
    match a known glob (the built-in window table, a route's `match.model`)
    keep theirs too, for the first MAX_MATCHED_MODELS of them, then fold into
    the glob they match. Any other name is its own label for the first
    MAX_OTHER_MODELS distinct ones seen, then `other`. A name once given a
    label keeps it. At most len(models) + MAX_MATCHED_MODELS + globs +
    MAX_OTHER_MODELS + 1 values, whatever clients send.
    """

    def __init__(self, models: Iterable[str] = (), globs: Iterable[str] = ()) -> None:
        self._own = {m for m in models if _labelable(m)}  # names that are their own label
        self._globs = tuple(dict.fromkeys(globs))
        self._matched = 0
        self._others = 0

    @classmethod
    def for_settings(cls, settings: Settings | None) -> ModelLabels:
        if settings is None:
            return cls(globs=[g for g, _ in BUILTIN_WINDOWS])
        routes = [r.match.model for r in settings.routes if r.match.model]
        return cls(settings.models, [*routes, *(g for g, _ in BUILTIN_WINDOWS)])

    def __call__(self, model: str | None) -> str:
        if not model:
            return ""
        if model in self._own:
            return model
        if not _labelable(model):
            return OTHER
        bare = model.rsplit("/", 1)[-1]  # "openai/gpt-4o" matches as the window table does
        glob = next((g for g in self._globs if fnmatchcase(model, g) or fnmatchcase(bare, g)), None)
        if glob is not None:
            if self._matched >= MAX_MATCHED_MODELS:
                return glob
            self._matched += 1
        elif self._others >= MAX_OTHER_MODELS:
            return OTHER
        else:
            self._others += 1
        self._own.add(model)  # only names given their own label are remembered: memory stays bounded
        return model


def _labelable(model: str) -> bool:
    return len(model) <= MAX_LABEL_CHARS and model.isprintable()


class Metrics:
    def __init__(self, settings: Settings | None = None) -> None:
        self.model_label = ModelLabels.for_settings(settings)
        self.of: Callable[..., Any] = functools.lru_cache(maxsize=None)(self._labelled)
        r = self.registry = CollectorRegistry()
        rm = ("route", "model")
        self.requests = Counter("ctxproxy_requests", "Answers to clients by status (turns, count_tokens, "
                                "pass-through, the proxy's own refusals)", (*rm, "status"), registry=r)
        self.prompt = Counter("ctxproxy_prompt_tokens", "Prompt tokens billed by the provider", rm, registry=r)
        self.cached = Counter("ctxproxy_cached_tokens", "Prompt tokens the provider served from cache", rm, registry=r)
        self.cacheable = Counter("ctxproxy_cacheable_tokens", "Prompt tokens repeating the session's previous "
                                 "request byte for byte", rm, registry=r)
        self.completion = Counter("ctxproxy_completion_tokens", "Completion tokens", rm, registry=r)
        self.own_prompt = Counter("ctxproxy_own_prompt_tokens", "Prompt tokens of the proxy's own calls",
                                  (*rm, "kind"), registry=r)
        self.own_completion = Counter("ctxproxy_own_completion_tokens", "Completion tokens of the proxy's own calls",
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
        self.engine = Counter("ctxproxy_engine_calls", "Context engine calls from a gateway (/v1/compress) by outcome: "
                              "rewritten, unchanged, audit (answered unchanged), degraded (unchanged: a failure "
                              "inside)", ("route", "outcome"), registry=r)
        self.audit_tokens = Counter("ctxproxy_engine_audit_tokens", "Audited engine calls' prompt tokens: as sent "
                                    "(before) and as the engine would have sent them (after)", ("route", "stage"),
                                    registry=r)
        self.degraded = Counter("ctxproxy_degraded_requests", "Requests forwarded unmodified: store down", rm,
                                registry=r)
        self.unreplicated = Counter("ctxproxy_store_unreplicated_writes", "Store writes the primary acknowledged "
                                    "but no replica within wait_ms (Redis Cluster, Sentinel): a failover may lose them",
                                    registry=r)
        self.overhead = Histogram("ctxproxy_overhead_seconds", "Time in the proxy before the request left", rm,
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream = Histogram("ctxproxy_upstream_seconds", "Provider time to response headers", rm,
                                  buckets=_LATENCY_BUCKETS, registry=r)

    def _labelled(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once per series (`of`): prometheus_client validates and locks on
        every `labels` call, and a request makes a dozen. The labels are bounded (routes, ModelLabels), so is
        the cache; its lookup is functools' (in C: a third of a Python dict-of-tuples lookup's cost)."""
        return metric.labels(*labels)

    def render(self) -> bytes:
        """The exposition text; thread-safe (the /metrics handler renders off the event loop)."""
        shared = os.environ.get(SHARED_DIR_ENV)
        if shared:
            every_worker = CollectorRegistry()
            MultiProcessCollector(every_worker, path=shared)  # type: ignore[no-untyped-call]
            return generate_latest(every_worker)
        return generate_latest(self.registry)
