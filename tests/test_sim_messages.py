"""The simulator's Anthropic Messages API (proxy/replay/sim_messages*.py) and Messages traces.

The figures are checked against the rules the simulator documents, written
again here without importing it: the block-by-block rendering, and
Anthropic's caching at ``cache_control`` breakpoints (writes at each
breakpoint of at least 1,024 tokens, reads of the longest written prefix
ending at a breakpoint or up to 20 blocks before one).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from proxy.replay import traces_messages as tm
from proxy.replay.sim_messages_validation import NON_EMPTY
from proxy.replay.simulator import Simulator
from proxy.replay.threaded_server import ThreadedServer
from proxy.replay.traces import as_messages, example_paths, load_trace
from proxy.rewrite.compress import summarizer
from proxy.tokens.encodings import ensure_encodings, get_encoding

DATA = Path(__file__).resolve().parent / "data"
CLAUDE_CODE = DATA / "08_claude-code_claude-reliability_opus-4-5_python-to-rust-port.json"
CC = {"type": "ephemeral"}
HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-test"}


# --------------------------------------------------------------------------- the independent reference

def _enc():
    ensure_encodings()
    return get_encoding("o200k_base")


def _nested(content):
    if isinstance(content, str):
        return content
    out = []
    for b in content or []:
        if b.get("type") == "text":
            out.append(b["text"])
        elif b.get("type") == "image":
            out.append("[image]")
        else:
            out.append(json.dumps({k: v for k, v in b.items() if k != "cache_control"}, sort_keys=True))
    return "\n".join(out)


def _render(role, b):
    if isinstance(b, str) or b["type"] == "text":
        return f"<|{role}|>\n{b if isinstance(b, str) else b['text']}<|end|>\n"
    kind = b["type"]
    if kind == "image":
        return f"<|{role}|>\n[image]<|end|>\n"
    if kind == "tool_use":
        return f"<|assistant|>\n\n<tool_call id={b['id']}>{b['name']}({json.dumps(b['input'])})<|end|>\n"
    if kind == "tool_result":
        err = " is_error" if b.get("is_error") is True else ""
        return f"<|tool|>\n{_nested(b.get('content'))}\n<tool_call_id={b['tool_use_id']}>{err}<|end|>\n"
    if kind == "thinking":
        return f"<|thinking|>\n{b['thinking']}<|end|>\n"
    if kind == "redacted_thinking":
        return "<|thinking|>\n<redacted>" + " thinking" * (len(b["data"]) * 3 // 16) + "<|end|>\n"
    return f"<|{kind}|>\n{json.dumps({k: v for k, v in b.items() if k != 'cache_control'}, sort_keys=True)}<|end|>\n"


def reference_blocks(body):
    """[(tokens, has cache_control)] per block: tools, system, messages."""
    enc = _enc()
    out = [(len(enc.encode_ordinary("<|tool|>" + json.dumps({k: v for k, v in t.items() if k != "cache_control"}))),
            "cache_control" in t) for t in body.get("tools") or []]
    system = body.get("system")
    for b in ([{"type": "text", "text": system}] if isinstance(system, str) else system or []):
        out.append((len(enc.encode_ordinary(f"<|system|>\n{b['text']}<|end|>\n")), "cache_control" in b))
    for m in body["messages"]:
        content = [m["content"]] if isinstance(m["content"], str) else m["content"]
        for b in content:
            out.append((len(enc.encode_ordinary(_render(m["role"], b))), isinstance(b, dict) and "cache_control" in b))
    return out


class ReferenceCache:
    """Anthropic's rule, written again: prefixes (as block-token tuples) written at breakpoints >= 1,024."""

    def __init__(self):
        self.written = set()

    def bill(self, body):
        blocks = reference_blocks(body)
        # a prefix is identified by its rendered text, block by block (the simulator hashes tokens: the same thing)
        texts = []
        for t in body.get("tools") or []:
            texts.append("<|tool|>" + json.dumps({k: v for k, v in t.items() if k != "cache_control"}))
        system = body.get("system")
        texts += [f"<|system|>\n{b['text']}<|end|>\n" for b in
                  ([{"type": "text", "text": system}] if isinstance(system, str) else system or [])]
        for m in body["messages"]:
            content = [m["content"]] if isinstance(m["content"], str) else m["content"]
            texts += [_render(m["role"], b) for b in content]
        assert len(texts) == len(blocks)
        ends, pos = [], 0
        for n, _ in blocks:
            pos += n
            ends.append(pos)
        key = lambda j: tuple(texts[:j + 1])  # noqa: E731
        marks = [j for j, (_, bp) in enumerate(blocks) if bp]
        total = ends[-1] if ends else 0
        if not marks:
            return total, 0, 0
        read = max((ends[j] for m in marks for j in range(max(0, m - 20), m + 1) if key(j) in self.written),
                   default=0)
        created = ends[marks[-1]] - read if ends[marks[-1]] >= 1024 else 0
        self.written |= {key(j) for j in marks if ends[j] >= 1024}
        return total, read, created


