"""Property-based fuzzing of what clients can send: whatever arrives, the answer is an OpenAI-shaped 4xx or a
clean pass-through of what the provider said, never a 500, and the proxy keeps serving.

One mock provider and one proxy for the whole module (hypothesis runs many examples);
offload and compression are tuned to engage on small inputs, so random shapes reach
the pipeline and not only the validator. Exceptions the proxy logs are captured so a
failing example reports the proxy's own traceback.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mock_upstream import MockUpstream
from proxy_server import ProxyServer, make_settings

AUTH = {"authorization": "Bearer sk-fuzz"}
VALID_ROLES = ["system", "developer", "user", "assistant", "tool", "function"]
# derandomize: the same examples on every run, so CI is reproducible (a failure reruns as it was).
FUZZ = settings(deadline=None, max_examples=100, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


# --------------------------------------------------------------------------- known bugs

# Proxy 500s already pinned by a strict-xfail test below, recognised by the proxy's logged traceback so the
# fuzzers stay green and keep hunting for *new* failures. When a bug is fixed its xfail test XPASSes (strict:
# the run fails): delete the marker there and the entry here.
KNOWN_BUGS: dict[str, tuple[str, ...]] = {}


def known_bug(log_text: str) -> str | None:
    for name, needles in KNOWN_BUGS.items():
        if all(n in log_text for n in needles):
            return name
    return None


# --------------------------------------------------------------------------- one proxy for the module

class Captured(logging.Filter):
    """Takes the error records of the proxy's and uvicorn's loggers away from every handler (pytest's included)
    and keeps them unformatted; `since()` formats them later, in the test thread.

    Why not let them be logged: Python 3.11 formats a traceback with ast.parse, whose recursion counter is
    process-global; a server thread formatting one while pytest formats an xfail's crashes pytest with
    "SystemError: AST constructor recursion depth mismatch".
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        with self._lock:
            self.records.append(record)
        return False

    @contextmanager
    def diverting(self, *names: str) -> Iterator[Captured]:
        loggers = [logging.getLogger(n) for n in names]
        for lg in loggers:
            lg.addFilter(self)
        try:
            yield self
        finally:
            for lg in loggers:
                lg.removeFilter(self)

    def wait_for(self, message: str, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if any(r.getMessage().startswith(message) for r in self.records[n:]):
                    return True
            time.sleep(0.01)
        return False

    def settle(self, quiet: float = 0.05, timeout: float = 1.0) -> None:
        """Until no record has arrived for `quiet` seconds (late records of an earlier test's 500)."""
        deadline = time.monotonic() + timeout
        seen = len(self.records)
        while time.monotonic() < deadline:
            time.sleep(quiet)
            if len(self.records) == seen:
                return
            seen = len(self.records)

    def since(self, n: int) -> str:
        with self._lock:
            recs = self.records[n:]
        fmt = logging.Formatter()
        return "\n".join(fmt.format(r) for r in recs)


class Fuzzed:
    def __init__(self, proxy: ProxyServer, mock: MockUpstream, client: httpx.Client, logs: Captured) -> None:
        self.proxy, self.mock, self.client, self.logs = proxy, mock, client, logs
        self.passed_through: dict[int, int] = {}
        self.mock_errors = 0
        self.known_hits: dict[str, int] = {}

    @property
    def url(self) -> str:
        return self.proxy.url

    def post(self, content: bytes, headers: dict[str, Any] | None = None, path: str = "/v1/chat/completions"
             ) -> httpx.Response | None:
        """Send, then assert the property; None when a known bug broke the response (counted in known_hits)."""
        n_logs, n_mock = len(self.logs.records), len(self.mock.requests)
        try:
            r = self.client.post(path, content=content, headers={**AUTH, "content-type": "application/json",
                                                                 **(headers or {})})
        except httpx.TransportError as e:  # e.g. a stream cut by an exception after its headers went out
            self.known_or_fail(n_logs, f"the proxy broke the connection: {e!r}")
            return None
        return r if self.check(r, n_mock, n_logs) else None

    def known_or_fail(self, n_logs: int, what: str) -> None:
        # uvicorn logs an unhandled exception only after the 500 went out: wait for it, or it lands in the
        # next example's window and looks like an error there.
        self.logs.wait_for("Exception in ASGI application", n_logs, timeout=2.0)
        text = self.logs.since(n_logs)
        bug = known_bug(text)
        assert bug, f"{what}\nproxy log:\n{text}"
        self.known_hits[bug] = self.known_hits.get(bug, 0) + 1
        # After an unhandled exception uvicorn drops the connection; do not let the next example trip on it.
        self.client.close()
        self.client = httpx.Client(base_url=self.proxy.url, timeout=20)

    def check(self, r: httpx.Response, n_mock: int, n_logs: int) -> bool:
        """The property every fuzzed request must satisfy; False if the response was a known bug's 500."""
        forwarded = len(self.mock.requests) > n_mock
        where = f"status {r.status_code}, body {r.content[:300]!r}\nproxy log:\n{self.logs.since(n_logs)}"
        if forwarded and r.status_code == self.mock.requests[-1].status:
            self.passed_through[r.status_code] = self.passed_through.get(r.status_code, 0) + 1
            if r.status_code >= 500:  # the mock itself choked on a shape; relayed unchanged, which is right
                self.mock_errors += 1
                assert b"mock upstream error" in r.content, where
            assert self.logs.since(n_logs) == "", "passed through, but the proxy logged an error: " + where
            return True
        if r.status_code == 500 and known_bug(self.logs.since(n_logs)):
            self.known_or_fail(n_logs, where)
            return False
        assert 400 <= r.status_code < 500, "the proxy answered this itself and it is not a 4xx: " + where
        assert r.headers["content-type"].startswith("application/json"), where
        err = r.json()["error"]
        assert isinstance(err, dict) and isinstance(err["message"], str) and err["message"], where
        assert isinstance(err["type"], str) and "code" in err and "param" in err, where
        assert self.logs.since(n_logs) == "", "a 4xx, but the proxy logged an error: " + where
        return True

    def still_serving(self) -> None:
        assert self.client.get("/healthz").status_code == 200
        r = self.client.post("/v1/chat/completions",
                             json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, headers=AUTH)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"


@pytest.fixture(scope="module")
def fz(tmp_path_factory) -> Iterator[Fuzzed]:
    db = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    with MockUpstream() as mock:
        cfg = make_settings(mock.base_url, f"sqlite:///{db}", default_context_window=16_000,
                            defaults={"offload": {"tool_result_tokens": 300, "user_message_tokens": 2000},
                                      "compress": {"keep_recent_tokens": 1000, "summary_timeout": 5}})
        with ProxyServer(cfg) as p, Captured().diverting("ctxproxy", "uvicorn.error") as logs:
            fz = Fuzzed(p, mock, p.http_client(timeout=20), logs)
            yield fz
            fz.client.close()
            print(f"\nfuzz: provider statuses passed through {fz.passed_through}, mock crashes {fz.mock_errors}, "
                  f"known-bug hits {fz.known_hits}")


@pytest.fixture
def fuzzed(fz: Fuzzed) -> Fuzzed:
    fz.logs.settle()
    fz.mock.reset()
    return fz


# --------------------------------------------------------------------------- strategies

SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-(2 ** 70), 2 ** 70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
JSON_VALUES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=25)


def huge_text() -> st.SearchStrategy[str]:
    units = st.sampled_from(["x", "2026-11-29 worker[7] processed item 42 ok\n", "é😀 ", "\u2028\t",
                             '{"a": [1, 2]}\n', "Traceback (most recent call last):\n"])
    return st.tuples(units, st.integers(1_000, 200_000)).map(lambda t: (t[0] * (t[1] // len(t[0]) + 1))[:t[1]])


TEXT = st.one_of(st.text(max_size=60), st.text(max_size=60), st.text(max_size=60), huge_text())
ANY_TEXT_OR_JSON = TEXT | JSON_VALUES

PART = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "input_text", "image_url", "refusal", "file"]) | st.text(max_size=6)},
        optional={"text": ANY_TEXT_OR_JSON, "image_url": JSON_VALUES | st.fixed_dictionaries({"url": st.text()}),
                  "cache_control": JSON_VALUES}),
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.text(max_size=20),
    JSON_VALUES,
)
# Mostly valid at the top (so bodies get past the validator into the pipeline), random further down.
CONTENT = st.one_of(st.none(), TEXT, TEXT, TEXT, st.lists(PART, max_size=4), st.lists(PART, max_size=4),
                    st.lists(PART, max_size=4), JSON_VALUES)
