"""Google's Gemini API through the proxy, in its own shape: Google's Python SDK and the real Gemini CLI as clients,
the mock's Gemini API (tests/_mock_gemini_wire.py, independent of the proxy's code) as the provider.

What a Gemini CLI user meets: a session of big shell outputs that dies at a 32k window straight to the provider
(tests/test_mock_gemini.py has that baseline) finishes through the proxy; the proxy's read tool is answered in
hidden rounds, streamed and not; the key in `?key=` makes a tenant and is never printed; errors come in Google's
shape; the window is learned from Google's over-window wording; the same history is sent as the same bytes.
The faults every API shares (provider errors, dropped sockets, cut streams, malformed bodies, unknown routes) are in
tests/test_faults.py, Gemini one of its APIs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from _mock_agent import ShellAgent, tool_names
from agent_runs import GEMINI_MODEL, run_gemini
from google import genai
from google.genai import types
from mock_upstream import MockUpstream
from test_mock_gemini import require_gemini

MODEL = "gemini-2.5-pro"
KEY = "gk-test"
HANDLE = re.compile(r'context_read\(handle=\\?"(ctx_[0-9a-f]+)')
WINDOW = 32_000


def root(upstream: MockUpstream) -> str:
    return upstream.base_url.removesuffix("/v1")


def gemini_proxy(make_proxy: Any, upstream: MockUpstream, real: bool = False) -> Any:
    """A proxy whose default route forwards to the mock's Gemini API."""
    return make_proxy(upstream_url=root(upstream) + "/v1beta", upstream={"api": "google"},
                      defaults={"offload": {"tool_result_tokens": 500}}, real=real)


@pytest.fixture
def gproxy(make_proxy: Any, upstream: MockUpstream) -> Any:
    return gemini_proxy(make_proxy, upstream)


def client(p: Any, version: str = "v1beta", **headers: str) -> genai.Client:
    options = types.HttpOptions(base_url=p.url, api_version=version, headers=headers or None,
                                retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=KEY, http_options=options)


def big_log() -> str:
    return "\n".join(f"line {i}: item {i * 7919 % 10007} ok" for i in range(3000))


def turn(output: str) -> list[dict[str, Any]]:
    return [{"role": "user", "parts": [{"text": "Find the bad item in the log."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {"command": "cat log"}},
                                         "thoughtSignature": "c2lnbmF0dXJl"}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "run_shell_command",
                                                             "response": {"output": output}}}]}]


TOOLS = [{"functionDeclarations": [{"name": "run_shell_command", "description": "Run a command",
                                    "parametersJsonSchema": {"type": "object",
                                                             "properties": {"command": {"type": "string"}}}}]}]


SYSTEM = "You are a coding agent. " + " ".join(f"Rule {i}: keep the work tidy." for i in range(400))


def body(output: str | None = None) -> dict[str, Any]:
    return {"contents": turn(output if output is not None else big_log()),
            "systemInstruction": {"role": "user", "parts": [{"text": SYSTEM}]}, "tools": TOOLS}


def post(p: Any, method: str, payload: Any, query: str = "", **headers: str) -> httpx.Response:
    r: httpx.Response = p.post(f"/v1beta/models/{MODEL}:{method}{query}", json=payload,
                               headers={"x-goog-api-key": KEY, **headers})
    return r


def test_a_big_function_response_is_offloaded_and_everything_else_kept(gproxy: Any, upstream: MockUpstream) -> None:
    r = post(gproxy, "generateContent", body())
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-offloaded"] == "1"
    sent = upstream.requests[-1]
    assert sent.path == f"/v1beta/models/{MODEL}:generateContent"
    got = sent.json
    assert got["systemInstruction"] == body()["systemInstruction"]
    assert got["contents"][:2] == turn("")[:2]  # the call, its signature byte for byte
    response = got["contents"][2]["parts"][0]["functionResponse"]
    assert response["id"] == "c1" and response["name"] == "run_shell_command"
    assert HANDLE.search(json.dumps(response)) and len(response["response"]["output"]) < 3000
    assert got["contents"][2]["parts"][-1]["text"].startswith("<agent_status>")  # the status bar: the last user part
    assert tool_names(got) == ["run_shell_command", "context_read"] and len(got["tools"]) == 1
    usage = r.json()["usageMetadata"]
    assert int(r.headers["x-ctxproxy-prompt-tokens"]) > 0 and usage["promptTokenCount"] > 0