def _u(usage):
    return usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"], \
        usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]


LONG = "You are Claude Code, a careful software engineering agent. Follow the repository's conventions. " * 60
TOOLS = [{"name": "Bash", "description": "Run a shell command", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]


def _turns(n: int) -> list[dict]:
    """A user prompt, then n tool-use rounds: 2 blocks each (a tool_use, its tool_result)."""
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Port the project to Rust."}]}]
    for k in range(n):
        msgs.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{k:02d}", "name": "Bash", "input": {"command": f"cargo test {k}"}}]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{k:02d}", "content": f"test result {k}: ok"}]})
    return msgs


def _mark_last(messages: list[dict]) -> list[dict]:
    last = messages[-1]
    return [*messages[:-1], {**last, "content": [*last["content"][:-1], {**last["content"][-1], "cache_control": CC}]}]


# --------------------------------------------------------------------------- tokens

def test_every_block_is_billed_as_documented():
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "tools": [{**TOOLS[0], "cache_control": CC}],
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": LONG, "cache_control": CC}],
            "messages": [
                {"role": "user", "content": "What is in src/?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Let me look at the tree first.", "signature": "EqQBCkYI" * 40},
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a" * 8},
                    {"type": "text", "text": "Listing it."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls src"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                     "content": [{"type": "text", "text": "ls: src: No such file"},
                                 {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                              "data": "iVBOR"}}]},
                    {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"},
                     "cache_control": CC}]}]}
    want = sum(n for n, _ in reference_blocks(body))
    sim = Simulator(window=100_000)
    assert sim.count_tokens(body) == (200, {"input_tokens": want})
    status, out = sim.messages(body, "k")
    assert status == 200 and _u(out["usage"])[0] == want
    assert sim.log[-1].prompt_tokens == want and sim.log[-1].kind == "turn"
    # the signature is not billed, nor is cache_control; the thinking text is
    other = json.loads(json.dumps(body))
    other["messages"][1]["content"][0]["signature"] = "x"
    del other["messages"][2]["content"][2]["cache_control"]
    assert sim.count_tokens(other)[1]["input_tokens"] == want
    other["messages"][1]["content"][0]["thinking"] += " And then the tests."
    assert sim.count_tokens(other)[1]["input_tokens"] > want
    assert out["content"] == [{"type": "text", "text": "ok"}] and out["stop_reason"] == "end_turn"
    assert out["id"].startswith("msg_sim")


# --------------------------------------------------------------------------- caching at breakpoints

def test_a_breakpoint_writes_then_reads_and_nothing_without_one():
    sim, ref = Simulator(window=100_000), ReferenceCache()
    base = {"model": "claude-sonnet-4-6", "max_tokens": 100, "tools": TOOLS,
            "system": [{"type": "text", "text": LONG, "cache_control": CC}]}
    first = {**base, "messages": _turns(1)}
    _, a = sim.messages(first, "key-a")
    total, read, created = ref.bill(first)
    assert _u(a["usage"]) == (total, 0, created) and created > 1024 and read == 0
    assert a["usage"]["input_tokens"] == total - created  # the messages after the system breakpoint
    assert a["usage"]["cache_creation"] == {"ephemeral_5m_input_tokens": created, "ephemeral_1h_input_tokens": 0}
    _, again = sim.messages(first, "key-a")
    assert _u(again["usage"]) == (total, created, 0) and ref.bill(first) == (total, created, 0)
    assert sim.log[-1].cached_tokens == created and sim.log[-1].cache_write == 0
    _, other_key = sim.messages(first, "key-b")  # another key, another cache
    assert _u(other_key["usage"]) == (total, 0, created)
    _, other_model = sim.messages({**first, "model": "claude-opus-4-5"}, "key-a")
    assert other_model["usage"]["cache_read_input_tokens"] == 0
    unmarked = {**first, "system": [{"type": "text", "text": LONG}]}  # the same prompt, no breakpoint
    _, none = sim.messages(unmarked, "key-a")
    assert _u(none["usage"]) == (total, 0, 0) and none["usage"]["input_tokens"] == total
    # the last message marked as Claude Code does: reads the system prefix, writes up to the end
    longer = {**base, "messages": _mark_last(_turns(2))}
    _, b = sim.messages(longer, "key-a")
    ref.written.clear()
    ref.bill(first)
    assert _u(b["usage"]) == ref.bill(longer)
    assert b["usage"]["cache_read_input_tokens"] == created and b["usage"]["input_tokens"] == 0