ARGUMENTS = st.one_of(st.text(max_size=40), JSON_VALUES,
                      st.builds(lambda todos: json.dumps({"todos": todos}),
                                st.lists(st.fixed_dictionaries({}, optional={"status": JSON_VALUES,
                                                                             "content": st.text(max_size=10)})
                                         | JSON_VALUES, max_size=4)))
FUNCTION = st.one_of(
    st.fixed_dictionaries({}, optional={
        "name": st.sampled_from(["bash", "todo_write", "context_read", ""]) | st.text(max_size=10) | JSON_VALUES,
        "arguments": ARGUMENTS}),
    JSON_VALUES,
)
TOOL_CALL = st.one_of(
    st.fixed_dictionaries({"id": st.sampled_from(["call_1", "call_2"]) | st.text(max_size=8),
                           "type": st.just("function"), "function": FUNCTION}),
    st.fixed_dictionaries({}, optional={"id": JSON_VALUES, "type": JSON_VALUES, "function": FUNCTION}),
    JSON_VALUES,
)
ROLE = st.one_of(*[st.sampled_from(VALID_ROLES)] * 12, st.sampled_from(["wizard", "", "USER", "tool "]), JSON_VALUES)
MESSAGE = st.fixed_dictionaries(
    {"role": ROLE},
    optional={"content": CONTENT,
              "tool_calls": st.one_of(st.lists(TOOL_CALL, max_size=3), st.lists(TOOL_CALL, max_size=3), JSON_VALUES),
              "tool_call_id": st.sampled_from(["call_1", "call_2", "nope"]) | JSON_VALUES,
              "name": st.text(max_size=10) | JSON_VALUES,
              "is_error": JSON_VALUES,
              "extra": JSON_VALUES})
