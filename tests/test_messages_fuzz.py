"""Property-based fuzzing of what a Messages API client can send: whatever arrives at /v1/messages (or its
count_tokens), the answer is an Anthropic-shaped 4xx or a clean pass-through of what the provider said,
never a 500, and the proxy keeps serving.

tests/test_fuzz.py for Anthropic's API, on its machinery (the log capture, the
pass-through bookkeeping): one mock provider and one proxy for the module,
offload and compression tuned to engage on small inputs so that random shapes
reach the pipeline (tool results split out of their user turn and joined
back, placeholders, the status bar, cache breakpoints) and not only the
validator. Random blocks, odd types, missing fields, deep nesting, huge
strings, non-ASCII headers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mock_upstream import MockUpstream
from proxy_server import ProxyServer, make_settings
from test_fuzz import FUZZ, JSON_VALUES, TEXT, Captured, Fuzzed, _nested, huge_text, raw_request

KEY = "sk-ant-fuzz"
AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
ANTHROPIC_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                   "request_too_large", "rate_limit_error", "api_error", "overloaded_error"}
OK_BODY = b'{"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}'


def anthropic_error(content: bytes, where: str) -> None:
    body = json.loads(content)
    assert isinstance(body, dict) and body.get("type") == "error", where
    err = body["error"]
    assert isinstance(err, dict) and err["type"] in ANTHROPIC_TYPES, where
    assert isinstance(err["message"], str) and err["message"], where


class MessagesFuzzed(Fuzzed):
    """Fuzzed with the Messages API's shapes: its path, its key header, its error envelope."""

    def post(self, content: bytes, headers: dict[str, Any] | None = None, path: str = "/v1/messages"
             ) -> httpx.Response | None:
        n_logs, n_mock = len(self.logs.records), len(self.mock.requests)
        try:
            r = self.client.post(path, content=content, headers={**AUTH, "content-type": "application/json",
                                                                 **(headers or {})})
        except httpx.TransportError as e:
            self.known_or_fail(n_logs, f"the proxy broke the connection: {e!r}")
            return None
        return r if self.check(r, n_mock, n_logs) else None

    def check(self, r: httpx.Response, n_mock: int, n_logs: int) -> bool:
        forwarded = len(self.mock.requests) > n_mock
        where = f"status {r.status_code}, body {r.content[:300]!r}\nproxy log:\n{self.logs.since(n_logs)}"
        if forwarded and r.status_code == self.mock.requests[-1].status:
            self.passed_through[r.status_code] = self.passed_through.get(r.status_code, 0) + 1
            if r.status_code >= 500:  # the mock itself choked on a shape; relayed unchanged, which is right
                self.mock_errors += 1
                assert b"mock upstream error" in r.content, where
            elif r.status_code >= 400:  # the mock's own validation: Anthropic's envelope, relayed
                anthropic_error(r.content, where)
            elif r.headers.get("content-type", "").startswith("text/event-stream"):
                assert r.content.endswith(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), where
            else:  # a message, or count_tokens' count
                data = r.json()
                assert data.get("type") == "message" or isinstance(data.get("input_tokens"), int), where
            assert self.logs.since(n_logs) == "", "passed through, but the proxy logged an error: " + where
            return True
        assert 400 <= r.status_code < 500, "the proxy answered this itself and it is not a 4xx: " + where
        assert r.headers["content-type"].startswith("application/json"), where
        anthropic_error(r.content, where)
        assert self.logs.since(n_logs) == "", "a 4xx, but the proxy logged an error: " + where
        return True

    def still_serving(self) -> None:
        assert self.client.get("/healthz").status_code == 200
        r = self.client.post("/v1/messages", content=OK_BODY, headers=AUTH)
        assert r.status_code == 200 and r.json()["content"][0]["text"] == "ok", r.text


