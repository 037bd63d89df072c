"""What one proxy process holds for its lifetime: settings, the upstream client, the store, pipelines."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.requests import Request

from proxy.accounting.accountant import Accountant
from proxy.accounting.metrics import Metrics
from proxy.config import Settings
from proxy.logs import event
from proxy.rewrite.compress.transform import Compress
from proxy.rewrite.pipeline import Transform, build_pipeline
from proxy.store import Store, StoreError
from proxy.store.fallback import hand_back, in_process_store
from proxy.store.sqlite import SqliteStore
from proxy.telemetry.base import OFF, Tracing
from proxy.tokens.encodings import configure_model_encodings
from proxy.tokens.session_memo import SessionMemo
from proxy.upstream.client import Upstream
from proxy.upstream.windows import LearnedWindows


@dataclass
class ProxyState:
    settings: Settings
    upstream: Upstream
    store: Store
    windows: LearnedWindows
    metrics: Metrics
    accounting: Accountant
    pipelines: dict[str, list[Transform]] = field(default_factory=dict)
    memo: SessionMemo = field(default_factory=SessionMemo)
    tracing: Tracing = OFF  # proxy/telemetry/: every hook checks `tracing.on` first
    # In-process, for the requests the store's outage would otherwise send over their window (degrade.py); what
    # it holds is handed back to the store when the store answers again
    fallback: SqliteStore = field(default_factory=in_process_store)
    _handing: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def create(cls, settings: Settings, upstream: Upstream, store: Store, tracing: Tracing = OFF) -> ProxyState:
        configure_model_encodings({m: f.encoding for m, f in settings.models.items() if f.encoding})
        pipelines = {r.name: build_pipeline(r) for r in settings.routes}
        metrics = Metrics(settings)
        backend = getattr(store, "inner", store)  # under the GuardedStore
        if hasattr(backend, "on_unreplicated"):
            backend.on_unreplicated = metrics.unreplicated.inc
        st = cls(settings=settings, upstream=upstream, store=store, windows=LearnedWindows(store),
                 metrics=metrics, accounting=Accountant(store, metrics, settings.logging.log_content,
                                                      shared=shared_sessions(settings)),
                 pipelines=pipelines, tracing=tracing)
        if hasattr(store, "on_recovered"):  # a guarded store says when it answers again
            store.on_recovered = st.hand_back
        return st

    def hand_back(self) -> None:
        """The store answers again: what this process's fallback stored meanwhile goes to it, in the background."""
        task = asyncio.get_running_loop().create_task(self._hand_back())
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def _hand_back(self) -> None:
        try:
            handed = await hand_back(self.fallback, self.store)
        except StoreError:  # down again: what is left is handed back the next time
            return
        if handed:
            event("handed back to the store what the in-process fallback stored while it was down", handed=handed)

    def summarizing(self) -> float:
        """0 when no background summary of this process is being written, else the longest one may take (s):
        a replay waits them out before it reads its figures, as the provider bills them all the same."""
        running = [t.precomputer for ts in self.pipelines.values() for t in ts
                   if isinstance(t, Compress) and t.precomputer.busy()]
        return max((p.longest_s() for p in running), default=0.0)


def shared_sessions(settings: Settings) -> bool:
    """Whether other processes may serve this proxy's sessions: several workers, or replicas on a shared store.

    Then a session's previous request is read from the store, never from this process's
    cache: behind a load balancer consecutive turns land on different replicas.
    """
    return settings.server.workers > 1 or not settings.store.lower().startswith("sqlite:")


def state_of(request: Request) -> ProxyState:
    state: ProxyState = request.app.state.proxy
    return state