def test_reads_look_back_20_blocks_from_a_breakpoint_and_no_further():
    for extra, hit in ((0, True), (1, False)):  # 10 rounds of 2 blocks: 20 blocks back; one more block: 21
        sim, ref = Simulator(window=100_000), ReferenceCache()
        system = [{"type": "text", "text": LONG}]
        first = {"model": "m", "max_tokens": 10, "system": system, "messages": _mark_last(_turns(1))}
        _, a = sim.messages(first, "k")
        written = _u(a["usage"])[2]
        assert written == _u(a["usage"])[0] and ref.bill(first) == _u(a["usage"])
        messages = _turns(11)
        messages[-1]["content"] += [{"type": "text", "text": "keep going"}] * extra
        later = {**first, "messages": _mark_last(messages)}
        _, b = sim.messages(later, "k")
        assert _u(b["usage"]) == ref.bill(later)
        assert b["usage"]["cache_read_input_tokens"] == (written if hit else 0), extra
        # a second breakpoint within 20 blocks of the old one reaches it (a fresh scope: `later` wrote its own)
        sim.messages(first, "k2")
        both = {**later, "messages": list(later["messages"])}
        both["messages"][4] = _mark_last([both["messages"][4]])[0]
        _, c = sim.messages(both, "k2")
        ref2 = ReferenceCache()
        ref2.bill(first)
        assert c["usage"]["cache_read_input_tokens"] == written and _u(c["usage"]) == ref2.bill(both)


def test_nothing_under_1024_tokens_is_cached_and_at_most_4_breakpoints():
    sim = Simulator(window=100_000)
    short = {"model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "Be brief.", "cache_control": CC}],
             "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": CC}]}]}
    for _ in range(2):
        _, out = sim.messages(short, "k")
        assert out["usage"]["cache_read_input_tokens"] == 0 and out["usage"]["cache_creation_input_tokens"] == 0
    # a long enough prefix behind a short one: only the long breakpoint writes
    mixed = {**short, "messages": [{"role": "user", "content": [{"type": "text", "text": LONG, "cache_control": CC}]}]}
    _, out = sim.messages(mixed, "k")
    total = _u(out["usage"])[0]
    assert out["usage"]["cache_creation_input_tokens"] == total and out["usage"]["input_tokens"] == 0
    # a top-level cache_control (automatic caching) marks the last block; max_tokens 0 only warms the cache
    auto = {"model": "m", "max_tokens": 0, "cache_control": CC, "messages": [{"role": "user", "content": LONG}]}
    _, warm = sim.messages(auto, "k")
    assert warm["content"] == [] and warm["stop_reason"] == "max_tokens" and warm["usage"]["output_tokens"] == 0
    assert warm["usage"]["cache_creation_input_tokens"] == _u(warm["usage"])[0] > 1024
    _, hot = sim.messages({**auto, "max_tokens": 5}, "k")
    assert hot["usage"]["cache_read_input_tokens"] == _u(warm["usage"])[0]
    # cache_control on a block inside a tool_result marks the tool_result
    msgs = _turns(1)
    msgs[2] = {"role": "user", "content": [{**msgs[2]["content"][0], "content": [
        {"type": "text", "text": LONG, "cache_control": CC}]}]}
    _, nested = sim.messages({"model": "m", "max_tokens": 5, "messages": msgs}, "k")
    assert nested["usage"]["cache_creation_input_tokens"] == _u(nested["usage"])[0]
    five = {**mixed, "messages": [{"role": "user", "content": [
        {"type": "text", "text": f"part {k}", "cache_control": CC} for k in range(4)]}]}
    status, err = sim.messages(five, "k")
    assert status == 400 and err == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "A maximum of 4 blocks with cache_control may be provided. Found 5."}}