@pytest.fixture(scope="module")
def fz(tmp_path_factory) -> Iterator[MessagesFuzzed]:
    db = tmp_path_factory.mktemp("mfuzz") / "fuzz.db"
    with MockUpstream() as mock:
        cfg = make_settings(mock.base_url, f"sqlite:///{db}", default_context_window=16_000,
                            defaults={"offload": {"tool_result_tokens": 300, "user_message_tokens": 2000},
                                      "compress": {"keep_recent_tokens": 1000, "summary_timeout": 5}})
        with ProxyServer(cfg) as p, Captured().diverting("ctxproxy", "uvicorn.error") as logs:
            fz = MessagesFuzzed(p, mock, p.http_client(timeout=30), logs)
            yield fz
            fz.client.close()
            print(f"\nmessages fuzz: provider statuses passed through {fz.passed_through}, "
                  f"mock crashes {fz.mock_errors}")


@pytest.fixture
def fuzzed(fz: MessagesFuzzed) -> MessagesFuzzed:
    fz.logs.settle()
    fz.mock.reset()
    return fz


# --------------------------------------------------------------------------- strategies

IDS = st.sampled_from(["toolu_1", "toolu_2", "toolu_3"])
CACHE_CONTROL = st.one_of(st.just({"type": "ephemeral"}), st.just({"type": "ephemeral", "ttl": "1h"}), JSON_VALUES)
INNER = st.one_of(  # what a tool_result's content list holds
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}, optional={"cache_control": CACHE_CONTROL}),
    st.fixed_dictionaries({"type": st.just("image"), "source": JSON_VALUES}),
    JSON_VALUES,
)
RESULT_CONTENT = st.one_of(TEXT, st.lists(INNER, max_size=3), st.none())
TOOL_USE = st.fixed_dictionaries(
    {"type": st.just("tool_use"), "id": IDS, "name": st.sampled_from(["Bash", "Read", "context_read", "TodoWrite"])},
    optional={"input": JSON_VALUES | st.fixed_dictionaries({"cmd": st.text(max_size=20)}),
              "cache_control": CACHE_CONTROL})
TOOL_RESULT = st.fixed_dictionaries(
    {"type": st.just("tool_result"), "tool_use_id": IDS},
    optional={"content": RESULT_CONTENT, "is_error": JSON_VALUES | st.booleans(), "cache_control": CACHE_CONTROL})
SAFE_BLOCK = st.one_of(  # blocks the API takes anywhere (so that a conversation stays valid around them)
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT.filter(bool)},
                          optional={"cache_control": CACHE_CONTROL, "citations": JSON_VALUES}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": TEXT, "signature": st.text(max_size=20)}),
    st.fixed_dictionaries({"type": st.sampled_from(["redacted_thinking", "image", "document", "server_tool_use",
                                                    "search_result", "compaction", "future_block"])},
                          optional={"data": JSON_VALUES, "source": JSON_VALUES, "id": JSON_VALUES}),
)
BLOCK = st.one_of(  # anything at all
    SAFE_BLOCK,
    TOOL_USE,
    TOOL_RESULT,
    st.fixed_dictionaries({"type": st.text(max_size=12) | JSON_VALUES},
                          optional={"text": TEXT | JSON_VALUES, "content": JSON_VALUES, "id": JSON_VALUES,
                                    "tool_use_id": JSON_VALUES, "name": JSON_VALUES, "input": JSON_VALUES}),
    st.text(max_size=20),
    JSON_VALUES,
)
EXTRA_BLOCKS = st.lists(SAFE_BLOCK, max_size=2)
CONTENT = st.one_of(TEXT, TEXT, st.lists(BLOCK, max_size=4), st.lists(BLOCK, max_size=4), JSON_VALUES, st.none())
ROLE = st.one_of(*[st.sampled_from(["user", "assistant"])] * 10, st.sampled_from(["system", "tool", "", "USER"]),
                 JSON_VALUES)
MESSAGE = st.fixed_dictionaries({"role": ROLE}, optional={"content": CONTENT, "extra": JSON_VALUES})