def test_the_python_sdk_streams_through_the_proxy_at_both_versions(make_proxy: Any, upstream: MockUpstream) -> None:
    p = gemini_proxy(make_proxy, upstream, real=True)  # the SDK makes its own HTTP client: a real socket
    upstream.script("streamed words from the model")
    for version in ("v1beta", "v1"):
        sdk = client(p, version)  # kept: a client collected closes its connections
        chunks = list(sdk.models.generate_content_stream(
            model=MODEL, contents=body()["contents"],
            config=types.GenerateContentConfig(tools=[types.Tool.model_validate(TOOLS[0])])))
        assert "".join(c.text or "" for c in chunks).startswith("streamed words" if version == "v1beta" else "ok")
        assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
        assert chunks[-1].usage_metadata.prompt_token_count > 0
        assert upstream.requests[-1].query == "alt=sse"
        assert upstream.requests[-1].path.endswith(f"/models/{MODEL}:streamGenerateContent")


def _read_call(request: dict[str, Any]) -> dict[str, Any]:
    handle = HANDLE.search(json.dumps(request["contents"]))
    assert handle, "the offloaded output should be in the request by now"
    return {"content": "Reading the stored log.",
            "tool_calls": [{"name": "context_read", "arguments": {"handle": handle.group(1), "pattern": "item 7919"}}]}


@pytest.mark.parametrize("stream", [False, True])
def test_a_hidden_read_round_is_answered_and_never_shown(gproxy: Any, upstream: MockUpstream, stream: bool) -> None:
    upstream.script(_read_call, "The bad item is 7919.")
    method, query = ("streamGenerateContent", "?alt=sse") if stream else ("generateContent", "")
    r = post(gproxy, method, body(), query)
    assert r.status_code == 200, r.text
    assert "context_read" not in r.text
    if stream:
        chunks = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
        text = "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])
        assert text.endswith("The bad item is 7919.") and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
        usage = chunks[-1]["usageMetadata"]
    else:
        usage = r.json()["usageMetadata"]
        assert r.headers["x-ctxproxy-read-rounds"] == "1"
        assert r.json()["candidates"][0]["content"]["parts"] == [{"text": "The bad item is 7919."}]
    first, second = upstream.requests[-2:]
    assert usage["promptTokenCount"] == (first.usage["promptTokenCount"] + second.usage["promptTokenCount"])
    answered = second.json["contents"][-1]["parts"]
    assert [p["functionResponse"]["name"] for p in answered] == ["context_read"]
    assert "item 7919" in answered[0]["functionResponse"]["response"]["output"]
    assert second.json["contents"][-2]["role"] == "model"  # the model's own turn, sent back as it came


def test_count_tokens_answers_for_what_the_turn_sends(gproxy: Any, upstream: MockUpstream) -> None:
    raw = post(gproxy, "countTokens", {"generateContentRequest": {"model": f"models/{MODEL}", **body()}})
    assert raw.status_code == 200, raw.text
    assert upstream.requests[-1].path == f"/v1beta/models/{MODEL}:countTokens"
    counted = raw.json()["totalTokens"]
    sent = post(gproxy, "generateContent", body())
    assert abs(counted - sent.json()["usageMetadata"]["promptTokenCount"]) <= 0.05 * counted + 300
    assert counted < 5000  # the offloaded log, not the whole one (about 30k tokens)