# --------------------------------------------------------------------------- errors

def test_the_window_and_the_required_fields_answer_as_anthropic_does():
    sim = Simulator(window=3000)
    body = {"model": "claude-sonnet-4-6", "max_tokens": 500, "messages": [
        {"role": "user", "content": [{"type": "text", "text": LONG[:7000], "cache_control": CC}]}]}
    prompt = sim.count_tokens(body)[1]["input_tokens"]
    assert 1024 < prompt < 2500
    status, err = sim.messages({**body, "max_tokens": 3000 - prompt + 1}, "k")
    assert status == 400 and err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"] == (f"input length and `max_tokens` exceed context limit: {prompt} + "
                                       f"{3000 - prompt + 1} > 3000, decrease input length or `max_tokens` and try "
                                       "again")
    big = {**body, "messages": [{"role": "user", "content": "x " * 4000}]}
    status, err = sim.messages(big, "k")
    n = sim.log[-1].prompt_tokens
    assert status == 400 and err["error"]["message"] == f"prompt is too long: {n} tokens > 3000 maximum" and n > 3000
    assert [r.error for r in sim.log] == ["context_length_exceeded"] * 2 and not any(r.billed for r in sim.log)
    # a rejected request wrote nothing to the cache
    _, ok = sim.messages(body, "k")
    assert ok["usage"]["cache_read_input_tokens"] == 0 and ok["usage"]["cache_creation_input_tokens"] == prompt
    status, err = sim.messages({"model": "m", "messages": body["messages"]}, "k")
    assert (status, err) == (400, {"type": "error", "error": {"type": "invalid_request_error",
                                                               "message": "max_tokens: Field required"}})
    assert sim.log[-1].kind == "invalid" and not sim.log[-1].billed


def test_tool_pairing_is_checked_with_anthropics_wording():
    sim = Simulator(window=100_000)
    msgs = _turns(2)
    body = {"model": "m", "max_tokens": 10, "messages": [*msgs[:4], {"role": "user", "content": "go on"}]}
    status, err = sim.messages(body, "k")
    assert status == 400 and err["error"]["message"] == (
        "messages.3: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message.")
    late = [*msgs[:2], {"role": "user", "content": [{"type": "text", "text": "wait"}, msgs[2]["content"][0]]}]
    assert "messages.1: `tool_use` ids were found" in sim.messages({**body, "messages": late}, "k")[1]["error"][
        "message"]  # tool results must open the next message
    orphan = [msgs[0], {"role": "assistant", "content": "thinking aloud"}, msgs[2]]
    assert sim.messages({**body, "messages": orphan}, "k")[1]["error"]["message"] == (
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_00. Each "
        "`tool_result` block must have a corresponding `tool_use` block in the previous message.")
    assert sim.messages({**body, "messages": msgs}, "k")[0] == 200
    # consecutive messages of one role are one turn, as the API combines them: results split over two messages
    parallel = [msgs[0], {"role": "assistant", "content": [msgs[1]["content"][0], msgs[3]["content"][0]]},
                msgs[2], msgs[4], {"role": "user", "content": "and now?"}]
    assert sim.messages({**body, "messages": parallel}, "k")[0] == 200
    assert sim.messages({**body, "messages": msgs[:4]}, "k")[0] == 200  # a final assistant turn: a prefill
    for bad, why in (([msgs[0], {"role": "assistant", "content": ""}, msgs[0]], f"messages.1: {NON_EMPTY}"),
                     ([{"role": "user", "content": [{"type": "text", "text": ""}]}],
                      "messages: text content blocks must be non-empty"),
                     ([msgs[0], {"role": "assistant", "content": "Sure, "}],
                      "messages: final assistant content cannot end with trailing whitespace"),
                     ([], "messages: at least one message is required")):
        assert sim.messages({**body, "messages": bad}, "k")[1]["error"]["message"] == why


# --------------------------------------------------------------------------- the proxy's own calls

SPAN = [
    {"role": "user", "content": [{"type": "text", "text": "Fix the failing test in src/app/models.py"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "I will run pytest first"},
                                      {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                       "input": {"command": "pytest"}}]},
]
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1",
          "content": "FAILED tests/test_models.py::test_save - KeyError: 'id'"}


def _headings(text: str) -> list[str]:
    return [line[3:] for line in text.splitlines() if line.startswith("## ")]