@st.composite
def conversation(draw: Any) -> list[dict[str, Any]]:
    """Mostly what an agent sends - tool calls answered in the next turn - with random blocks and texts
    (huge ones too), so that bodies get past the validator into the pipeline; now and then anything."""
    out: list[dict[str, Any]] = [{"role": "user", "content": draw(TEXT.filter(bool) | st.lists(SAFE_BLOCK, min_size=1,
                                                                                            max_size=2))}]
    for turn in range(draw(st.integers(0, 3))):
        ids = [f"toolu_{turn}_{k}" for k in range(draw(st.integers(1, 2)))]
        calls = [{"type": "tool_use", "id": i, "name": draw(st.sampled_from(["Bash", "Read", "context_read"])),
                  "input": draw(st.fixed_dictionaries({"cmd": st.text(max_size=20)}) | JSON_VALUES)} for i in ids]
        out.append({"role": "assistant", "content": draw(EXTRA_BLOCKS) + calls})
        results = [{"type": "tool_result", "tool_use_id": i, "content": draw(RESULT_CONTENT),
                    **({"is_error": True} if draw(st.booleans()) else {})} for i in ids]
        out.append({"role": "user", "content": results + draw(EXTRA_BLOCKS)})
    for _ in range(draw(st.integers(0, 2))):  # often nothing; else a random block or message somewhere
        where = draw(st.integers(0, len(out) - 1))
        content = out[where].get("content")
        if draw(st.booleans()) and isinstance(content, list):
            content.insert(draw(st.integers(0, len(content))), draw(BLOCK))
        else:
            out.insert(where + 1, draw(MESSAGE))
    return out


TOOL = st.fixed_dictionaries(
    {"name": st.sampled_from(["Bash", "Read", "context_read", "ctx_read"]) | st.text(max_size=8)},
    optional={"description": st.text(max_size=20), "input_schema": st.just({"type": "object"}) | JSON_VALUES,
              "cache_control": CACHE_CONTROL, "type": JSON_VALUES})
SYSTEM = st.text(max_size=40) | st.lists(st.fixed_dictionaries(
    {"type": st.just("text"), "text": TEXT.filter(bool)}, optional={"cache_control": CACHE_CONTROL}), max_size=3)
VALID_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "system": SYSTEM, "tools": st.lists(TOOL, max_size=3), "stream": st.booleans(),
    "metadata": st.fixed_dictionaries({"user_id": st.sampled_from(["user_abc_account_1_session_7f3c",
                                                                   "user_x_session_", "x"])}),
    "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "adaptive"]),
                                       "budget_tokens": st.integers(0, 5000)}),
    "cache_control": st.just({"type": "ephemeral"}), "tool_choice": st.just({"type": "auto"}),
    "temperature": st.floats(0, 1), "context_management": JSON_VALUES,
}
ANY_FIELD = ["model", "max_tokens", "messages", *VALID_FIELDS]


@st.composite
def messages_body(draw: Any) -> dict[str, Any]:
    """A body an agent could send, with its optional fields; then a few fields (often none) replaced by any
    JSON value or removed. (Weights by one_of repetition do not hold up against hypothesis's choices.)"""
    body: dict[str, Any] = {"model": draw(st.sampled_from(["claude-sonnet-4-6", "claude-haiku-4-5", "m"])),
                            "max_tokens": 256, "messages": draw(conversation())}
    for name in draw(st.lists(st.sampled_from(list(VALID_FIELDS)), max_size=4, unique=True)):
        body[name] = draw(VALID_FIELDS[name])
    for name in draw(st.lists(st.sampled_from(ANY_FIELD), max_size=2, unique=True)):
        if draw(st.booleans()):
            body[name] = draw(JSON_VALUES | st.lists(MESSAGE, max_size=3) | st.integers(-5, 10 ** 6))
        else:
            body.pop(name, None)
    return body


MESSAGES_BODY = messages_body()


