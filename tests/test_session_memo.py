"""The per-session memo is an optimisation only: warm, a request is rewritten and accounted exactly as without it.

Every scenario is sent, request by request, to two proxies on their own stores:
one with the memo (its default), one with the memo disabled (every request
computed cold). What reaches the provider must be byte-identical, and so must
the proxy's headers, its prefix-cache trace and its timeline entries.
"""

from __future__ import annotations

import json
import time
import types
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from proxy_server import InProcessProxy, make_settings

import proxy.rewrite.status_bar.transform as status_module
from proxy.request import Conversation
from proxy.tokens.prefix import common_prefix
from proxy.tokens.session_memo import SessionMemo, scalar_leaves
from proxy.wire.chat.codec import CHAT

KEY = "sk-memo-a"
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("bash", "read_file", "todo_write")]
# Timeline fields that depend on wall time or request ids, not on what was computed.
_TIMING = {"ts", "request_id", "overhead_ms", "upstream_ms"}


def call(i: int, name: str, args: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}, **extra}]}


def result(i: int, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


def big(i: int, lines: int = 400) -> str:
    return "\n".join(f"line {j} of output {i}: value {j * 7919 % 1009}" for j in range(lines))


def agent_history(turns: int) -> list[dict[str, Any]]:
    """An agent run: reads, a todo list, failing and repeated commands, a few big outputs."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                  {"role": "user", "content": "Fix the failing test."}]
    for i in range(turns):
        kind = i % 5
        if kind == 0:
            msgs += [call(i, "read_file", {"path": f"f{i}.py"}), result(i, f"print({i})")]
        elif kind == 1:
            msgs += [call(i, "bash", {"cmd": "pytest -x"}), result(i, "Traceback (most recent call last):\nboom")]
        elif kind == 2:
            msgs += [call(i, "todo_write", {"todos": [{"content": "a", "status": "completed"},
                                                      {"content": "b", "status": "pending"}]}), result(i, "ok")]
        elif kind == 3:
            msgs += [call(i, "bash", {"cmd": "cat log"}), result(i, big(i))]
        else:
            msgs += [{"role": "assistant", "content": f"thinking about step {i}"},
                     {"role": "user", "content": [{"type": "text", "text": f"go on {i}"}]}]
    return msgs


def _own_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.startswith("x-ctxproxy-") and k != "x-ctxproxy-request-id"}


class Twin:
    """Two proxies, one warm (memo on) and one cold (memo off), fed the same requests."""

    def __init__(self, upstream: Any, tmp_path: Any, **raw: Any) -> None:
        self.upstream = upstream
        upstream.report_cached = False  # the mock's cache would answer the second twin differently
        self.warm = InProcessProxy(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/warm.db", **raw))
        self.cold = InProcessProxy(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/cold.db", **raw))
        self.clock = [1_800_000_000.0]
        self.sessions: dict[tuple[str, str], int] = {}  # (key, session) -> requests sent
        self.headers: list[dict[str, str]] = []

    def __enter__(self) -> Twin:
        self.warm.start()
        self.cold.start()
        self.cold.state.memo = SessionMemo(max_bytes=0)  # remembers nothing: every request cold
        return self

    def __exit__(self, *exc: object) -> None:
        self.warm.stop()
        self.cold.stop()

    def _send(self, p: InProcessProxy, body: bytes, key: str, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        r = p.post("/v1/chat/completions", content=body, timeout=30,
                       headers={"authorization": f"Bearer {key}", "content-type": "application/json", **headers})
        assert r.status_code == 200, r.text
        sent = self.upstream.requests[-1].body
        return sent, _own_headers(r)

    def send(self, messages: list[dict[str, Any]], key: str = KEY, tools: list[dict[str, Any]] | None = TOOLS,
             model: str = "gpt-4o", headers: dict[str, str] | None = None) -> bytes:
        """One request to both; asserts identical upstream bytes and headers; returns the bytes."""
        body: dict[str, Any] = {"model": model, "messages": messages}
        if tools is not None:
            body["tools"] = tools
        raw = orjson.dumps(body)
        self.clock[0] += 7.0
        warm_sent, warm_headers = self._send(self.warm, raw, key, headers or {})
        cold_sent, cold_headers = self._send(self.cold, raw, key, headers or {})
        assert warm_sent == cold_sent
        assert warm_headers == cold_headers
        session = (key, warm_headers["x-ctxproxy-session"])
        self.sessions[session] = self.sessions.get(session, 0) + 1
        self.headers.append(warm_headers)
        return warm_sent

    def refused(self, body: bytes, key: str = KEY) -> dict[str, Any]:
        """A request both twins must refuse alike; returns the error."""
        answers = []
        for p in (self.warm, self.cold):
            r = p.post("/v1/chat/completions", content=body, timeout=30,
                           headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
            answers.append((r.status_code, r.json(), _own_headers(r)))
        assert answers[0] == answers[1] and answers[0][0] == 400
        session = answers[0][2].get("x-ctxproxy-session")
        if session is not None:  # refused once its session was known: an entry of that session's timeline
            self.sessions[(key, session)] = self.sessions.get((key, session), 0) + 1
        return answers[0][1]["error"]

    def assert_same_accounting(self) -> None:
        """Same prefix-cache traces in process, same timelines in the stores."""
        w, c = self.warm.state.accounting._previous._traces, self.cold.state.accounting._previous._traces
        assert w.keys() == c.keys()
        assert len({k.rsplit(":trace:", 1)[0] for k in w.keys() if ":trace:" in k}) == len(self.sessions)
        for k in w:
            assert w[k] == c[k]
        for (key, session), sent in self.sessions.items():
            timelines = [self._timeline(p, key, session, sent) for p in (self.warm, self.cold)]
            assert timelines[0] == timelines[1]

    @staticmethod
    def _timeline(p: InProcessProxy, key: str, session: str, sent: int) -> list[dict[str, Any]]:
        """The session's timeline once the background accounting has written all `sent` requests."""
        deadline = time.monotonic() + 10
        while True:
            r = p.get(f"/ctx/v1/sessions/{session}", headers={"authorization": f"Bearer {key}"})
            entries = r.json().get("requests") or [] if r.status_code == 200 else []
            if len(entries) >= sent or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert len(entries) == sent, r.text
        return [{k: v for k, v in e.items() if k not in _TIMING} for e in entries]


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The status bar's clock, advanced by the test only, so both twins render the same elapsed time."""
    clock = [1_800_000_000.0]
    fake = types.SimpleNamespace(time=lambda: clock[0], strftime=time.strftime, gmtime=time.gmtime)
    monkeypatch.setattr(status_module, "time", fake)
    yield clock


@pytest.fixture(params=["status-append", "status-replace", "no-status-bar"])
def twin(request: pytest.FixtureRequest, upstream: Any, tmp_path: Any, fixed_clock: list[float]) -> Iterator[Twin]:
    """Status bar settings change what the other transforms see (statuses re-inserted in the history or not)."""
    status = {"status-append": {}, "status-replace": {"mode": "replace"},
              "no-status-bar": {"enabled": False}}[request.param]
    with Twin(upstream, tmp_path, defaults={"offload": {"tool_result_tokens": 1000}, "status_bar": status}) as t:
        t.clock = fixed_clock
        yield t


def test_a_growing_agent_run_is_rewritten_the_same_warm_or_cold(twin: Twin) -> None:
    history = agent_history(24)
    for n in range(3, len(history) + 1, 3):
        twin.send(history[:n])
        twin.send(history[:n])  # a retry of the same turn
        twin.send(history[:n - 1] + [{"role": "user", "content": f"variant {n}"}])  # a new last message
    twin.assert_same_accounting()
    warm = twin.warm.state.memo
    # the run, and each variant of a last message as a branch of its own (a conversation the run does not continue)
    sessions = sorted(session for _, session in warm._snaps)
    assert all(s.startswith(sessions[0] + ".") for s in sessions[1:]) and warm.bytes > 0, sessions


def test_an_edit_in_the_middle_and_a_truncated_history_are_recomputed(twin: Twin) -> None:
    history = agent_history(20)
    for n in (10, 20, 30):
        twin.send(history[:n])
    edited = [dict(m) for m in history]
    edited[12] = {**edited[12], "content": "an edited result"}
    edited[19] = {**edited[19], "content": big(99)}  # a big tool result, offloaded: now under another handle
    for n in (30, 34, 38):
        twin.send(edited[:n])
    twin.send(edited[:16])  # the client dropped the end of its history
    twin.send(edited[:16] + history[16:24])
    twin.assert_same_accounting()


def test_equal_values_of_another_type_are_not_taken_for_the_same_message(twin: Twin) -> None:
    """1 == 1.0 == True in Python, not in JSON: such a change is a changed message, as without the memo."""
    history = agent_history(6)
    history[5] = call(2, "bash", {"cmd": "ls"}, index=0)
    for n in (6, 9):
        twin.send(history[:n])
    for value in (False, 0.0, -0.0, 0):
        changed = [dict(m) for m in history]
        changed[5] = call(2, "bash", {"cmd": "ls"}, index=value)
        twin.send(changed[:6])
        twin.send(changed[:9])
    reordered = [dict(m) for m in history]
    reordered[3] = dict(reversed(list(reordered[3].items())))  # same message, keys in another order
    twin.send(reordered[:6])
    twin.send(reordered[:9])
    twin.assert_same_accounting()


def test_a_bad_new_message_after_known_ones_is_refused_as_without_the_memo(twin: Twin) -> None:
    history = agent_history(6)
    twin.send(history[:8])
    bad = {"model": "gpt-4o", "tools": TOOLS, "messages": history[:8] + [{"role": "robot", "content": "hi"}]}
    assert twin.refused(orjson.dumps(bad))["param"] == "messages[8].role"
    known = b",".join(orjson.dumps(m) for m in history[:8])
    too_deep = (b'{"model":"gpt-4o","messages":[' + known + b',{"role":"user","content":"x","m":'
                + b"[" * 300 + b"]" * 300 + b"}]}")
    assert twin.refused(too_deep)["code"] == "invalid_json"
    twin.send(history[:10])
    twin.assert_same_accounting()


def test_tenants_sharing_a_session_id_never_share_memory(twin: Twin, upstream: Any) -> None:
    history = agent_history(8)
    headers = {"x-session-id": "shared-session"}
    twin.send(history[:10], key="sk-memo-a", headers=headers)
    twin.send(history[:10], key="sk-memo-b", headers=headers)
    twin.send(history[:12], key="sk-memo-b", headers=headers)
    twin.send(history[:14], key="sk-memo-a", headers=headers)
    twin.assert_same_accounting()
    assert len(twin.warm.state.memo) == 2


def test_reordered_tools_and_a_changed_model_are_accounted_the_same(twin: Twin) -> None:
    history = agent_history(10)
    twin.send(history[:10])
    twin.send(history[:12], tools=list(reversed(TOOLS)))
    twin.send(history[:14], tools=list(reversed(TOOLS)), model="gpt-4")  # another tokenizer: counts change
    twin.send(history[:16], tools=TOOLS)
    twin.send(history[:16], tools=None)
    twin.assert_same_accounting()


def test_compaction_is_replayed_the_same_warm_or_cold(upstream: Any, tmp_path: Any, fixed_clock: list[float]) -> None:
    upstream.windows["gpt-4o"] = 60_000  # the proxy is told 6,000: it compacts well before the mock objects
    raw = {"models": {"gpt-4o": {"context_window": 6000}},
           "defaults": {"offload": {"enabled": False},
                        "compress": {"summary": False, "keep_recent_tokens": 1000, "min_clear_tokens": 50}}}
    with Twin(upstream, tmp_path, **raw) as t:
        t.clock = fixed_clock
        history = agent_history(20)
        for n in range(4, len(history) + 1, 2):
            t.send(history[:n])
        t.assert_same_accounting()
        assert any("x-ctxproxy-compaction" in h for h in t.headers)


def test_the_memo_knows_only_strictly_identical_leading_messages() -> None:
    history = agent_history(4)
    memo = SessionMemo()
    first = Conversation.parse(orjson.dumps({"model": "gpt-4o", "messages": history}), CHAT)
    memo.recall("t1", "s", first)
    first.digests(first.client_messages)
    memo.keep("t1", "s", first)

    def known(tenant: str, messages: list[dict[str, Any]]) -> int:
        conv = Conversation.parse(orjson.dumps({"model": "gpt-4o", "messages": messages}), CHAT)
        memo.recall(tenant, "s", conv)
        assert conv.memo is not None
        return conv.memo.known

    assert known("t1", history + [{"role": "user", "content": "more"}]) == len(history)
    assert known("t2", history) == 0  # another tenant, same session id
    assert known("t1", history[:3]) == 3
    assert known("t1", history[:2] + [{"role": "user", "content": "x"}] + history[3:]) == 2
    typed = [dict(m) for m in history]
    typed[2] = {**typed[2], "tool_calls": [{**typed[2]["tool_calls"][0], "index": 0}]}
    memo.keep("t1", "s", _kept(memo, typed))
    retyped = [dict(m) for m in typed]
    retyped[2] = {**typed[2], "tool_calls": [{**typed[2]["tool_calls"][0], "index": False}]}
    assert retyped == typed and known("t1", retyped) == 2
    assert known("t1", typed) == len(typed)


def _kept(memo: SessionMemo, messages: list[dict[str, Any]]) -> Conversation:
    conv = Conversation.parse(orjson.dumps({"model": "gpt-4o", "messages": messages}), CHAT)
    memo.recall("t1", "s", conv)
    conv.digests(conv.client_messages)
    return conv


def test_the_memo_stays_within_its_byte_budget() -> None:
    memo = SessionMemo(max_bytes=50_000)
    for s in range(20):
        conv = Conversation.parse(orjson.dumps({"model": "gpt-4o", "messages": agent_history(4)}), CHAT)
        memo.recall("t", f"s{s}", conv)
        memo.keep("t", f"s{s}", conv)
        assert memo.bytes <= 50_000
    assert 0 < len(memo) < 20


def test_helpers_compare_in_order_and_find_typed_leaves() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    leaves = scalar_leaves({"a": "x", "b": [1, {"c": True, "d": None}], "e": 0.5})
    assert sorted(leaves, key=repr) == sorted([(("b", 0), 1), (("b", 1, "c"), True), (("e",), 0.5)], key=repr)