def test_the_summarizer_is_recognised_in_both_shapes():
    sim = Simulator(window=100_000)
    transcript = ("<transcript>\n### user\nFix the failing test in src/app/models.py\n\n### assistant\nI will run "
                  "pytest first\n\n### tool result (Bash)\nFAILED tests/test_models.py::test_save - KeyError\n"
                  "</transcript>")
    for system in (summarizer.SYSTEM_PROMPT, [{"type": "text", "text": summarizer.SYSTEM_PROMPT,
                                                "cache_control": CC}]):
        _, out = sim.messages({"model": "m", "max_tokens": 2000, "system": system,
                               "messages": [{"role": "user", "content": transcript}]})
        text = out["content"][0]["text"]
        assert _headings(text) == list(summarizer.SECTIONS) and "simulated" in text
        assert "src/app/models.py" in text and "KeyError" in text
    _, fact = sim.messages({"model": "m", "max_tokens": 2000, "system": summarizer.FACT_PROMPT,
                            "messages": [{"role": "user", "content": transcript + "\n\nQuestion: Which test failed?"}]})
    assert "test_models.py" in fact["content"][0]["text"]
    # the cached shape: the instruction merged into the user message that carries the last tool results,
    # which belong to the span being summarized
    cached = [*SPAN, {"role": "user", "content": [RESULT, {"type": "text", "text": summarizer.IN_PLACE_PROMPT}]}]
    _, out = sim.messages({"model": "m", "max_tokens": 2000, "system": "You are an agent.", "tools": TOOLS,
                           "messages": cached})
    text = out["content"][0]["text"]
    assert _headings(text) == list(summarizer.SECTIONS)
    assert "KeyError: 'id'" in text and "I will run pytest first" in text
    assert "Fix the failing test" not in text.split("## Decisions and why")[1]  # the head is not in the span
    question = summarizer.IN_PLACE_FACT.format(question="Which test failed?")
    _, fact = sim.messages({"model": "m", "max_tokens": 2000, "messages": [
        *SPAN, {"role": "user", "content": [RESULT, {"type": "text", "text": question}]}]})
    assert fact["content"][0]["text"].startswith("(simulated") and "test_models.py" in fact["content"][0]["text"]
    # an agent's own message that merely mentions the instruction is an ordinary turn
    _, turn = sim.messages({"model": "m", "max_tokens": 100, "messages": [
        *SPAN, {"role": "user", "content": [RESULT, {"type": "text", "text": "see " + summarizer.COMPACTION_OPEN}]}]})
    assert turn["content"][0]["text"] == "ok"
    assert [r.kind for r in sim.log] == ["summary", "summary", "facts", "summary", "facts", "turn"]
    n = len(sim.log)
    # the cached shape as the proxy's codec builds it (proxy/wire/messages): the same answer
    import orjson

    from proxy.wire.messages.codec import MESSAGES
    items = MESSAGES.items(MESSAGES.parse(orjson.dumps({"model": "m", "max_tokens": 10, "messages": [
        *SPAN, {"role": "user", "content": [RESULT]}]})))
    built = MESSAGES.request("m", [*items, MESSAGES.message("user", summarizer.IN_PLACE_PROMPT)], tools=TOOLS,
                             extra={"system": "You are an agent."}, max_output=2000)
    assert sim.messages(built, "k")[1]["content"][0]["text"] == text and sim.log[n].kind == "summary"
    # an answer longer than max_tokens is cut there
    _, cut = sim.messages({"model": "m", "max_tokens": 5, "messages": cached})
    assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 5


# --------------------------------------------------------------------------- over HTTP, with Anthropic's SDK