def encode(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------- arbitrary bodies

@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_arbitrary_json_bodies(fuzzed, path):
    body_like = st.fixed_dictionaries({}, optional={"model": JSON_VALUES, "messages": JSON_VALUES,
                                                    "max_tokens": JSON_VALUES, "stream": JSON_VALUES,
                                                    "system": JSON_VALUES, "tools": JSON_VALUES})

    @settings(FUZZ, max_examples=60)
    @given(value=JSON_VALUES | body_like, ascii_only=st.booleans())
    def prop(value: Any, ascii_only: bool) -> None:
        fuzzed.post(json.dumps(value, allow_nan=True, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"),
                    path=path)

    prop()
    fuzzed.still_serving()


def test_arbitrary_bytes(fuzzed):
    valid = OK_BODY

    @settings(FUZZ, max_examples=80)
    @given(raw=st.one_of(
        st.binary(max_size=2000),
        st.tuples(st.integers(0, len(valid)), st.binary(min_size=1, max_size=8))
          .map(lambda t: valid[:t[0]] + t[1] + valid[t[0]:]),  # a valid body with bytes spliced in
        st.tuples(st.integers(0, len(valid)), st.integers(0, len(valid)))
          .map(lambda t: valid[:min(t)] + valid[max(t):]),  # ... or cut out
        st.sampled_from([b"", b"\xff\xfe\x00", b"\xed\xa0\x80", b'"\\ud800"', b"\x00" * 64,
                         OK_BODY.replace(b'"hi"', b'"\\ud800"'), OK_BODY.replace(b'"hi"', b'"\xed\xa0\x80"'),
                         OK_BODY.replace(b"64", b"NaN"), OK_BODY.replace(b"64", b"1e400")]),
    ), path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
    def prop(raw: bytes, path: str) -> None:
        fuzzed.post(raw, path=path)

    prop()
    fuzzed.still_serving()


# --------------------------------------------------------------------------- schema-shaped Messages bodies

def test_schema_shaped_messages_bodies(fuzzed):
    @settings(FUZZ, max_examples=150)
    @given(body=MESSAGES_BODY, session=st.none() | st.sampled_from(["s1", "s2"]))
    def prop(body: dict[str, Any], session: str | None) -> None:
        fuzzed.post(encode(body), {"x-session-id": session} if session else None)

    before = fuzzed.passed_through.get(200, 0)
    prop()
    # Not just the validator: a good share of the random bodies went through the pipeline to the provider.
    assert fuzzed.passed_through.get(200, 0) - before >= 10, fuzzed.passed_through
    fuzzed.still_serving()


def test_schema_shaped_count_tokens_bodies(fuzzed):
    @settings(FUZZ, max_examples=60)
    @given(body=MESSAGES_BODY)
    def prop(body: dict[str, Any]) -> None:
        body.pop("max_tokens", None)
        body.pop("stream", None)
        fuzzed.post(encode(body), path="/v1/messages/count_tokens")

    before = fuzzed.passed_through.get(200, 0)
    prop()
    assert fuzzed.passed_through.get(200, 0) - before >= 5, fuzzed.passed_through
    fuzzed.still_serving()


def test_schema_shaped_sessions_replayed_turn_by_turn(fuzzed):
    """A session growing turn by turn: stored decisions (offloads, compactions) replay over random shapes."""
    @settings(FUZZ, max_examples=30)
    @given(history=conversation(), stream=st.booleans(), tools=st.lists(TOOL, max_size=2),
           sid=st.integers(0, 10 ** 9))
    def prop(history: list[dict[str, Any]], stream: bool, tools: list[Any], sid: int) -> None:
        for n in range(1, len(history) + 1):
            fuzzed.post(encode({"model": "m", "max_tokens": 128, "system": "agent", "messages": history[:n],
                                "tools": tools, "stream": stream}), {"x-session-id": f"mreplay-{sid}"})

    prop()
    fuzzed.still_serving()


# --------------------------------------------------------------------------- huge strings

@pytest.mark.parametrize("stream", [False, True])
def test_huge_tool_results_and_texts_pass(fuzzed, stream):
    @settings(FUZZ, max_examples=12)
    @given(result=huge_text(), text=huge_text(), as_blocks=st.booleans())
    def prop(result: str, text: str, as_blocks: bool) -> None:
        content: Any = [{"type": "text", "text": result}, {"type": "text", "text": result[::-1]}] if as_blocks \
            else result
        r = fuzzed.post(encode({"model": "m", "max_tokens": 64, "stream": stream, "tools": [{"name": "Bash"}],
                                "messages": [
                                    {"role": "user", "content": text},
                                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                                                       "name": "Bash", "input": {}}]},
                                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                                  "content": content}]}]}))
        assert r is not None
        # 200, offloaded; or, when the store took longer than store_timeout to keep the text (a loaded machine),
        # forwarded unmodified as designed, and then the mock's own answer to the whole body, relayed
        assert r.status_code == 200 or r.headers.get("x-ctxproxy-degraded") == "store-unavailable", \
            (r, r.headers.get("x-ctxproxy-degraded"), r.content[:300])

    prop()