TOOL = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": FUNCTION}),
    st.fixed_dictionaries({"type": st.just("function"),
                           "function": st.fixed_dictionaries({"name": st.text(max_size=12)},
                                                             optional={"parameters": JSON_VALUES,
                                                                       "description": st.text(max_size=20)})}),
    JSON_VALUES,
)
CHAT_BODY = st.fixed_dictionaries(
    {"messages": st.one_of(st.just([]), st.lists(MESSAGE, min_size=1, max_size=6),
                           st.lists(MESSAGE, min_size=1, max_size=3)),
     "model": st.one_of(*[st.sampled_from(["gpt-4o", "gpt-4o-mini", "m", "x-32k"])] * 8, st.text(max_size=10),
                        JSON_VALUES)},
    optional={"stream": st.sampled_from([True, False, None]) | JSON_VALUES,
              "stream_options": JSON_VALUES | st.fixed_dictionaries({"include_usage": JSON_VALUES}),
              "tools": st.lists(TOOL, max_size=3) | JSON_VALUES,
              "n": JSON_VALUES, "max_tokens": JSON_VALUES, "temperature": JSON_VALUES})


def encode(value: Any) -> bytes:
    # allow_nan: NaN/Infinity literals are invalid JSON the proxy must refuse cleanly.
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------- arbitrary bodies

def test_arbitrary_json_bodies(fuzzed):
    body_like = st.fixed_dictionaries({}, optional={"model": JSON_VALUES, "messages": JSON_VALUES,
                                                    "stream": JSON_VALUES, "tools": JSON_VALUES})

    @FUZZ
    @given(value=JSON_VALUES | body_like, ascii_only=st.booleans())
    def prop(value: Any, ascii_only: bool) -> None:
        fuzzed.post(json.dumps(value, allow_nan=True, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))

    prop()
    fuzzed.still_serving()


