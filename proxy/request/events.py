"""What the transforms did to a request, one dataclass per kind.

Headers, log lines, figures and the timeline read these, never a transform's
internals; a transform reads earlier ones only through their typed fields.
`kind` is the name a log line and the inspector show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Offloaded:
    """A placeholder stands for stored content in this request (`new`: this request stored it)."""

    kind: ClassVar[str] = "offload"
    handle: str
    tokens: int
    saved: int
    new: bool


@dataclass(frozen=True)
class CompactionInEffect:
    """A recorded compaction replaces the history's first messages: `kept` of the sent ones are its prefix."""

    kind: ClassVar[str] = "compaction"
    version: int
    kept: int


@dataclass(frozen=True)
class Compacted:
    """This request compacted the history (layer clear | summary | archive), before → after tokens."""

    kind: ClassVar[str] = "compact"
    layer: str
    before: int
    after: int
    # cleared, summarized, fallback, ...; summary_calls: the usage of the calls behind its summary, for the log line
    # only (each call is in the figures once, from when it was answered: proxy/accounting/own_calls.py)
    detail: dict[str, Any] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        """As the figures, headers and timeline record it."""
        return {"layer": self.layer, "before": self.before, "after": self.after, **self.detail}


@dataclass(frozen=True)
class HistoryElsewhere:
    """The provider holds the earlier history (previous_response_id): compression cannot apply."""

    kind: ClassVar[str] = "history-elsewhere"


@dataclass(frozen=True)
class ClientCompacts:
    """The request asks the provider to compact the history (Codex's compaction_trigger): the proxy does not."""

    kind: ClassVar[str] = "client-compaction"


@dataclass(frozen=True)
class StatusAdded:
    kind: ClassVar[str] = "status"


@dataclass(frozen=True)
class StatusSkipped:
    kind: ClassVar[str] = "status-skipped"
    reason: str


@dataclass(frozen=True)
class Degraded:
    """The client's request went upstream unmodified, because `transform` failed (or the store is down); or, the
    store down and the request over its window, rewritten from the in-process fallback (`store-fallback`)."""

    kind: ClassVar[str] = "degraded"
    transform: str
    reason: str

    @property
    def header(self) -> str:
        return self.transform


@dataclass(frozen=True)
class StoreWaited:
    """The request, over its window, waited this long for a store that did not answer (proxy/rewrite/degrade.py):
    time in the proxy, said apart so it is never taken for the provider's."""

    kind: ClassVar[str] = "store-wait"
    ms: float


Event = (Offloaded | CompactionInEffect | Compacted | HistoryElsewhere | ClientCompacts | StatusAdded | StatusSkipped
         | Degraded | StoreWaited)
PLACEHOLDER_EVENTS = (Offloaded, CompactionInEffect, Compacted)  # a placeholder naming a handle is in the request