# --------------------------------------------------------------------------- headers

H_CHARS = st.sampled_from([bytes([b]) for b in [*range(0x21, 0x7F), *range(0x80, 0x100)]] + [b" ", b"\t"])
H_VALUE = st.lists(H_CHARS, max_size=300).map(lambda cs: b"".join(cs).strip(b" \t"))
HUGE_VALUE = st.tuples(st.sampled_from([b"a", b"sk-ant-", b"\xe9", b"/..%00"]), st.integers(8_000, 60_000)) \
    .map(lambda t: (t[0] * t[1])[:t[1]].strip())


def test_odd_and_huge_header_values(fuzzed):
    @settings(FUZZ, max_examples=80)
    @given(name=st.sampled_from(["x-api-key", "authorization", "anthropic-version", "anthropic-beta",
                                 "x-session-id", "x-ctx-route", "content-type", "accept-encoding", "x-anything"]),
           value=H_VALUE | HUGE_VALUE, stream=st.booleans(),
           path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
    def prop(name: str, value: bytes, stream: bool, path: str) -> None:
        body = OK_BODY if not stream else OK_BODY[:-1] + b', "stream": true}'
        fuzzed.post(body, {name: value}, path=path)

    prop()
    fuzzed.still_serving()


@pytest.mark.parametrize("value", [b"a\x00b", b"\x01", b"a\x7fb", b"\xff\xfe", b"x" * 70_000,
                                   "sk-ant-é-😀".encode(), b"sess\tion", b"../../etc/passwd"])
@pytest.mark.parametrize("name", [b"X-Api-Key", b"X-Session-Id", b"X-Ctx-Route", b"Anthropic-Version"])
def test_header_bytes_a_client_library_would_not_send(fz, name, value):
    """Raw bytes on the wire, past any client-side validation: a 4xx (from the server or the app) or a 200."""
    fz.mock.reset()
    req = (b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           + (b"X-Api-Key: sk-ant-raw\r\n" if name != b"X-Api-Key" else b"")
           + name + b": " + value + b"\r\nContent-Length: " + str(len(OK_BODY)).encode()
           + b"\r\nConnection: close\r\n\r\n" + OK_BODY)
    n_logs = len(fz.logs.records)
    out = raw_request(fz.url, req)
    status_line = out.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 "), out[:200]
    status = int(status_line.split()[1])
    assert status == 200 or 400 <= status < 500, out[:500]
    assert fz.logs.since(n_logs) == "", fz.logs.since(n_logs)
    head, _, rest = out.partition(b"\r\n\r\n")
    if b"application/json" in head.lower() and status != 200 and fz.mock.requests == []:
        anthropic_error(rest, out[:500].decode("latin-1"))
    fz.still_serving()


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("name", ["x-api-key", "x-session-id", "anthropic-beta", "x-ctx-route"])
def test_non_ascii_header_value_is_not_a_500(fz, name, path):
    fz.mock.reset()
    n_logs = len(fz.logs.records)
    r = fz.client.post(path, content=OK_BODY, headers={**AUTH, name: b"sk-ant-\xe9\xff"})
    assert r.status_code != 500, fz.logs.since(n_logs)
    assert r.status_code == 200 or (400 <= r.status_code < 500 and r.json()["error"]["message"])


# --------------------------------------------------------------------------- deep nesting

@pytest.mark.parametrize("raw", [
    pytest.param(b"[" * 10_000, id="10k-open-brackets"),
    pytest.param(b'{"a":' * 10_000, id="10k-open-objects"),
    pytest.param(b'{"model":"m","max_tokens":5,"messages":' + _nested(10_000) + b"}", id="10k-deep-messages"),
    pytest.param(b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi",'
                 b'"x":' + _nested(5_000) + b"}]}]}", id="5k-deep-inside-a-block"),
])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_too_deep_json_is_an_anthropic_400(fz, raw, path):
    fz.mock.reset()
    r = fz.post(raw, path=path)
    assert r is not None and r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r


def _deep(depth: int, stream: bool, where: str) -> bytes:
    nested = _nested(depth)
    if where == "block":
        msgs = b'[{"role":"user","content":[{"type":"text","text":"hi","x":' + nested + b"}]}]"
    elif where == "tool-input":
        msgs = (b'[{"role":"user","content":"go"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1",'
                b'"name":"Bash","input":{"a":' + nested + b'}}]},{"role":"user","content":[{"type":"tool_result",'
                b'"tool_use_id":"toolu_1","content":"done"}]}]')
    else:
        msgs = (b'[{"role":"user","content":"go"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1",'
                b'"name":"Bash","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1",'
                b'"content":[{"type":"text","text":"x","y":' + nested + b"}]}]}]")
    return (b'{"model":"m","max_tokens":64,"stream":' + (b"true" if stream else b"false")
            + b',"tools":[{"name":"Bash"}],"messages":' + msgs + b"}")


@pytest.mark.parametrize("depth", [100, 250, 900, 1000])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("where", ["block", "tool-input", "tool-result"])
def test_deep_but_parseable_json_passes_or_is_refused_cleanly(fz, depth, stream, where):
    """Up to the depth the proxy can write back, it passes; deeper, a clean Anthropic 400 (never a 500)."""
    fz.mock.reset()
    r = fz.post(_deep(depth, stream, where))
    assert r is not None
    if depth <= 200:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code in (200, 400), r.text


# --------------------------------------------------------------------------- tool pairing edge cases

CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]}


