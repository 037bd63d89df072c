"""The mock upstream's Gemini API, checked with Google's own clients (no proxy involved).

(a) The official Python SDK (google-genai, pinned in pyproject.toml's test extra) against the mock:
generateContent, streaming, countTokens, implicit caching on a repeated prefix, the over-window 400
and the other refusals, the model listing; every response object and stream chunk validated against
the SDK's types (which forbid unknown fields). Rules: tests/_mock_gemini_prompt.py; wire shapes:
tests/_mock_gemini_wire.py.

(b) The real Gemini CLI (pinned in tests/agents/package.json), run headless by run_gemini
(tests/agent_runs.py) straight to the mock, played by the ShellAgent (tests/_mock_agent.py) with the
CLI's own `run_shell_command`: at a 32k window a session of ~35 KB listings dies on the provider's
over-window 400 (the baseline a proxy has to fix); at the default window a short session completes
and the mock sees what tests/data/gemini_cli_request.json recorded. Without the binary those tests
skip with the install command; under CI=true they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import _mock_gemini_prompt as gp
import _mock_gemini_wire as gw
import httpx
import pytest
from _mock_agent import ShellAgent, last_user_texts, tool_names
from agent_runs import GEMINI_API_KEY, GEMINI_BIN, GEMINI_MODEL, run_gemini
from google import genai
from google.genai import errors, types
from mock_upstream import MockUpstream, tokens

MODEL = "gemini-2.5-pro"
THREE = "gemini-3-pro-preview"  # a model that enforces thought signatures
KEY = "gk-test"
INSTALL = "npm ci --prefix tests/agents"
RECORDED = Path(__file__).parent / "data" / "gemini_cli_request.json"
WINDOW = 32_000
CALLS = 14
COMMAND = "seq -f 'call {n} line %g' 1 2100"  # ~35 KB a call: under the CLI's 40,000-character cut of shell output
FINAL = "All done: the listing ran as asked."


def root(upstream: MockUpstream) -> str:
    return upstream.base_url.removesuffix("/v1")


def client(upstream: MockUpstream, key: str = KEY, version: str | None = "v1beta") -> genai.Client:
    options = types.HttpOptions(base_url=root(upstream), api_version=version,
                                retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=key, http_options=options)


def raw(upstream: MockUpstream, path: str, body: Any = None, *, key: str | None = KEY, method: str = "POST",
        content: bytes | None = None) -> httpx.Response:
    headers = {"x-goog-api-key": key} if key else {}
    return httpx.request(method, root(upstream) + path, json=body, content=content, headers=headers, timeout=10)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def call(name: str, args: dict[str, Any], signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": args}}
    if signature is not None:
        part["thoughtSignature"] = signature
    return {"role": "model", "parts": [part]}


def answer(name: str, output: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"functionResponse": {"name": name, "response": {"output": output}}}]}


def long_text(n_words: int, salt: str = "") -> str:
    return " ".join(f"{salt}word{i} is number {i}." for i in range(n_words))


def sse_chunks(text: str) -> list[dict[str, Any]]:
    """The JSON of each `data: <json>\\r\\n\\r\\n` event; fails on any other framing."""
    assert text.endswith("\r\n\r\n"), text[-40:]
    frames = text[:-4].split("\r\n\r\n")
    assert all(f.startswith("data: ") and "\n" not in f for f in frames), frames
    return [json.loads(f[len("data: "):]) for f in frames]


def error_of(r: httpx.Response) -> tuple[int, str, str]:
    e = r.json()["error"]
    assert set(e) == {"code", "message", "status"} and e["code"] == r.status_code
    return r.status_code, e["status"], e["message"]


# --------------------------------------------------------------------------- (a) the contract, through the SDK

def test_generate_content_answers_a_valid_response(upstream: MockUpstream) -> None:
    upstream.script("Hello there, friend.")
    c = client(upstream)
    r = c.models.generate_content(model=MODEL, contents="hi",
                                  config=types.GenerateContentConfig(system_instruction="Be brief."))
    assert r.text == "Hello there, friend." and r.candidates and r.candidates[0].finish_reason == "STOP"
    assert r.model_version == MODEL and r.response_id
    rec = upstream.requests[-1]
    assert (rec.method, rec.path, rec.query, rec.status) == ("POST", f"/v1beta/models/{MODEL}:generateContent", "",
                                                             200)
    assert rec.headers["x-goog-api-key"] == KEY and rec.json["contents"] == [user("hi")]
    body = json.loads(rec.answer or b"")
    types.GenerateContentResponse.model_validate(body)  # every field one the SDK knows
    assert body["candidates"][0] == {"content": {"parts": [{"text": "Hello there, friend."}], "role": "model"},
                                     "finishReason": "STOP", "index": 0}
    assert (rec.answer or b"").startswith(b'{\n  "candidates": [')  # pretty-printed, as Google sends JSON
    prompt = gp.prompt_tokens(rec.json)
    assert prompt == len(tokens("<|system|>\nBe brief.\n")) + len(tokens("<|user|>\nhi\n"))
    u = r.usage_metadata
    assert u and (u.prompt_token_count, u.candidates_token_count, u.total_token_count) == (
        prompt, len(tokens("Hello there, friend.")), prompt + len(tokens("Hello there, friend.")))
    assert u.cached_content_token_count is None and "cachedContentTokenCount" not in body["usageMetadata"]
    assert rec.usage == dict(body["usageMetadata"], cachedContentTokenCount=0)
    assert c.models.generate_content(model=MODEL, contents="hi").text == "ok"  # the script is empty: default reply


def test_the_python_sdk_default_version_v1_is_served_too(upstream: MockUpstream) -> None:
    """google-genai 3.x calls /v1/models/{model}:method by default; the CLI calls /v1beta/."""
    c = client(upstream, version=None)  # kept: a Client closes its connection pool when collected
    r = c.models.generate_content(model=MODEL, contents="hi")
    assert r.text == "ok" and upstream.requests[-1].path == f"/v1/models/{MODEL}:generateContent"
    assert raw(upstream, "/v1/models", method="GET").json()["object"] == "list"  # still the OpenAI listing


def test_a_stream_is_framed_as_google_frames_it(upstream: MockUpstream) -> None:
    text = "one two three four five six seven eight nine ten"
    upstream.script(text)
    r = raw(upstream, f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", {"contents": [user("count")]})
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    chunks = sse_chunks(r.text)
    assert r.text.startswith('data: {"candidates": [{"content": {"parts": [{"text": "one two three four"}],'
                             '"role": "model"}}],"usageMetadata": {"promptTokenCount": ')  # Google's JSON style
    for chunk in chunks:
        types.GenerateContentResponse.model_validate(chunk)
    assert len(chunks) == 3 and "".join(ch["candidates"][0]["content"]["parts"][0]["text"] for ch in chunks) == text
    prompt = gp.prompt_tokens({"contents": [user("count")]})
    for ch in chunks[:-1]:  # every chunk has usageMetadata; before the last, the prompt's figures only
        assert "finishReason" not in ch["candidates"][0]
        assert ch["usageMetadata"] == {"promptTokenCount": prompt, "totalTokenCount": prompt,
                                       "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}]}
    last = chunks[-1]
    assert last["candidates"][0]["finishReason"] == "STOP"
    assert last["usageMetadata"]["candidatesTokenCount"] == len(tokens(text))
    assert last["usageMetadata"]["totalTokenCount"] == prompt + len(tokens(text))
    assert {(ch["modelVersion"], ch["responseId"]) for ch in chunks} == {(MODEL, chunks[0]["responseId"])}
    rec = upstream.requests[-1]
    assert (rec.path, rec.query, rec.usage) == (f"/v1beta/models/{MODEL}:streamGenerateContent", "alt=sse",
                                                dict(last["usageMetadata"], cachedContentTokenCount=0))


def test_the_sdk_streams_text_and_function_calls(upstream: MockUpstream) -> None:
    c = client(upstream)
    upstream.script("Reading it now, one moment please.",
                    {"content": "Two at once.", "tool_calls": [{"name": "run_shell_command",
                                                                "arguments": {"command": "ls"}},
                                                               {"name": "read_file", "arguments": {"path": "a"}}]})
    chunks = list(c.models.generate_content_stream(model=MODEL, contents="go"))
    assert len(chunks) > 1 and "".join(ch.text or "" for ch in chunks) == "Reading it now, one moment please."
    assert [ch.usage_metadata.candidates_token_count for ch in chunks if ch.usage_metadata][-1] == len(
        tokens("Reading it now, one moment please."))
    chunks = list(c.models.generate_content_stream(model=MODEL, contents="go"))
    parts = [p for ch in chunks for cand in ch.candidates or [] for p in (cand.content.parts or [])]
    calls = [p for p in parts if p.function_call]
    assert [(p.function_call.name, p.function_call.args) for p in calls] == [
        ("run_shell_command", {"command": "ls"}), ("read_file", {"path": "a"})]
    assert calls[0].thought_signature and calls[1].thought_signature is None  # only the first call is signed
    assert "".join(p.text or "" for p in parts if p.text) == "Two at once."
    last = chunks[-1].candidates[0]
    assert last.finish_reason == "STOP" and last.content.parts == calls  # the calls come whole, in the last chunk


def test_a_function_call_answer_in_one_response(upstream: MockUpstream) -> None:
    upstream.script({"tool_calls": [{"name": "run_shell_command", "arguments": {"command": "ls", "description": "d"}}],
                     "thinking": "I should list the files."})
    body = {"contents": [user("list")], "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}
    r = raw(upstream, f"/v1beta/models/{MODEL}:generateContent", body)
    parts = r.json()["candidates"][0]["content"]["parts"]
    assert parts[0] == {"text": "I should list the files.", "thought": True}
    assert parts[1]["functionCall"] == {"name": "run_shell_command", "args": {"command": "ls", "description": "d"}}
    assert isinstance(parts[1]["thoughtSignature"], str) and len(parts) == 2
    types.GenerateContentResponse.model_validate(r.json())
    u = r.json()["usageMetadata"]
    assert u["thoughtsTokenCount"] == len(tokens("I should list the files."))
    assert u["totalTokenCount"] == u["promptTokenCount"] + u["candidatesTokenCount"] + u["thoughtsTokenCount"]


def test_a_gemini_3_text_answer_ends_with_a_signed_empty_part(upstream: MockUpstream) -> None:
    upstream.script("Done.")
    r = raw(upstream, f"/v1beta/models/{THREE}:streamGenerateContent?alt=sse", {"contents": [user("hi")]})
    chunks = sse_chunks(r.text)
    assert chunks[-1]["candidates"][0]["content"]["parts"] == [
        {"text": "", "thoughtSignature": chunks[-1]["candidates"][0]["content"]["parts"][0]["thoughtSignature"]}]
    assert chunks[0]["candidates"][0]["content"]["parts"] == [{"text": "Done."}]


def test_rendering_rules() -> None:
    """Part by part; ids and thought signatures are not prompt text; a response's fields one per line."""
    decl = {"name": "f", "description": "d", "parametersJsonSchema": {"type": "object"}}
    body = {"systemInstruction": {"role": "user", "parts": [{"text": "s1"}, {"text": "s2"}]},
            "tools": [{"functionDeclarations": [decl]}, {"googleSearch": {}}],
            "contents": [user("q"),
                         {"role": "model", "parts": [
                             {"text": "hm", "thought": True},
                             {"functionCall": {"id": "c1", "name": "f", "args": {"b": 1, "a": 2}},
                              "thoughtSignature": "c2ln"}]},
                         {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "f", "response": {
                             "output": "line 1\nline 2", "exit": 0}}}]},
                         {"parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}]}
    assert gp.prompt_chunks(body) == [tokens(t) for t in (
        "<|system|>\ns1\n", "s2\n", f"<|tool|>{json.dumps(decl, sort_keys=True)}\n", '<|tool|>{"googleSearch": {}}\n',
        "<|user|>\nq\n", "<|model|>\n<thought>hm\n", '<function_call>f({"a": 2, "b": 1})\n',
        "<|user|>\n<function_response>f\nexit: 0\noutput: line 1\nline 2\n", "<|user|>\n[image/png]\n")]
    unsigned = json.loads(json.dumps(body))
    del unsigned["contents"][1]["parts"][1]["thoughtSignature"]
    assert gp.prompt_token_ids(unsigned) == gp.prompt_token_ids(body)
    snake = {"system_instruction": body["systemInstruction"], "tools": [{"function_declarations": [decl]}],
             "contents": [user("q")]}
    camel = {"systemInstruction": body["systemInstruction"], "tools": [{"functionDeclarations": [decl]}],
             "contents": [user("q")]}
    assert gp.prompt_chunks(snake) == gp.prompt_chunks(camel)  # proto JSON takes either spelling
    assert (gp.min_cacheable_tokens("gemini-2.5-flash"), gp.min_cacheable_tokens("gemini-3.1-pro-preview"),
            gp.min_cacheable_tokens("gemma-3")) == (2048, 4096, 1024)


def test_count_tokens_counts_what_generate_content_bills(upstream: MockUpstream) -> None:
    c = client(upstream)
    counted = c.models.count_tokens(model=MODEL, contents="How many tokens is this?")
    billed = c.models.generate_content(model=MODEL, contents="How many tokens is this?").usage_metadata
    assert billed and counted.total_tokens == billed.prompt_token_count
    rec = upstream.requests[0]
    assert (rec.path, rec.json) == (f"/v1beta/models/{MODEL}:countTokens",
                                    {"contents": [user("How many tokens is this?")]})
    inner = {"model": f"models/{MODEL}", "contents": [user("hi")], "systemInstruction": {"parts": [{"text": "S"}]},
             "tools": [{"functionDeclarations": [{"name": "f", "description": "d"}]}]}
    r = raw(upstream, f"/v1beta/models/{MODEL}:countTokens", {"generateContentRequest": inner})
    assert r.json() == {"totalTokens": gp.prompt_tokens(inner),
                        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": gp.prompt_tokens(inner)}]}
    assert gp.prompt_tokens(inner) > gp.prompt_tokens({"contents": inner["contents"]})
    assert len(upstream.requests) == 3 and upstream.requests[-1].usage is None  # nothing cached, no reply taken


def test_a_repeated_prefix_is_reported_as_cached(upstream: MockUpstream) -> None:
    c = client(upstream)
    system = types.GenerateContentConfig(system_instruction=long_text(600))  # well over Gemini 2.5's 2,048
    first = c.models.generate_content(model=MODEL, contents="first question", config=system).usage_metadata
    assert first and first.cached_content_token_count is None
    second = c.models.generate_content(model=MODEL, contents="second question", config=system).usage_metadata
    a, b = (gp.prompt_token_ids(r.json) for r in upstream.requests[-2:])
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert second and second.prompt_token_count == len(b) and second.cached_content_token_count == common
    assert common > gp.min_cacheable_tokens(MODEL) == 2048
    assert second.cache_tokens_details and second.cache_tokens_details[0].token_count == common
    assert upstream.requests[-1].usage["cachedContentTokenCount"] == common
    other = client(upstream, key="another-key")
    other_key = other.models.generate_content(model=MODEL, contents="second question", config=system).usage_metadata
    assert other_key and other_key.cached_content_token_count is None  # the cache is per API key (and model)
    upstream.report_cached = False  # the figure is kept on the record, left out of the answer
    hidden = c.models.generate_content(model=MODEL, contents="third question", config=system).usage_metadata
    assert hidden and hidden.cached_content_token_count is None and upstream.requests[-1].usage[
        "cachedContentTokenCount"] >= common
    short = types.GenerateContentConfig(system_instruction=long_text(200))  # a prefix under the minimum
    c.models.generate_content(model=MODEL, contents="x", config=short)
    again = c.models.generate_content(model=MODEL, contents="y", config=short).usage_metadata
    assert again and again.cached_content_token_count is None and again.prompt_token_count > 1024


def test_a_prompt_over_the_window_is_refused_as_google_words_it(upstream: MockUpstream) -> None:
    upstream.windows["gemini-2.5-flash"] = 100
    contents = long_text(40)
    prompt = gp.prompt_tokens({"contents": [user(contents)]})
    c = client(upstream)
    with pytest.raises(errors.ClientError) as e:
        c.models.generate_content(model="gemini-2.5-flash", contents=contents)
    assert (e.value.code, e.value.status) == (400, "INVALID_ARGUMENT") and prompt > 100
    assert e.value.message == f"The input token count ({prompt}) exceeds the maximum number of tokens allowed (100)."
    assert upstream.window_for(MODEL) == upstream.default_window  # gemini names get the default window
    r = raw(upstream, "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", {"contents": [user(contents)]})
    assert error_of(r) == (400, "INVALID_ARGUMENT", e.value.message)  # a stream is refused before it starts


def test_the_key_comes_in_a_header_or_the_query(upstream: MockUpstream) -> None:
    path = f"/v1beta/models/{MODEL}:generateContent"
    r = raw(upstream, path, {"contents": [user("hi")]}, key=None)
    assert error_of(r) == (403, "PERMISSION_DENIED", gw.NO_KEY)
    r = raw(upstream, path + "?key=from-the-query", {"contents": [user("hi")]}, key=None)
    assert r.status_code == 200 and upstream.requests[-1].query == "key=from-the-query"
    assert error_of(raw(upstream, "/v1beta/models", key=None, method="GET"))[0] == 403


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "Invalid JSON payload received. Unexpected token.\n{not json\n^"),
    ([], 'Invalid JSON payload received. Unknown name "": Root element must be a message.'),
    ({}, "* GenerateContentRequest.contents: contents is not specified\n"),
    ({"contents": [user("hi")], "stream": True}, 'Invalid JSON payload received. Unknown name "stream": Cannot find '
                                                  "field."),
    ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "Please use a valid role: user, model."),
    ({"contents": [{"role": "user", "parts": []}]},
     "* GenerateContentRequest.contents[0].parts: contents.parts must not be empty.\n"),
    ({"contents": [{"role": "user", "parts": [{"thought": True}]}]},
     "* GenerateContentRequest.contents[0].parts[0].data: required oneof field 'data' must have one initialized "
     "field\n"),
    ({"contents": [user("a"), call("f", {}), {"role": "user", "parts": [
        {"functionResponse": {"name": "f", "response": {}}}, {"functionResponse": {"name": "f", "response": {}}}]}]},
     "Please ensure that the number of function response parts is equal to the number of function call parts of "
     "the function call turn."),
    ({"contents": [call("f", {}), call("f", {})]},
     "Please ensure that function call turn comes immediately after a user turn or after a function response turn."),
])
def test_malformed_bodies_are_400_invalid_argument(upstream: MockUpstream, body: Any, message: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = raw(upstream, f"/v1beta/models/{MODEL}:generateContent", content=content)
    assert error_of(r) == (400, "INVALID_ARGUMENT", message)
    assert upstream.requests[-1].body == content and upstream.requests[-1].answer == r.content


def test_gemini_3_refuses_a_current_turn_call_without_its_signature(upstream: MockUpstream) -> None:
    path = f"/v1beta/models/{THREE}:generateContent"
    unsigned = [user("list"), call("run_shell_command", {"command": "ls"}), answer("run_shell_command", "a b")]
    r = raw(upstream, path, {"contents": unsigned})
    assert error_of(r) == (400, "INVALID_ARGUMENT", (
        "Function call is missing a thought_signature in functionCall parts. This is required for tools to work "
        "correctly, and missing thought_signature may lead to degraded model performance. Additional data, function "
        "call `default_api:run_shell_command` , position 2. Please refer to "
        "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."))
    c = client(upstream)
    with pytest.raises(errors.ClientError) as e:  # the SDK sees the same 400
        c.models.generate_content(model=THREE, contents=unsigned)
    assert e.value.code == 400 and "position 2" in (e.value.message or "")
    # the one the API gave back, or the documented sentinel, passes; so does an unsigned call of an earlier turn
    upstream.script({"tool_calls": [{"name": "run_shell_command", "arguments": {"command": "ls"}}]})
    signed = raw(upstream, path, {"contents": [user("list")]}).json()["candidates"][0]["content"]["parts"][0]
    ok = [user("list"), {"role": "model", "parts": [signed]}, answer("run_shell_command", "a b")]
    assert raw(upstream, path, {"contents": ok}).status_code == 200
    sentinel = [user("list"), call("run_shell_command", {"command": "ls"}, gp.SKIP_SIGNATURE),
                answer("run_shell_command", "a b")]
    assert raw(upstream, path, {"contents": sentinel}).status_code == 200
    earlier = [*unsigned, {"role": "model", "parts": [{"text": "Listed."}]}, user("now again")]
    assert raw(upstream, path, {"contents": earlier}).status_code == 200
    later = [*earlier, call("run_shell_command", {"command": "ls"}), answer("run_shell_command", "a b")]
    assert "position 6" in error_of(raw(upstream, path, {"contents": later}))[2]
    assert raw(upstream, f"/v1beta/models/{MODEL}:generateContent", {"contents": unsigned}).status_code == 200


def test_models_are_listed_with_the_mock_window(upstream: MockUpstream) -> None:
    upstream.windows["gemini-2.5-pro"] = 32_000
    c = client(upstream)
    m = c.models.get(model=MODEL)
    assert (m.name, m.input_token_limit) == (f"models/{MODEL}", 32_000)
    names = [x.name for x in c.models.list()]
    assert f"models/{MODEL}" in names and "models/gemini-2.5-flash" in names
    r = raw(upstream, "/v1beta/models/gpt-4o:generateContent", {"contents": [user("hi")]})
    assert error_of(r)[:2] == (404, "NOT_FOUND")


def test_the_json_array_stream_without_alt_sse(upstream: MockUpstream) -> None:
    upstream.script("alpha beta gamma delta epsilon")
    r = raw(upstream, f"/v1beta/models/{MODEL}:streamGenerateContent", {"contents": [user("hi")]})
    chunks = r.json()
    assert isinstance(chunks, list) and len(chunks) == 2 and chunks[-1]["candidates"][0]["finishReason"] == "STOP"


# --------------------------------------------------------------------------- the ShellAgent as Gemini CLI's model

def gemini_turn(*contents: dict[str, Any]) -> dict[str, Any]:
    decls = [{"name": "read_file", "parametersJsonSchema": {"type": "object"}},
             {"name": "run_shell_command", "parametersJsonSchema": {"type": "object"}}]
    return {"systemInstruction": {"parts": [{"text": "You are a CLI agent."}]}, "tools": [{"functionDeclarations":
                                                                                          decls}],
            "contents": [user("Print the long listing, then report."), *contents]}


def test_the_shell_agent_plays_gemini_cli(upstream: MockUpstream) -> None:
    a = ShellAgent("seq 1 {n}", calls=2, final="done")
    first = gemini_turn()
    assert tool_names(first) == ["read_file", "run_shell_command"]
    assert last_user_texts(first) == ["Print the long listing, then report."]
    assert a(first) == {"tool_calls": [{"name": "run_shell_command",
                                        "arguments": {"command": "seq 1 1", "description": "Print a long listing"}}]}
    later = gemini_turn(call("run_shell_command", {"command": "seq 1 1"}, "sig"), answer("run_shell_command", "1"))
    assert last_user_texts(later) == []  # a functionResponse carries no instruction
    assert a(later)["tool_calls"][0]["arguments"]["command"] == "seq 1 2"
    assert a(later) == "done" and a.tools_seen == ["run_shell_command"] * 2
    summary = a({"systemInstruction": {"parts": [{"text": "Summarize under ## Goal"}]}, "contents": [user("go")]})
    assert isinstance(summary, str) and summary.startswith("## Goal") and a.summaries == 1
    upstream.default_reply = ShellAgent("ls", calls=1, final="done")
    r = raw(upstream, f"/v1beta/models/{MODEL}:generateContent", gemini_turn())
    part = r.json()["candidates"][0]["content"]["parts"][0]
    assert part["functionCall"] == {"name": "run_shell_command",
                                    "args": {"command": "ls", "description": "Print a long listing"}}
    again = gemini_turn({"role": "model", "parts": [part]}, answer("run_shell_command", "a"))
    r = raw(upstream, f"/v1beta/models/{MODEL}:generateContent", again)
    assert r.json()["candidates"][0]["content"]["parts"] == [{"text": "done"}]


# --------------------------------------------------------------------------- (b) the real Gemini CLI

def require_gemini() -> None:
    if not os.access(GEMINI_BIN, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{GEMINI_BIN} is missing; install the real agents: {INSTALL} (.ci/run does)", pytrace=False)
        pytest.skip(f"gemini is not installed; to run the real Gemini CLI tests: {INSTALL}")


def rejected(upstream: MockUpstream) -> list[tuple[int | None, bytes | None]]:
    return [(r.status, r.answer) for r in upstream.requests if r.status is None or r.status >= 400]


def tail(text: str, n: int = 3000) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("call "))[-n:]


def test_the_pinned_gemini_cli_runs_offline(tmp_path: Path) -> None:
    require_gemini()
    pin = json.loads((Path(__file__).parent / "agents" / "package.json").read_text())["dependencies"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "GEMINI_CLI_NO_RELAUNCH": "true"}
    p = subprocess.run([str(GEMINI_BIN), "--version"], env=env, capture_output=True, text=True, timeout=30)
    assert p.stdout.strip() == pin["@google/gemini-cli"], p.stdout + p.stderr


def test_gemini_cli_alone_overflows_the_window(upstream: MockUpstream, tmp_path: Path) -> None:
    """The baseline: at a 32k window the CLI's session of ~35 KB listings dies on the provider's 400."""
    require_gemini()
    upstream.windows[GEMINI_MODEL] = WINDOW
    a = ShellAgent(COMMAND, CALLS, FINAL)
    upstream.default_reply = a
    r = run_gemini(root(upstream), tmp_path / "work")
    assert r.returncode != 0, tail(r.output)
    assert "exceeds the maximum number of tokens allowed (32000)" in r.output, tail(r.output)
    refused = rejected(upstream)
    assert len(refused) == 1 and refused[0][0] == 400 and b"The input token count (" in (refused[0][1] or b"")
    assert 0 < a.made < CALLS and a.tools_seen == ["run_shell_command"] * a.made
    assert FINAL not in r.stdout


def test_gemini_cli_finishes_a_short_session_as_recorded(upstream: MockUpstream, tmp_path: Path) -> None:
    """At the default window 3 small calls complete; every request is the recorded one's shape."""
    require_gemini()
    a = ShellAgent("seq -f 'call {n} line %g' 1 50", 3, FINAL)
    upstream.default_reply = a
    r = run_gemini(root(upstream), tmp_path / "work")
    assert r.returncode == 0 and FINAL in r.stdout, tail(r.output)
    assert a.made == 3 and not rejected(upstream)
    recorded = json.loads(RECORDED.read_text())
    for rec in upstream.requests:
        assert (rec.method, rec.path, rec.query) == (recorded["method"], recorded["path"], recorded["query"])
        assert set(rec.headers) == set(recorded["headers"]) and rec.headers["x-goog-api-key"] == GEMINI_API_KEY
        assert rec.headers["user-agent"] == recorded["headers"]["user-agent"]
        assert list(rec.json) == list(recorded["body"]) and tool_names(rec.json) == tool_names(recorded["body"])
        shell = [d for t in rec.json["tools"] for d in t["functionDeclarations"] if d["name"] == "run_shell_command"]
        assert shell == [d for t in recorded["body"]["tools"] for d in t["functionDeclarations"]
                         if d["name"] == "run_shell_command"]
        assert rec.json["generationConfig"] == recorded["body"]["generationConfig"]
    last = upstream.requests[-1].json["contents"]
    assert [c["role"] for c in last] == ["user"] + ["model", "user"] * 3
    for n, (asked, answered) in enumerate(zip(last[1::2], last[2::2]), 1):
        fc, = asked["parts"]
        assert fc["functionCall"]["args"] == {"command": f"seq -f 'call {n} line %g' 1 50",
                                              "description": "Print a long listing"}
        assert fc["thoughtSignature"] not in ("", gp.SKIP_SIGNATURE)  # the mock's own, echoed back
        fr, = answered["parts"]
        assert set(fr["functionResponse"]) == {"id", "name", "response"}
        assert fr["functionResponse"]["id"] == fc["functionCall"]["id"]  # the CLI's own id, on both
        assert fr["functionResponse"]["name"] == "run_shell_command"
        output = fr["functionResponse"]["response"]["output"]
        assert output.startswith(f"<untrusted_context>\nOutput: call {n} line 1\n") and f"call {n} line 50\n" in output


def test_gemini_cli_meets_gemini_3_signature_rule(upstream: MockUpstream, tmp_path: Path) -> None:
    """A Gemini 3 model enforces signatures: the CLI echoes every one, so the session completes."""
    require_gemini()
    a = ShellAgent("seq 1 {n}", 2, FINAL)
    upstream.default_reply = a
    r = run_gemini(root(upstream), tmp_path / "work", model=THREE)
    assert r.returncode == 0 and FINAL in r.stdout, tail(r.output)
    assert a.made == 2 and not rejected(upstream)
    assert all(gp.signatures_required(rec.path.split("/")[-1].split(":")[0]) for rec in upstream.requests)