def test_the_simulators_messages_api_in_the_anthropic_sdk():
    import anthropic
    from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
    from pydantic import TypeAdapter

    sim = Simulator(window=6000)
    body = {"model": "claude-sonnet-4-6", "max_tokens": 256, "tools": TOOLS,
            "system": [{"type": "text", "text": LONG, "cache_control": CC}],
            "messages": [*SPAN, {"role": "user", "content": [RESULT]}]}
    with ThreadedServer(sim, lifespan="off") as server, httpx.Client(trust_env=False) as http:
        client = anthropic.Anthropic(base_url=server.url, api_key="sk-ant-test", max_retries=0,
                                     http_client=anthropic.DefaultHttpxClient(trust_env=False))
        done = client.messages.create(**body)
        assert isinstance(done, Message) and done.content[0].text == "ok" and done.stop_reason == "end_turn"
        total, read, created = ReferenceCache().bill(body)
        assert (done.usage.input_tokens, done.usage.cache_creation_input_tokens) == (total - created, created)
        with client.messages.stream(**body) as stream:
            assert stream.get_final_text() == "ok"
            final = stream.get_final_message()
        assert final.usage.cache_read_input_tokens == created and final.usage.input_tokens == total - created
        assert final.usage.output_tokens == done.usage.output_tokens
        counted = client.messages.count_tokens(model=body["model"], system=body["system"], tools=body["tools"],
                                               messages=body["messages"])
        assert isinstance(counted, MessageTokensCount) and counted.input_tokens == total

        raw = http.post(server.url + "/v1/messages", json={**body, "stream": True}, headers=HEADERS)
        assert raw.status_code == 200 and raw.headers["x-ctxproxy-simulated"] == "1"
        adapter = TypeAdapter(RawMessageStreamEvent)
        kinds = []
        for block in raw.text.strip().split("\n\n"):
            name, data = block.split("\n")
            payload = json.loads(data.removeprefix("data: "))
            assert name == f"event: {payload['type']}"
            kinds.append(payload["type"])
            if payload["type"] != "ping":  # every other event, strictly as the SDK's types define it
                adapter.validate_python(payload)
        assert kinds == ["message_start", "content_block_start", "ping", "content_block_delta",
                         "content_block_stop", "message_delta", "message_stop"]
        start = json.loads(raw.text.split("\n\n")[0].split("\n")[1][6:])
        Message.model_validate(start["message"])
        assert start["message"]["usage"]["cache_read_input_tokens"] == created

        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(model="claude-sonnet-4-6", max_tokens=10, messages=[
                {"role": "user", "content": "x " * 7000}])
        assert err.value.body["error"]["message"].startswith("prompt is too long: ")
        assert err.value.body["error"]["message"].endswith(" tokens > 6000 maximum")
        no_version = http.post(server.url + "/v1/messages", json=body, headers={"x-api-key": "k"})
        assert no_version.status_code == 400 and no_version.json()["error"]["message"] == \
            "anthropic-version: header is required"
    assert [r.kind for r in sim.log] == ["turn", "turn", "turn", "turn"]
    assert [r.cached_tokens for r in sim.log[:3]] == [0, created, created]


# --------------------------------------------------------------------------- traces