@pytest.mark.parametrize("messages", [
    pytest.param([{"role": "user", "content": "go"},
                  CALL,
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": 5}]}],
                 id="result-content-a-number"),
    pytest.param([{"role": "user", "content": "go"},
                  {**CALL, "content": [{**CALL["content"][0], "input": []}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                "content": [{"type": "text", "text": "x" * 40_000}]}]}],
                 id="input-a-list-and-a-huge-result"),
    pytest.param([{"role": "user", "content": "go"},
                  CALL,
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "b"}]}],
                 id="two-user-turns-answering-one-call"),
    pytest.param([{"role": "user", "content": "go"},
                  CALL,
                  {"role": "assistant", "content": "more"},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"}]}],
                 id="consecutive-assistant-turns"),
    pytest.param([{"role": "user", "content": []}], id="empty-content-list"),
    pytest.param([{"role": "user", "content": ""}], id="empty-string"),
    pytest.param([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": None}]}],
                 id="tool_use_id-null"),
    pytest.param([{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "context_read",
                                                     "input": {"handle": "ctx_0"}}]}],
                 id="final-assistant-read-call"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_odd_tool_pairings_are_not_a_500(fz, messages, stream):
    fz.mock.reset()
    r = fz.post(encode({"model": "m", "max_tokens": 64, "stream": stream, "tools": [{"name": "Bash"}],
                        "messages": messages}), {"x-session-id": f"pairing-{time.time_ns()}"})
    assert r is not None


# Found by the schema fuzzer: the codec wrote a tool_use input with orjson, which refuses an integer beyond
# 64 bits, so every request of a session holding such a call was degraded (forwarded unrewritten) from then on.
@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_input_with_an_integer_beyond_64_bits_is_rewritten_as_usual(fz, stream):
    fz.mock.reset()
    text = "\n".join(f"line {i}: worker processed item {i * 7919 % 100003} ok" for i in range(400))
    big = 2 ** 70
    raw = encode({"model": "m", "max_tokens": 64, "stream": stream, "tools": [{"name": "Bash"}], "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                           "input": {"seed": big}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]}]})
    n_logs = len(fz.logs.records)
    r = fz.client.post("/v1/messages", content=raw, headers={**AUTH, "x-session-id": f"bigint-{stream}"})
    assert r.status_code == 200, r.text
    assert fz.logs.since(n_logs) == ""
    assert "x-ctxproxy-degraded" not in r.headers and r.headers.get("x-ctxproxy-offloaded") == "1", r.headers
    assert str(big).encode() in fz.mock.requests[-1].body  # its exact digits, forwarded


# --------------------------------------------------------------------------- what the provider answers

READ_INPUT = st.one_of(st.fixed_dictionaries({"handle": st.just("ctx_0")},
                                             optional={"offset": JSON_VALUES, "limit": JSON_VALUES,
                                                       "pattern": JSON_VALUES}), JSON_VALUES)
REPLY_BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.sampled_from(["toolu_r1", "toolu_r2"]) | JSON_VALUES,
                           "name": st.just("context_read"), "input": READ_INPUT}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("toolu_b"), "name": st.just("Bash"),
                           "input": st.just({"cmd": "ls"})}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.text(max_size=20), "signature": st.just("Eo")}),
    BLOCK,
)
USAGE = st.one_of(st.fixed_dictionaries({"input_tokens": st.integers(0, 2 ** 64 - 1),
                                         "output_tokens": st.integers(0, 2 ** 64 - 1)},
                                        optional={"cache_read_input_tokens": JSON_VALUES,
                                                  "cache_creation_input_tokens": JSON_VALUES}), JSON_VALUES)


