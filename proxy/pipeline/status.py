"""Agent status bar: terse key-value state, computed by code, as the last message of an agent request.

Two transforms share the `status_bar` section. `StatusHistory` runs first: it
measures the trajectory on the client's full history and, in `append` mode,
re-inserts every earlier status of the session at exactly its original place
with exactly its original bytes (recorded in the store), so the prefix the
provider cached stays identical. `StatusBar` runs after compression: it
appends the new status, with context use as it will reach the provider.

Modes: `append` keeps each status in the history (~100 tokens a turn, which
compression later folds in; the model sees how its state evolved);
`replace` sends only the latest (nothing accumulates; the cache still hits up
to the end of the previous turn, losing only the previous status itself).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from typing import Any, ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy.compaction import reserve_tokens
from proxy.conversation import Conversation, Event, RequestContext
from proxy.tokens import REPLY_PRIMING_TOKENS, default_counter
from proxy.session_memo import RequestMemo, without
from proxy.trajectory import (DEFAULT_ERROR_PATTERN, STATUS_OPEN, Progress, TodoShape, Trajectory, is_status,
                              looks_like_error)

_SESSIONS_CACHED = 1_000  # sessions whose recorded statuses are kept in process
_ERRORS_CACHED = 20_000  # tool results whose error look is remembered, by digest
_PREV_HEX = 16  # hex chars of the preceding message's digest stored with a status


class Guidance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    at: float = Field(gt=0)  # threshold: a count, or a share of the window for `context`
    text: str  # "" disables the line


class StatusBarSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    agents_only: bool = True  # only requests with tools or tool messages get a status
    role: Literal["user", "system", "developer"] = "user"
    mode: Literal["append", "replace"] = "replace"
    error_pattern: str = DEFAULT_ERROR_PATTERN  # a tool result matching this looks like a failure
    todo: TodoShape = TodoShape()
    repeated_call: Guidance = Guidance(at=3, text="the same call keeps repeating: change approach")
    consecutive_errors: Guidance = Guidance(at=2, text="errors in a row: read the error and diagnose before retrying")
    context: Guidance = Guidance(at=0.8, text="context nearly full: finish the task or save your state")
    # ... instead, where the route compresses: the agent need not hurry, nothing it needs is lost.
    context_compressed: Guidance = Guidance(at=0.8, text="context filling up: the proxy will compact older "
                                            "messages soon; what it removes stays readable by handle, so keep working")

    @field_validator("error_pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        re.compile(v)
        return v


def _is_agent(conv: Conversation) -> bool:
    return bool(conv.body.get("tools")) or any(m.get("role") in ("tool", "function") for m in conv.messages)


def _keys(ctx: RequestContext) -> tuple[str, str]:
    base = f"t:{ctx.tenant}:s:{ctx.session}"
    return base + ":status", base + ":clock"


class StatusHistory:
    name: ClassVar[str] = "status_bar"
    Settings: ClassVar[type[BaseModel]] = StatusBarSettings
    needs_counts: ClassVar[bool] = False  # it reads digests only (proxy/pipeline/__init__.py)

    def __init__(self, settings: StatusBarSettings) -> None:
        self.settings = settings
        self.pattern = re.compile(settings.error_pattern)
        self._recorded: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()
        self._errors: OrderedDict[bytes, bool] = OrderedDict()

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        if self.settings.agents_only and not _is_agent(conv):
            return conv
        progress = self._progress(conv)
        raw = conv.messages if not progress.statuses else without(conv.messages, progress.statuses)
        conv.notes["trajectory"] = progress.trajectory
        prev = conv.digest(raw[-1]).hex()[:_PREV_HEX] if raw else ""
        conv.notes["status_anchor"] = (len(raw), prev)
        if self.settings.mode != "append":
            return conv
        entries = await self._entries(ctx)
        at: dict[int, dict[str, Any]] = {}
        for e in entries:
            at.setdefault(e["k"], e)
        ks, statuses = [], []
        for k in sorted(k for k in at if 1 <= k <= len(raw)):  # no Python step per message
            e = at[k]
            if e["prev"] == conv.digest(raw[k - 1]).hex()[:_PREV_HEX]:
                ks.append(k)
                # one object per recorded status, reused by later requests (its digest and count are memoized)
                statuses.append(e.get("_message") or e.setdefault("_message", {"role": self.settings.role,
                                                                                "content": e["content"]}))
        if ks or raw is not conv.messages:
            conv.set_messages(conv.facts.insert(raw, ks, statuses))
        return conv

    def _progress(self, conv: Conversation) -> Progress:
        """The trajectory of the client's history, resumed after the messages the session's memo knows."""
        is_error, todo = (lambda m: self._is_error(conv, m)), self.settings.todo
        return (conv.memo or RequestMemo(client=conv.client_messages)).fold(
            (self, "trajectory"), conv.messages, Progress,
            lambda p, i, m: p.add_unless_status(i, m, is_error, todo), Progress.copy)

    def _is_error(self, conv: Conversation, message: dict[str, Any]) -> bool:
        """Whether a tool result looks like a failure, decided once per distinct result."""
        key = conv.digest(message)
        hit = self._errors.get(key)
        if hit is None:
            hit = self._errors[key] = looks_like_error(message, self.pattern)
            if len(self._errors) > _ERRORS_CACHED:
                self._errors.popitem(last=False)
        return hit

    async def _entries(self, ctx: RequestContext) -> list[dict[str, Any]]:
        key = (ctx.tenant, ctx.session)
        cached = self._recorded.get(key, [])
        new = await ctx.store.read_log(_keys(ctx)[0], start=len(cached))
        if new:
            cached = cached + [orjson.loads(x) for x in new]
        self._recorded[key] = cached
        self._recorded.move_to_end(key)
        if len(self._recorded) > _SESSIONS_CACHED:
            self._recorded.popitem(last=False)
        return cached


class StatusBar:
    name: ClassVar[str] = "status_bar"
    Settings: ClassVar[type[BaseModel]] = StatusBarSettings

    def __init__(self, settings: StatusBarSettings) -> None:
        self.settings = settings

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        traj: Trajectory | None = conv.notes.get("trajectory")
        if traj is None:
            return conv
        n, prev = conv.notes["status_anchor"]
        if conv.messages and is_status(conv.messages[-1]):
            return conv  # the status recorded for exactly this history (a retry): already in place
        status_key, clock_key = _keys(ctx)
        now = time.time()
        clock = await ctx.store.get_json(clock_key) or {"first": now, "last": now}
        await ctx.store.put_json(clock_key, {"first": clock["first"], "last": now})
        model = conv.body.get("model")
        msgs = conv.messages
        used = sum(conv.counts(msgs)) + REPLY_PRIMING_TOKENS \
            + default_counter.count_tools(conv.body.get("tools"), model)
        compress = ctx.route.section("compress")
        text = self.render(traj, conv, ctx.window, used, now - clock["first"], now - clock["last"], now,
                           compressed=bool(compress is not None and compress.enabled))
        status = {"role": self.settings.role, "content": text}
        if used + default_counter.count_message(status, model) + reserve_tokens(conv.body) > ctx.window:
            conv.events.append(Event("status-skipped", {"reason": "would not fit the window"}))
            return conv  # the status bar must never be the reason a request is rejected
        conv.set_messages([*conv.messages, status])
        conv.events.append(Event("status", {}))
        if self.settings.mode == "append":
            await ctx.store.append_log(status_key, orjson.dumps({"k": n, "prev": prev, "content": text}))
        return conv

    def render(self, t: Trajectory, conv: Conversation, window: int, used: int, since_first: float,
               since_last: float, now: float, compressed: bool = False) -> str:
        """`compressed`: the route compacts history, so the context advice says so instead of "finish"."""
        s = self.settings
        offloads = sum(1 for e in conv.events if e.kind == "offload")
        compactions = max((e.detail.get("version", 0) for e in conv.events if e.kind == "compaction"), default=0)
        per_tool = ", ".join(f"{name}={c}" for name, c in sorted(t.calls.items(), key=lambda kv: (-kv[1], kv[0])))
        share = used / window if window else 0.0
        lines = [f"turn: {t.turns}", f"tool_calls: {sum(t.calls.values())}" + (f" ({per_tool})" if per_tool else "")]
        if t.last_tool:
            lines.append(f"last_tool: {t.last_tool} ({'error' if t.last_error else 'ok'})")
        if t.repeated > 1:
            lines.append(f"repeated_call: {t.last_call} x{t.repeated}")
        lines.append(f"consecutive_errors: {t.consecutive_errors}")
        lines.append(f"elapsed: {_duration(since_first)} total, {_duration(since_last)} since last request")
        lines.append(f"context: {share:.0%} ({used:,}/{window:,} tokens), offloaded {offloads}, compactions {compactions}")
        lines.append("time: " + time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(now)))
        if t.todo_open is not None:
            lines.append(f"todo: {t.todo_open} open, {t.todo_done} done")
        context = s.context_compressed if compressed else s.context
        for value, rule in ((t.repeated, s.repeated_call), (t.consecutive_errors, s.consecutive_errors), (share, context)):
            if rule.text and value >= rule.at:
                lines.append(f"advice: {rule.text}")
        return STATUS_OPEN + "\n" + "\n".join(lines) + "\n</agent_status>"


def _duration(seconds: float) -> str:
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