def test_arbitrary_bytes(fuzzed):
    valid = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'

    @FUZZ
    @given(raw=st.one_of(
        st.binary(max_size=2000),
        st.tuples(st.integers(0, len(valid)), st.binary(min_size=1, max_size=8))
          .map(lambda t: valid[:t[0]] + t[1] + valid[t[0]:]),  # a valid body with bytes spliced in
        st.tuples(st.integers(0, len(valid)), st.integers(0, len(valid)))
          .map(lambda t: valid[:min(t)] + valid[max(t):]),  # ... or cut out
        st.sampled_from([b"", b"\xff\xfe\x00", b"\xed\xa0\x80", b'"\\ud800"', b"\x00" * 64,
                         b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}',
                         b'{"model":"m","messages":[{"role":"user","content":"\xed\xa0\x80"}]}']),
    ))
    def prop(raw: bytes) -> None:
        fuzzed.post(raw)

    prop()
    fuzzed.still_serving()


# --------------------------------------------------------------------------- schema-shaped chat bodies

def test_schema_shaped_chat_bodies(fuzzed):
    @settings(FUZZ, max_examples=150)
    @given(body=CHAT_BODY, session=st.none() | st.sampled_from(["s1", "s2"]))
    def prop(body: dict[str, Any], session: str | None) -> None:
        fuzzed.post(encode(body), {"x-session-id": session} if session else None)

    before = fuzzed.passed_through.get(200, 0)
    prop()
    # Not just the validator: a good share of the random bodies went through the pipeline to the provider.
    assert fuzzed.passed_through.get(200, 0) - before >= 5, fuzzed.passed_through
    fuzzed.still_serving()


def test_schema_shaped_sessions_replayed_turn_by_turn(fuzzed):
    """The same session growing turn by turn: replay paths (stored decisions, compactions) see random shapes too."""
    @settings(FUZZ, max_examples=40)
    @given(turns=st.lists(st.lists(MESSAGE, min_size=1, max_size=3), min_size=1, max_size=4),
           stream=st.booleans(), sid=st.integers(0, 10 ** 9))
    def prop(turns: list[list[dict]], stream: bool, sid: int) -> None:
        history: list[dict] = [{"role": "system", "content": "agent"}]
        for new in turns:
            history = history + new
            fuzzed.post(encode({"model": "gpt-4o", "messages": history, "stream": stream}),
                        {"x-session-id": f"replay-{sid}"})

    prop()
    fuzzed.still_serving()


# --------------------------------------------------------------------------- headers

OK_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
# What an HTTP/1.1 client may legally put in a header value: visible ASCII, obs-text, inner spaces/tabs.
H_CHARS = st.sampled_from([bytes([b]) for b in [*range(0x21, 0x7F), *range(0x80, 0x100)]] + [b" ", b"\t"])
H_VALUE = st.lists(H_CHARS, max_size=300).map(lambda cs: b"".join(cs).strip(b" \t"))
HUGE_VALUE = st.tuples(st.sampled_from([b"a", b"Bearer sk-", b"\xe9", b"/..%00"]), st.integers(8_000, 60_000)) \
    .map(lambda t: (t[0] * t[1])[:t[1]].strip())


def test_odd_and_huge_header_values(fuzzed):
    @settings(FUZZ, max_examples=80)
    @given(name=st.sampled_from(["x-session-id", "x-ctx-route", "authorization", "api-key", "x-api-key",
                                 "content-type", "accept-encoding", "connection", "x-anything"]),
           value=H_VALUE | HUGE_VALUE, stream=st.booleans())
    def prop(name: str, value: bytes, stream: bool) -> None:
        body = OK_BODY if not stream else OK_BODY[:-1] + b', "stream": true}'
        fuzzed.post(body, {name: value})

    prop()
    fuzzed.still_serving()