def test_the_key_in_the_query_makes_the_tenant_and_is_never_printed(gproxy: Any, upstream: MockUpstream,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    secret = "AIzaSECRETqueryKEY"
    a = gproxy.post(f"/v1beta/models/{MODEL}:generateContent?key={secret}", json=body("short"))
    b = gproxy.post(f"/v1beta/models/{MODEL}:generateContent", json=body("short"), headers={"x-goog-api-key": secret})
    c = gproxy.post(f"/v1beta/models/{MODEL}:generateContent?key=other", json=body("short"))
    assert a.status_code == b.status_code == c.status_code == 200
    assert upstream.requests[0].query == f"key={secret}"  # the client's own key reaches its provider
    assert a.headers["x-ctxproxy-session"] == b.headers["x-ctxproxy-session"] != c.headers["x-ctxproxy-session"]
    sessions = gproxy.get("/ctx/v1/sessions").text
    assert secret not in caplog.text and secret not in sessions


def test_the_window_is_learned_from_googles_wording(gproxy: Any, upstream: MockUpstream) -> None:
    upstream.windows[MODEL] = 6000
    talk = [{"role": role, "parts": [{"text": f"turn {i}: " + "a few words of the conversation " * 60}]}
            for i in range(24) for role in ("user", "model")]
    r = post(gproxy, "generateContent", {**body("short"), "contents": [*talk, *turn("short")]})
    assert r.status_code == 200, r.text
    assert int(r.headers["x-ctxproxy-window-learned"]) < 6000
    assert upstream.requests[0].status == 400 and upstream.requests[-1].status == 200  # (a summary call between)


def test_the_same_history_is_sent_as_the_same_bytes(gproxy: Any, upstream: MockUpstream) -> None:
    for _ in range(2):
        assert post(gproxy, "generateContent", body()).status_code == 200
    first, second = upstream.requests[-2:]
    assert first.body == second.body
    assert (second.usage or {}).get("cachedContentTokenCount", 0) > 0


def test_the_model_listing_passes_through(gproxy: Any, upstream: MockUpstream) -> None:
    r = gproxy.get("/v1beta/models", headers={"x-goog-api-key": KEY})
    assert r.status_code == 200 and any(MODEL in m["name"] for m in r.json()["models"])


# --------------------------------------------------------------------------- the real Gemini CLI

def test_gemini_cli_through_the_proxy_finishes_where_it_died(upstream: MockUpstream, make_proxy: Any,
                                                             tmp_path: Path) -> None:
    """The baseline of tests/test_mock_gemini.py (dies at its third request at 32k), through the proxy."""
    require_gemini()
    upstream.windows[GEMINI_MODEL] = WINDOW
    calls, final = 14, "All done: the listing ran as asked."
    a = ShellAgent("seq -f 'call {n} line %g' 1 2100", calls, final)
    upstream.default_reply = a
    p = make_proxy(real=True, upstream_url=root(upstream) + "/v1beta",
                   models={GEMINI_MODEL: {"context_window": WINDOW}})
    r = run_gemini(p.url, tmp_path / "work")
    assert r.returncode == 0 and final in r.stdout, r.output[-3000:]
    assert a.made == calls and a.tools_seen == ["run_shell_command"] * calls
    assert not [x for x in upstream.requests if x.status and x.status >= 400]
    last = upstream.requests[-1].json
    assert tool_names(last)[-1] == "context_read" and HANDLE.search(json.dumps(last))
    totals = p.get("/ctx/v1/stats").json()["totals"]["all"]
    assert totals["offloads"] + totals["compactions"] >= calls - 1, totals


# --------------------------------------------------------------------------- hostile answers around hidden rounds

def _gemini_answer(parts: list[dict[str, Any]], finish: bool = True) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = "STOP"
    return {"candidates": [candidate], "usageMetadata": {"promptTokenCount": 10, "totalTokenCount": 10}}


READ = {"functionCall": {"name": "context_read", "args": {"handle": "ctx_00000000000000000000"}}}


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)


def test_a_call_nested_past_the_safe_depth_is_answered_and_never_written_back(gproxy: Any,
                                                                               upstream: MockUpstream) -> None:
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    call = {"functionCall": {"name": "context_read", "args": {"handle": "ctx_0", "deep": deep}}}
    upstream.fail_next(200, json.dumps(_gemini_answer([call])))
    r = post(gproxy, "generateContent", body("short"))
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 2 and b"[[[[" not in upstream.requests[1].body
    assert "context_read" not in r.text


def test_a_route_that_injects_the_operators_key_forwards_no_client_key(make_proxy: Any, upstream: MockUpstream,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """api_key_env: the operator's key goes upstream as x-goog-api-key, in place of the client's header and of a
    `?key=` in the URL alike (the query's other parameters kept)."""
    monkeypatch.setenv("GEMINI_OPERATOR_KEY", "op-key")  # read from the environment as the request is sent
    p = make_proxy(upstream_url=root(upstream) + "/v1beta",
                   upstream={"api": "google", "api_key_env": "GEMINI_OPERATOR_KEY"})
    r = p.post(f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse&key=client-key", json=body("short"),
               headers={"host": "127.0.0.1"})
    assert r.status_code == 200, r.text
    sent = upstream.requests[-1]
    assert sent.query == "alt=sse" and sent.headers["x-goog-api-key"] == "op-key"