CALL_A = {"id": "call_a", "type": "function", "function": {"name": "shell", "arguments": '{"cmd":"ls src"}'}}
CALL_B = {"id": "call_b", "type": "function", "function": {"name": "shell", "arguments": "not json"}}
CHAT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in tests/test_io.py"},
    {"role": "assistant", "content": "Looking around first.", "tool_calls": [CALL_A, CALL_B]},
    {"role": "tool", "tool_call_id": "call_a", "content": "io.py\nutil.py"},
    {"role": "tool", "tool_call_id": "call_b", "content": "sh: not: command not found"},
    {"role": "user", "content": "Also check setup.py"},
    {"role": "assistant", "content": "", "tool_calls": [{**CALL_A, "function": {"name": "shell", "arguments": ""}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": [{"type": "text", "text": "io.py"}]},
    {"role": "assistant", "content": "Done: src/io.py fixed."},
    {"role": "user", "content": [{"type": "text", "text": "And this?"},
                                 {"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}]},
    {"role": "assistant", "content": "A screenshot."},
]
PARAMS = {"type": "object", "properties": {"cmd": {"type": "string"}}}


def test_chat_messages_become_alternating_messages_with_paired_tools():
    system, msgs = tm.convert_messages(CHAT)
    assert system == [{"type": "text", "text": "You are a coding agent."}]
    assert msgs == [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test in tests/test_io.py"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking around first."},
            {"type": "tool_use", "id": "call_a", "name": "shell", "input": {"cmd": "ls src"}},
            {"type": "tool_use", "id": "call_b", "name": "shell", "input": {"raw": "not json"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_a", "content": "io.py\nutil.py"},
            {"type": "tool_result", "tool_use_id": "call_b", "content": "sh: not: command not found"},
            {"type": "text", "text": "Also check setup.py"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_a", "name": "shell", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_a",
                                      "content": [{"type": "text", "text": "io.py"}]}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Done: src/io.py fixed."}]},
        {"role": "user", "content": [{"type": "text", "text": "And this?"},
                                     {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A screenshot."}]},
    ]
    assert tm.convert_tools([{"type": "function", "function": {"name": "shell", "description": "run",
                                                               "parameters": PARAMS}}]) == [
        {"name": "shell", "description": "run", "input_schema": PARAMS}]
    assert tm.tool_input('["a"]') == {"raw": '["a"]'} and tm.tool_input(None) == {}


def _check_alternating_and_paired(messages):
    roles = [m["role"] for m in messages]
    assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:])), roles
    for k, m in enumerate(messages):
        uses = [b["id"] for b in m["content"] if b.get("type") == "tool_use"]
        if uses:
            nxt = messages[k + 1]["content"]
            results = [b["tool_use_id"] for b in nxt[:len(uses)] if b.get("type") == "tool_result"]
            assert sorted(results) == sorted(uses), k


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.stem[:2])
def test_every_shipped_example_converts_into_requests_the_simulator_accepts(path):
    trace = as_messages(load_trace(path))
    assert trace.api == "messages" and not trace.native
    chat = json.loads(path.read_text())
    assert len(trace.turns()) == sum(1 for i, m in enumerate(chat["messages"]) if i and m["role"] == "assistant")
    for t in trace.tools or []:
        assert set(t) == {"name", "description", "input_schema"}
    sim = Simulator(window=10_000_000)
    _check_alternating_and_paired(trace.items)
    for i in trace.turns():
        body = trace.request(i)
        assert body["max_tokens"] == tm.MAX_TOKENS and body["messages"][-1]["role"] == "user"
        assert body["messages"][-1]["content"][-1]["cache_control"] == CC
        assert body["system"][-1]["cache_control"] == CC
        assert sum("cache_control" in b for m in body["messages"] for b in m["content"]) == 1
        status, out = sim.messages(body, "k")
        assert status == 200, out
    # each turn reads all the one before it wrote (Claude Code's breakpoints), once it is long enough to cache
    for before, rec in zip(sim.log, sim.log[1:]):
        assert rec.cached_tokens == (before.prompt_tokens if before.prompt_tokens >= 1024 else 0)


def test_a_native_claude_code_trace_turns_at_each_tool_result_and_the_last_request():
    data = json.loads(CLAUDE_CODE.read_text())
    trace = load_trace(CLAUDE_CODE)
    assert trace.api == "messages" and trace.native and trace.model == "claude-opus-4-5-20251101"
    with_results = [k + 1 for k, m in enumerate(data["items"]) if m["role"] == "user"
                    and isinstance(m["content"], list) and any(b["type"] == "tool_result" for b in m["content"])]
    assert trace.turns() == sorted(set(with_results) | {data["last_request_input_len"]})
    assert trace.turns()[-1] == data["last_request_input_len"] == 77
    body = trace.request(trace.turns()[3])
    assert body["messages"][:-1] == data["items"][:trace.turns()[3] - 1]  # as recorded, only the last marked
    assert body["messages"][-1]["content"][-1]["cache_control"] == CC and "system" not in body
    assert "cache_control" not in json.dumps(data["items"])  # the trace itself is left unmarked
    assert body["tools"] == data["tools"] and body["max_tokens"] == tm.MAX_TOKENS
    # replayed straight to the simulator: the documented rules, recomputed
    sim, ref = Simulator(window=200_000), ReferenceCache()
    for i in trace.turns():
        b = trace.request(i)
        status, out = sim.messages(b, "k")
        assert status == 200 and _u(out["usage"]) == ref.bill(b)
    assert sum(r.cached_tokens for r in sim.log) / sum(r.prompt_tokens for r in sim.log) > 0.8


def test_a_bad_native_messages_trace_is_one_line(tmp_path):
    from proxy.replay.traces import TraceError

    for data, why in (({"api": "messages", "items": []}, "non-empty 'items'"),
                      ({"api": "messages", "items": [{"role": "system", "content": "x"}]}, "items[0] is not"),
                      ({"api": "messages", "items": [{"role": "user", "content": "hi"}]}, "no user message with"),
                      ({"api": "messages", "items": [{"role": "user", "content": "hi"}],
                        "last_request_input_len": 5}, "'last_request_input_len' must be 1-1")):
        p = tmp_path / "t.json"
        p.write_text(json.dumps(data))
        with pytest.raises(TraceError) as e:
            load_trace(p)
        assert why in str(e.value) and "\n" not in str(e.value)