def raw_request(url: str, request: bytes, timeout: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(out) < 1 << 20:
            try:
                got = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not got:
                break
            out += got
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:") and len(rest) >= int(line.split(b":")[1]):
                        return out
        return out


@pytest.mark.parametrize("value", [b"a\x00b", b"\x01", b"a\x7fb", b"a\rb", b"\xff\xfe", b"x" * 70_000,
                                   "sess-é-😀".encode(), b"sess\tion", b"../../etc/passwd"])
@pytest.mark.parametrize("name", [b"X-Session-Id", b"X-Ctx-Route", b"Authorization"])
def test_header_bytes_a_client_library_would_not_send(fz, name, value):
    """Raw bytes on the wire, past any client-side validation: a 4xx (from the server or the app) or a 200."""
    fz.mock.reset()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           + name + b": " + value + b"\r\nContent-Length: " + str(len(OK_BODY)).encode()
           + b"\r\nConnection: close\r\n\r\n" + OK_BODY)
    n_logs = len(fz.logs.records)
    out = raw_request(fz.url, req)
    status_line = out.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 "), out[:200]
    status = int(status_line.split()[1])
    if status == 500:
        fz.known_or_fail(n_logs, out[:500].decode("latin-1"))
        return
    assert status == 200 or 400 <= status < 500, out[:500]
    assert fz.logs.since(n_logs) == "", fz.logs.since(n_logs)
    if b"application/json" in out.split(b"\r\n\r\n", 1)[0].lower() and status != 200:
        err = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]
        assert err["message"] and err["type"]
    fz.still_serving()


# --------------------------------------------------------------------------- deep nesting

def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("raw", [
    pytest.param(b"[" * 10_000, id="10k-open-brackets"),
    pytest.param(b'{"a":' * 10_000, id="10k-open-objects"),
    pytest.param(b'{"model":"m","messages":' + _nested(10_000) + b"}", id="10k-deep-messages"),
    pytest.param(b'{"model":"m","messages":[{"role":"user","content":"hi","x":' + _nested(5_000) + b"}]}",
                 id="5k-deep-inside-a-message"),
])
def test_too_deep_json_is_a_400(fz, raw):
    fz.mock.reset()
    r = fz.post(raw)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    fz.still_serving()


def _deep_message_body(depth: int, stream: bool, where: str = "part") -> bytes:
    nested = _nested(depth)
    if where == "part":
        msg = b'{"role":"user","content":[{"type":"text","text":"hi","x":' + nested + b"}]}"
    else:
        msg = b'{"role":"user","content":"hi","metadata":' + nested + b"}"
    return (b'{"model":"m","stream":' + (b"true" if stream else b"false") + b',"messages":[' + msg + b"]}")


@pytest.mark.parametrize("depth,stream", [(100, False), (100, True), (250, False), (900, False)])
def test_deep_but_parseable_json_passes_through_or_is_refused_cleanly(fz, depth, stream):
    """Up to the depth the proxy can write back, it passes; deeper, a clean 400 (never a 500)."""
    fz.mock.reset()
    r = fz.post(_deep_message_body(depth, stream))
    if depth <= 200:
        assert r.status_code == 200
    else:
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("depth", [260, 600])
def test_deep_json_in_a_streamed_request_is_not_a_500(fz, depth):
    fz.mock.reset()
    n_logs = len(fz.logs.records)
    r = fz.client.post("/v1/chat/completions", content=_deep_message_body(depth, True), headers=AUTH)
    assert r.status_code != 500, fz.logs.since(n_logs)
    assert r.status_code == 200 or (r.status_code == 400 and r.json()["error"]["message"])


@pytest.mark.parametrize("stream", [False, True])
def test_json_nested_just_under_the_parser_limit_is_not_a_500(fz, stream):
    fz.mock.reset()
    n_logs = len(fz.logs.records)
    r = fz.client.post("/v1/chat/completions", content=_deep_message_body(1000, stream), headers=AUTH)
    assert r.status_code != 500, fz.logs.since(n_logs)
    assert r.status_code == 200 or (r.status_code == 400 and r.json()["error"]["message"])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