@st.composite
def reply_message(draw: Any) -> dict[str, Any]:
    content = draw(st.lists(REPLY_BLOCK, max_size=2))
    if draw(st.booleans()):  # a read call the loop answers, as often as not
        content.insert(draw(st.integers(0, len(content))), {"type": "tool_use", "id": "toolu_r0",
                                                            "name": "context_read", "input": {"handle": "ctx_0"}})
    reads = [b for b in content if isinstance(b, dict) and b.get("name") == "context_read"]
    return {"model": "m", "id": "msg_f", "type": "message", "role": "assistant", "content": content,
            "stop_reason": draw(st.sampled_from(["tool_use" if reads else "end_turn", "max_tokens"]) | JSON_VALUES),
            "stop_sequence": None, "usage": draw(USAGE)}


def _events_of(message: dict[str, Any]) -> list[Any]:
    out: list[Any] = [{"type": "message_start", "message": {**message, "content": []}}]
    for i, block in enumerate(message["content"]):
        if not isinstance(block, dict):
            out.append({"type": "content_block_start", "index": i, "content_block": block})
            continue
        start = {**block, "input": {}} if block.get("type") == "tool_use" else block
        out.append({"type": "content_block_start", "index": i, "content_block": start})
        if block.get("type") == "tool_use":
            args = json.dumps(block.get("input"))
            out += [{"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta",
                                                                         "partial_json": args[k:k + 7]}}
                    for k in range(0, len(args), 7)]
        out.append({"type": "content_block_stop", "index": i})
    out += [{"type": "message_delta", "delta": {"stop_reason": message["stop_reason"]}, "usage": message["usage"]},
            {"type": "message_stop"}]
    return out


