"""The trajectory corpus: loading it, and the request body each turn sends."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bench.replay.settings import MODEL


@dataclass
class Trace:
    """One recorded conversation: its messages as the agent sent them, and the tools it offered."""

    id: str  # "01"
    name: str  # file name without .json
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None

    def turns(self, final: bool = False) -> list[int]:
        """Indexes of the assistant messages: one request per index, with messages[:i].

        `final`: when the trajectory ends on a tool or user message, also len(messages),
        the request an agent that kept going would send next (the recorded runs stop
        there: e.g. mini-swe-agent's last tool result is its submission diff).
        """
        out = [i for i, m in enumerate(self.messages) if m.get("role") == "assistant"]
        if final and self.messages and self.messages[-1].get("role") != "assistant":
            out.append(len(self.messages))
        return out

    def view(self, i: int) -> list[dict[str, Any]]:
        """The conversation of turn `i` as chat messages (what the checks compare against): messages[:i]."""
        return self.messages[:i]


def selected(select: Iterable[str] | None) -> set[str] | None:
    """The trace ids `--traces` names ("1,19" -> {"01", "19"}), or None for all."""
    return {s.strip().zfill(2) for s in select} if select else None


def corpus_files(directory: str, select: Iterable[str] | None = None) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(id, name, parsed JSON) of each trace file of `directory` in file order, the selected ones only."""
    wanted = selected(select)
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        name = os.path.basename(path)[:-5]
        tid = name.split("_", 1)[0]
        if wanted is not None and tid not in wanted:
            continue
        with open(path, encoding="utf-8") as f:
            yield tid, name, json.load(f)


def load_traces(directory: str, select: Iterable[str] | None = None) -> list[Trace]:
    """Trajectories in file order; `select` keeps those whose id (file-name prefix) is listed."""
    wanted = selected(select)
    out = [Trace(tid, name, data["messages"], data.get("tools") or None)
           for tid, name, data in corpus_files(directory, select)]
    if wanted is not None and {t.id for t in out} != wanted:
        missing = sorted(wanted - {t.id for t in out})
        raise SystemExit(f"replay: no trajectory {', '.join(missing)} in {directory}")
    return out


def request_body(trace: Trace, i: int) -> dict[str, Any]:
    """The chat completion the agent sent at turn `i`: messages[:i], with the trajectory's tools."""
    body: dict[str, Any] = {"model": MODEL, "messages": trace.messages[:i]}
    if trace.tools:
        body["tools"] = trace.tools
    return body


def encode_body(body: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as httpx >= 0.28 (the OpenAI SDK's transport) sends it."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