@pytest.mark.parametrize("name", ["x-session-id", "authorization", "x-anything"])
def test_non_ascii_header_value_is_not_a_500(fz, name, path):
    fz.mock.reset()
    n_logs = len(fz.logs.records)
    r = fz.client.post(path, content=OK_BODY, headers={**AUTH, name: b"Bearer \xe9"})
    assert r.status_code != 500, fz.logs.since(n_logs)
    assert r.status_code == 200 or (400 <= r.status_code < 500 and r.json()["error"]["message"])


@pytest.mark.parametrize("tools", [
    [{"type": "function", "function": "bash"}],
    [{"type": "function", "function": []}],
    [{"type": "function", "function": {"name": ["bash"]}}],
    [{"type": "function", "function": {"name": "bash"}, "name": {"a": 1}}],
])
def test_malformed_tools_are_not_a_500(fz, tools):
    fz.mock.reset()
    n_logs = len(fz.logs.records)
    r = fz.client.post("/v1/chat/completions", headers=AUTH,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools})
    assert r.status_code != 500, fz.logs.since(n_logs)
    assert r.status_code == 200 or (r.status_code == 400 and r.json()["error"]["message"])


LOG_TEXT = "2026-11-29 worker[7] processed item 42 ok\n" * 560  # ~6.7k tokens; the fuzz proxy's window is 16k


def _over_trigger(middle: dict) -> list[dict]:
    """A conversation over the fuzz proxy's compress trigger, with `middle` where layer 1 looks at it."""
    return [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}, middle,
            {"role": "tool", "tool_call_id": "call_1", "content": "short result"},
            {"role": "assistant", "content": LOG_TEXT}, {"role": "assistant", "content": LOG_TEXT},
            {"role": "user", "content": "continue"}]


@pytest.mark.parametrize("messages", [
    pytest.param([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": [], "content": "x"}],
                 id="status-bar-tool_call_id-list"),
    pytest.param([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": {"id": "c"}, "content": "x"}],
                 id="status-bar-tool_call_id-object"),
    pytest.param([{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": ["call_1"], "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "x"}], id="status-bar-call-id-list"),
    pytest.param([{"role": "user", "content": "hi"},
                  {"role": "tool", "tool_call_id": "call_1", "content": "line of output\n" * 200,
                   "tool_calls": [{"id": [], "function": {}}]}], id="offload-call-names-id-list"),
    pytest.param(_over_trigger({"role": "assistant", "content": LOG_TEXT, "tool_call_id": []}),
                 id="compress-clear-tool_call_id-list"),
    pytest.param(_over_trigger({"role": "assistant", "content": LOG_TEXT,
                                "tool_calls": [{"id": "call_1", "type": "function", "function": "bash"}]}),
                 id="compress-clear-function-string"),
])
def test_malformed_tool_call_ids_and_calls_are_not_a_500(fz, messages):
    fz.mock.reset()
    n_logs = len(fz.logs.records)
    r = fz.client.post("/v1/chat/completions", headers=AUTH, json={"model": "m", "messages": messages})
    assert r.status_code != 500, fz.logs.since(n_logs)
    assert r.status_code == 200 or (r.status_code == 400 and r.json()["error"]["message"])


# Was a bug while these tests were written (Counter.inc(negative) -> 500, or a cut stream); fixed in
# accounting.py (max(0, ...)) and compress.py (no compaction without a gain). Kept as a regression test.
@pytest.mark.parametrize("stream", [False, True])
def test_compaction_that_saves_nothing_is_not_a_500(fz, stream):
    fz.mock.reset()
    body = {"model": "m", "stream": stream, "messages": [
        {"role": "system", "content": LOG_TEXT}, {"role": "assistant"}, {"role": "system", "content": LOG_TEXT}]}
    headers = {**AUTH, "x-session-id": f"negative-savings-{stream}-{time.time_ns()}"}
    with httpx.Client(base_url=fz.url, timeout=30) as c:
        try:
            r = c.post("/v1/chat/completions", headers=headers, json=body)
        except httpx.RemoteProtocolError as e:
            pytest.fail(f"stream cut: {e!r}")
    assert r.status_code == 200, r.text
    if stream:
        assert r.text.rstrip().endswith("data: [DONE]")