def _frame(e: Any) -> bytes:
    kind = e.get("type") if isinstance(e, dict) and isinstance(e.get("type"), str) else "x"
    return f"event: {kind}\n".encode() + b"data: " + encode(e) + b"\n\n"


@st.composite
def reply_stream(draw: Any) -> bytes:
    """The events of a random reply, then now and then one dropped, one inserted, or the bytes cut short."""
    events = _events_of(draw(reply_message()))
    how = draw(st.sampled_from(["as is", "as is", "drop", "insert", "cut"]))
    if how == "drop":
        events.pop(draw(st.integers(0, len(events) - 1)))
    elif how == "insert":
        events.insert(draw(st.integers(0, len(events))), draw(JSON_VALUES | st.fixed_dictionaries(
            {"type": st.sampled_from(["ping", "error", "content_block_delta", "message_delta", "future"])},
            optional={"index": JSON_VALUES, "delta": JSON_VALUES, "error": JSON_VALUES, "usage": JSON_VALUES})))
    raw = b"".join(_frame(e) for e in events)
    return raw[:draw(st.integers(0, len(raw)))] if how == "cut" else raw


def is_read_call(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == "context_read" \
        and isinstance(block.get("id"), str)


def test_arbitrary_provider_replies_to_a_request_with_the_read_tool(fuzzed):
    """Whatever the provider answers - read calls of any shape, broken events, odd usage - and whatever it
    answers the hidden round, the client gets the provider's answer, a finished message, or one Anthropic
    error; never a 500, never a cut connection."""
    rounds = []

    @settings(FUZZ, max_examples=120)
    @given(stream=st.booleans(), data=st.data())
    def prop(stream: bool, data: Any) -> None:
        fuzzed.mock.reset()
        replies = [data.draw(reply_stream() if stream else reply_message().map(encode)) for _ in range(2)]
        for raw in replies:
            fuzzed.mock.fail_next(200, raw, {"content-type": "text/event-stream"} if stream else None)
        n_logs = len(fuzzed.logs.records)
        try:
            r = fuzzed.client.post("/v1/messages", headers=AUTH, content=encode(
                {"model": "m", "max_tokens": 64, "stream": stream, "tools": [{"name": "Bash"}],
                 "messages": [{"role": "user", "content": "hi"}]}))
        except httpx.TransportError as e:
            pytest.fail(f"the proxy broke the connection: {e!r}\nproxy log:\n{fuzzed.logs.since(n_logs)}")
        where = f"status {r.status_code}, body {r.content[-600:]!r}\nproxy log:\n{fuzzed.logs.since(n_logs)}"
        assert fuzzed.logs.since(n_logs) == "", where
        if r.status_code != 200:  # the proxy's error for a hidden round gone wrong, or the mock's refusal of one
            anthropic_error(r.content, where)
        elif len(fuzzed.mock.requests) == 1 and not stream and r.content != replies[0]:
            # no round the proxy could run: the provider's bytes, or, beside a call of the client's, its own
            # calls taken out (the client cannot run them)
            sent = json.loads(replies[0])["content"]
            assert r.json()["content"] == [b for b in sent if not is_read_call(b)] != sent, where
        elif not stream:
            assert r.json()["type"] == "message", where  # the last round's message
        if stream and r.content.endswith(b"\n\n"):
            last = r.content[:-2].rsplit(b"\n\n", 1)[-1]
            if last.startswith(b"event: error\n") and len(fuzzed.mock.requests) > 1:
                anthropic_error(last.split(b"\n", 1)[1][5:], where)  # one clean error, after a hidden round
        rounds.append(len(fuzzed.mock.requests) - 1)

    prop()
    assert sum(1 for n in rounds if n) >= 15, rounds  # many replies did get a hidden round
    fuzzed.mock.reset()
    fuzzed.still_serving()
