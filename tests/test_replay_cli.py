"""`ctxproxy replay` and the built-in provider simulator (proxy/replay/simulator.py), end to end.

The baseline figures are checked against an independent implementation of the
rules the simulator documents (rendering, o200k_base, window, OpenAI's prefix
cache rule), written here without importing the simulator.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import httpx
import pytest
from cli_main import run_main

from proxy.replay import parse, run
from proxy.replay.simulator import Simulator
from proxy.replay.threaded_server import ThreadedServer
from proxy.replay.traces import example_paths
from proxy.rewrite.compress import summarizer
from proxy.tokens.encodings import ensure_encodings, get_encoding

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = example_paths()


def _cli_env() -> dict[str, str]:
    """No key, and any outbound proxy pointing nowhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "NO_PROXY", "no_proxy")}
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", ALL_PROXY="http://127.0.0.1:9")
    return env


def cli_process(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m proxy.cli replay ...` as users run it (kept where the process is the subject)."""
    return subprocess.run([sys.executable, "-m", "proxy.cli", "replay", *args], cwd=ROOT, env=_cli_env(),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`ctxproxy replay ...` through the CLI's main in this process (tests/cli_main.py): same arguments, output
    and exit code as the subprocess, without a fresh interpreter and tiktoken load per call."""
    return run_main("replay", *args, env=_cli_env())


# --------------------------------------------------------------------------- the independent reference

def _text(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                out.append(p["text"])
            elif isinstance(p, dict) and p.get("type") in ("image_url", "input_image", "image"):
                out.append("[image]")
            else:
                out.append(json.dumps(p, sort_keys=True))
        return "\n".join(out)
    return json.dumps(content, sort_keys=True)


def _render(m):
    s = f"<|{m.get('role', '')}|>" + (f" name={m['name']}" if m.get("name") else "") + "\n" + _text(m.get("content"))
    for c in m.get("tool_calls") or []:
        fn = c.get("function") or {}
        s += f"\n<tool_call id={c.get('id')}>{fn.get('name')}({fn.get('arguments')})"
    if m.get("tool_call_id"):
        s += f"\n<tool_call_id={m['tool_call_id']}>"
    return s + "<|end|>\n"


def _prompt(enc, messages, tools, memo=None):
    """Each piece is encoded on its own; `memo` (piece -> tokens) spares encoding a turn's earlier pieces again."""
    memo = {} if memo is None else memo
    pieces = (["<|tools|>" + json.dumps(tools)] if tools else []) + [_render(m) for m in messages]
    out = []
    for piece in pieces:
        if piece not in memo:
            memo[piece] = enc.encode_ordinary(piece)
        out += memo[piece]
    return out


def _lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reference_baseline(paths, window):
    """Per turn (status, prompt, cached) and the totals, straight from the documented rules."""
    ensure_encodings()
    enc = get_encoding("o200k_base")
    earlier, rows, memo = [], [], {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        messages, tools = data["messages"], data.get("tools")
        for i, m in enumerate(messages):
            if i == 0 or m["role"] != "assistant":
                continue
            toks = _prompt(enc, messages[:i], tools, memo)
            if len(toks) > window:
                rows.append((400, len(toks), None))
                continue
            common = max((_lcp(toks, e) for e in earlier), default=0)
            earlier.append(toks)
            rows.append((200, len(toks), 0 if common < 1024 else common // 128 * 128))
    ok = [r for r in rows if r[0] == 200]
    prompt, cached = sum(r[1] for r in ok), sum(r[2] for r in ok)
    return rows, {"turns": len(rows), "answered": len(ok), "rejected": len(rows) - len(ok),
                  "provider_requests": len(rows), "prompt_tokens": prompt, "cached_tokens": cached,
                  "effective_cost": round(prompt - cached + 0.1 * cached, 1), "own_calls": 0}


# --------------------------------------------------------------------------- (a) it runs, labelled as a simulation

def test_replay_simulate_prints_the_table_and_the_totals(tmp_path):
    png = tmp_path / "28.png"
    r = cli_process("--simulate", "--plot", str(png), "28")  # the one run as users run it: `python -m proxy.cli replay`
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "API replayed: Chat Completions" in out
    assert str(png) in out and "red: no proxy" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "SIMULATION" in out and "simulat" in out.lower()
    assert "28_openhands-sdk_claude-sonnet-4_fncall" in out
    for header in ("turn", "agent sent", "provider got", "cached", "what ctxproxy did"):
        assert header in out
    assert "totals over 6 turns of 1 trace" in out
    for row in ("rejected (context_length_exceeded)", "prompt tokens billed", "cached tokens", "hit rate",
                "effective cost (uncached + 0.1 x cached)", "no proxy", "ctxproxy"):
        assert row in out
    assert "status bar" in out  # what the proxy did, from its response headers
    assert "Traceback" not in r.stderr


def test_replay_without_traces_uses_the_shipped_examples():
    r = cli("--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["simulated"] is True and "SIMULATION" in doc["note"]
    assert [t["name"] for t in doc["traces"]] == [p.stem for p in EXAMPLES]
    assert all(t["license"] == "MIT" and t["source"]["repo"] for t in doc["traces"])
    assert all(p.stat().st_size < 200_000 for p in EXAMPLES) and len(EXAMPLES) >= 2
    # The first demo shows the proxy earning its keep at the default window: without it the long example
    # dies at the window; with it every turn is answered, and the turns both answered cost less.
    totals = doc["totals"]
    assert totals["no_proxy"]["rejected"] > 0 and totals["ctxproxy"]["rejected"] == 0
    assert totals["ctxproxy"]["compactions"]
    both = totals["both_answered"]
    assert both["ctxproxy"]["effective_cost"] < both["no_proxy"]["effective_cost"]


# --------------------------------------------------------------------------- (b) the baseline, recomputed

WINDOW = 8000  # the 24k-character tool result of example 07 does not fit: a rejection, and cache hits


@pytest.fixture(scope="module")
def small_window(tmp_path_factory) -> tuple[dict, Path]:
    """Every example at WINDOW, with its plot: one replay for the baseline test and the plot test."""
    png = tmp_path_factory.mktemp("plot") / "context.png"
    r = cli("--simulate", "--window", str(WINDOW), "--json", "--plot", str(png), *map(str, EXAMPLES))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), png


def test_no_proxy_baseline_matches_an_independent_count(small_window):
    window = WINDOW
    doc = small_window[0]
    rows, totals = reference_baseline(EXAMPLES, window)
    got = [(t["no_proxy"]["status"], t["no_proxy"]["prompt"], t["no_proxy"]["cached"]) for t in doc["turns"]]
    assert got == rows
    base = doc["totals"]["no_proxy"]
    assert {k: base[k] for k in totals} == totals
    assert totals["rejected"] >= 1 and totals["cached_tokens"] > 0
    assert base["hit_rate"] == round(totals["cached_tokens"] / totals["prompt_tokens"], 4)
    for t in doc["turns"]:  # the rejected turn: the simulator's error, OpenAI's code
        if t["no_proxy"]["status"] == 400:
            assert t["no_proxy"]["error"] == "context_length_exceeded"

    # ctxproxy's totals (from the simulator's log) agree with its per-turn rows (from the responses and the log)
    proxy = doc["totals"]["ctxproxy"]
    sides = [t["ctxproxy"] for t in doc["turns"]]
    billed = [s for s in sides if s["billed"]]
    assert proxy["prompt_tokens"] == sum(s["prompt"] for s in billed) + sum(s["own_prompt"] for s in sides)
    assert proxy["cached_tokens"] == sum(s["cached"] for s in billed) + sum(s["own_cached"] for s in sides)
    assert proxy["answered"] + proxy["rejected"] + proxy["failed"] == proxy["turns"] == len(rows)
    assert all(t["client_tokens"] > 0 and t["messages"] == t["index"] for t in doc["turns"])


# --------------------------------------------------------------------------- (c) the plot

def _png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = ihdr
    assert depth == 8 and colour in (2, 6) and interlace == 0
    bpp = 3 if colour == 2 else 4
    raw, stride, prev, pixels, i = zlib.decompress(idat), w * bpp, bytearray(w * bpp), [], 0
    for _ in range(h):  # undo the PNG row filters
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += [tuple(line[x:x + 3]) for x in range(0, stride, bpp)]
        prev = line
    return w, h, pixels


def test_plot_writes_a_png_with_both_lines(small_window):
    doc, out = small_window  # what the report says of the plot: test_replay_simulate_prints_the_table_and_the_totals
    assert doc["plot"]["path"] == str(out) and "red: no proxy" in doc["plot"]["legend"]
    w, h, pixels = _png_pixels(out.read_bytes())
    assert w >= 400 and h >= 200 and len(pixels) == w * h
    colours = set(pixels)
    assert len(colours) > 2
    assert any(r_ > 150 and g < 100 and b < 100 for r_, g, b in colours)  # the no-proxy line
    assert any(b > 150 and r_ < 100 for r_, g, b in colours)  # the ctxproxy line


# --------------------------------------------------------------------------- (d) bad input: one line, exit 1

@pytest.mark.parametrize("content", [None, "{not json", '{"foo": 1}', '[{"role": "user", "content": "hi"}]', "42"])
def test_a_bad_trace_is_one_line_and_exit_1(tmp_path, content):
    path = tmp_path / "trace.json"
    if content is not None:
        path.write_text(content)
    r = cli("--simulate", str(path))
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ctxproxy: cannot read trace {path}: ")
    assert "Traceback" not in r.stderr


def test_bad_options_are_one_line():
    r = cli("--simulate", "--route", "nope", "28")
    assert r.returncode == 2 and r.stderr.strip() == "ctxproxy: unknown route 'nope'; configured routes: default"
    r = cli("--upstream", "http://127.0.0.1:9/v1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "TRACE" in r.stderr


# --------------------------------------------------------------------------- the simulator itself

def test_simulator_window_cache_and_summaries():
    ensure_encodings()
    sim = Simulator(window=3000)
    system = {"role": "system", "content": "You are a careful agent. " * 300}
    body = {"model": "m", "messages": [system, {"role": "user", "content": "first"}]}
    status, first = sim.complete(body, "Bearer a")
    assert status == 200 and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["choices"][0]["message"]["content"] == "ok"
    body["messages"].append({"role": "user", "content": "second"})
    _, second = sim.complete(body, "Bearer a")
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 1024 and cached % 128 == 0 and cached <= first["usage"]["prompt_tokens"]
    _, other_key = sim.complete(body, "Bearer b")  # another key: another cache
    assert other_key["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    body["messages"].append({"role": "user", "content": "x " * 3000})
    status, err = sim.complete(body, "Bearer a")
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert err["error"]["message"] == (
        f"This model's maximum context length is 3000 tokens. However, your messages resulted in "
        f"{sim.log[-1].prompt_tokens} tokens. Please reduce the length of the messages.")

    transcript = ("<transcript>\n### user\nFix the failing test in src/app/models.py\n\n### assistant\nI will run "
                  "pytest first\n\n### tool result (bash)\nFAILED tests/test_models.py::test_save - KeyError\n"
                  "</transcript>")
    status, s = sim.complete({"model": "m", "max_tokens": 2000, "messages": [
        {"role": "system", "content": summarizer.SYSTEM_PROMPT}, {"role": "user", "content": transcript}]})
    text = s["choices"][0]["message"]["content"]
    assert status == 200 and "simulated" in text
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == list(summarizer.SECTIONS)
    assert "src/app/models.py" in text and "KeyError" in text
    assert [r.kind for r in sim.log] == ["turn", "turn", "turn", "turn", "summary"]


def test_simulator_over_http_streams_with_usage():
    with ThreadedServer(Simulator(), lifespan="off") as server, httpx.Client(trust_env=False) as client:
        body = {"model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "hello"}]}
        r = client.post(server.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["x-ctxproxy-simulated"] == "1"
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "ok"
        assert chunks[-1]["usage"]["prompt_tokens"] > 0
        assert client.post(server.url + "/v1/embeddings", json={}).status_code == 404


def test_replay_to_an_upstream_counts_the_proxys_own_calls(tmp_path, capsys):
    """--upstream: the proxy's summarizer calls come from its accounting; they match what the provider received,
    at the shipped defaults (precompute on), a background summary that no turn used included."""
    config = tmp_path / "c.yaml"
    config.write_text("defaults:\n  compress: {keep_recent_tokens: 1500}\n")
    upstream = Simulator(window=6000)
    trace = next(p for p in EXAMPLES if p.name.startswith("21_"))
    with ThreadedServer(upstream, lifespan="off") as server:
        code = run(parse(["--upstream", server.url + "/v1", "--window", "6000", "--config", str(config),
                          "--json", str(trace)]))
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulated"] is False and "SIMULATED" in doc["note"]  # the baseline still is
    own = [r for r in upstream.log if r.kind == "summary"]
    proxy = doc["totals"]["ctxproxy"]
    assert own and proxy["own_calls"] == len(own)
    assert proxy["own_prompt_tokens"] == sum(r.prompt_tokens for r in own)
    assert proxy["own_cached_tokens"] == sum(r.cached_tokens for r in own)
    assert proxy["prompt_tokens"] == sum(r.prompt_tokens for r in upstream.log if r.status == 200)
    assert sum(proxy["compactions"].values()) >= 1
    # --simulate counts the simulator's log instead (as bench.replay counts its mock's): the same totals. (Not the
    # cached tokens: which of a background summary and the request that started it reaches the provider first,
    # and so which one's prefix is cached for the other, is a race; the prompts are not.)
    assert run(parse(["--simulate", "--window", "6000", "--config", str(config), "--json", str(trace)])) == 0
    logged = json.loads(capsys.readouterr().out)["totals"]["ctxproxy"]
    for k in ("own_calls", "own_prompt_tokens", "prompt_tokens", "compactions"):
        assert logged[k] == proxy[k], k


# --------------------------------------------------------------------------- the Responses API

def _codex_trace() -> Path:
    """A real Codex CLI session in Responses shape, shipped with the tests (tests/data/NOTICE.md)."""
    return Path(__file__).resolve().parent / "data" / "02_codex_moonmind_gpt-5.1-codex_019a802a.json"


def _render_item(it):
    """The Responses rendering the simulator documents, written again (chat's _render for the message shapes)."""
    kind = it.get("type")
    if kind in (None, "message"):
        return _render({"role": it.get("role", ""), "content": it.get("content")})
    if kind == "function_call":
        return _render({"role": "assistant", "content": None, "tool_calls": [
            {"id": it["call_id"], "function": {"name": it["name"], "arguments": it["arguments"]}}]})
    if kind in ("function_call_output", "custom_tool_call_output"):
        return _render({"role": "tool", "content": it.get("output"), "tool_call_id": it["call_id"]})
    if kind == "custom_tool_call":
        return f"<|assistant|>\n\n<custom_tool_call id={it['call_id']}>{it['name']}\n{it.get('input', '')}<|end|>\n"
    if kind == "reasoning":
        texts = [p["text"] for p in (it.get("summary") or []) + (it.get("content") or []) if "text" in p]
        blob = it.get("encrypted_content")  # billed as the reasoning it carries: 3 tokens per 16 characters
        secret = "\n<encrypted>" + " reasoning" * (len(blob) * 3 // 16) if blob else ""
        return "<|reasoning|>\n" + "\n".join(texts) + secret + "<|end|>\n"
    return f"<|{kind}|>\n{json.dumps(it, sort_keys=True)}<|end|>\n"


def _responses_prompt(enc, memo, body):
    pieces = ([_render({"role": "system", "content": body["instructions"]})] if body.get("instructions") else [])
    pieces += ["<|tools|>" + json.dumps(body["tools"])] if body.get("tools") else []
    pieces += [_render_item(it) for it in body["input"]]
    out = []
    for piece in pieces:
        if piece not in memo:
            memo[piece] = enc.encode_ordinary(piece)
        out += memo[piece]
    return out


def test_replay_the_examples_as_responses_requests():
    r = cli("--simulate", "--api", "responses", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["api"] == "responses" and {t["api"] for t in doc["traces"]} == {"responses"}
    totals = doc["totals"]
    assert totals["ctxproxy"]["rejected"] == 0 and totals["ctxproxy"]["failed"] == 0
    assert all(t["ctxproxy"]["status"] == 200 for t in doc["turns"])
    assert totals["no_proxy"]["rejected"] > 0  # the long example still outgrows the window without the proxy
    assert totals["ctxproxy"]["compactions"] and totals["ctxproxy"]["own_calls"] >= 1
    # Sent as items: per turn, the agent's input counts one item per message, plus one per tool call of an
    # assistant message with text; the system prompt went to `instructions`.
    for path in EXAMPLES:
        messages = json.loads(path.read_text())["messages"]

        def items(m):
            calls = len(m.get("tool_calls") or [])
            return calls + (1 if m.get("content") or not calls else 0) if m["role"] == "assistant" else 1

        want = [sum(items(m) for m in messages[1:i]) for i, m in enumerate(messages)
                if i > 0 and m["role"] == "assistant"]
        assert [t["messages"] for t in doc["turns"] if t["trace"] == path.stem] == want
    # (a chat replay says "API replayed: Chat Completions": test_replay_simulate_prints_the_table_and_the_totals)


def test_a_native_codex_trace_fits_the_window_only_through_the_proxy(monkeypatch, capsys):
    from proxy.replay import drive

    sims: list[Simulator] = []

    class Recorded(Simulator):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            sims.append(self)

    monkeypatch.setattr(drive, "Simulator", Recorded)
    path = _codex_trace()
    assert run(parse(["--simulate", "--window", "32000", "--json", str(path)])) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["api"] == "responses" and doc["traces"][0]["native"] is True
    base, proxy = doc["totals"]["no_proxy"], doc["totals"]["ctxproxy"]
    assert base["rejected"] >= 1
    assert proxy["rejected"] == 0 and proxy["answered"] == proxy["turns"]
    baseline, through = sims
    assert not [r for r in through.log if r.error == "context_length_exceeded"]  # not one, retries included
    assert {r.kind for r in through.log} >= {"turn", "summary"}
    assert all(r.prompt_tokens <= 32000 for r in through.log)

    # The baseline, recomputed from the recorded items by the documented rules: one turn per tool output.
    data = json.loads(path.read_text())
    enc, memo, earlier, rows = get_encoding("o200k_base"), {}, [], []
    for k, it in enumerate(data["items"]):
        if it.get("type") not in ("function_call_output", "custom_tool_call_output"):
            continue
        body = {"input": data["items"][:k + 1], "tools": data["tools"], "instructions": data["instructions"]}
        toks = _responses_prompt(enc, memo, body)
        if len(toks) > 32000:
            rows.append((400, len(toks), None))
            continue
        common = max((_lcp(toks, e) for e in earlier), default=0)
        earlier.append(toks)
        rows.append((200, len(toks), 0 if common < 1024 else common // 128 * 128))
    assert [(t["no_proxy"]["status"], t["no_proxy"]["prompt"], t["no_proxy"]["cached"]) for t in doc["turns"]] == rows
    assert len(baseline.log) == len(rows) == base["turns"]

    r = cli("--simulate", "--api", "chat", str(path))  # a Responses recording is not sent as chat
    assert r.returncode == 2 and "--api responses" in r.stderr


def test_the_simulators_responses_stream_parses_in_the_openai_sdk():
    import openai
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    ensure_encodings()
    sim = Simulator(window=4000)
    instruction = summarizer.IN_PLACE_PROMPT
    with ThreadedServer(sim, lifespan="off") as server, httpx.Client(trust_env=False) as http:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-none", http_client=http, max_retries=0)
        body = {"model": "gpt-5-codex", "instructions": "Be brief.",
                "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                          {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABopaque"},
                          {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                          {"type": "function_call_output", "call_id": "c1", "output": "FAILED src/app.py"}]}
        events = list(client.responses.create(stream=True, **body))
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "ok"
        done = events[-1].response
        assert done.output_text == "ok" and done.status == "completed"
        want = len(_responses_prompt(get_encoding("o200k_base"), {}, body))
        assert done.usage.input_tokens == want and done.usage.input_tokens_details.cached_tokens == 0

        raw = http.post(server.url + "/v1/responses", json={**body, "stream": True})
        assert raw.headers["x-ctxproxy-simulated"] == "1"
        blocks = raw.text.strip().split("\n\n")
        adapter = TypeAdapter(ResponseStreamEvent)
        for block in blocks:  # every event, strictly as the SDK's types define it
            name, data = block.split("\n")
            event = adapter.validate_python(json.loads(data.removeprefix("data: ")))
            assert name == f"event: {event.type}"
        Response.model_validate(json.loads(blocks[-1].split("\n")[1][6:])["response"])

        # the proxy's own call in the cached shape: answered by the extractive summary, not "ok"
        summary = client.responses.create(**{**body, "input": [*body["input"], {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": instruction}]}]})
        assert [line[3:] for line in summary.output_text.splitlines() if line.startswith("## ")] == \
            list(summarizer.SECTIONS)
        assert "src/app.py" in summary.output_text and summary.usage.input_tokens_details.cached_tokens == 0

        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="gpt-5-codex", input="x " * 5000)
        assert err.value.body == {"message": "Your input exceeds the context window of this model. Please adjust "
                                             "your input and try again.", "type": "invalid_request_error",
                                  "param": "input", "code": "context_length_exceeded"}
    assert [r.kind for r in sim.log] == ["turn", "turn", "summary", "turn"]
    assert sim.log[1].cached_tokens == 0 and sim.log[-1].error == "context_length_exceeded"


# --------------------------------------------------------------------------- Anthropic's Messages API

def _claude_code_trace() -> Path:
    """A real Claude Code session in Messages shape, shipped with the tests (tests/data/NOTICE.md)."""
    name = "08_claude-code_claude-reliability_opus-4-5_python-to-rust-port.json"
    return Path(__file__).resolve().parent / "data" / name


def test_a_native_claude_code_trace_fits_the_window_only_through_the_proxy(monkeypatch, capsys):
    from proxy.replay import drive
    from tests.test_sim_messages import ReferenceCache, reference_blocks

    sims: list[Simulator] = []
    seen: list[tuple[str, str]] = []

    class Recorded(Simulator):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            sims.append(self)

        def messages(self, body, authorization=""):
            seen.append((authorization, body["messages"][-1]["role"]))
            return super().messages(body, authorization)

    monkeypatch.setattr(drive, "Simulator", Recorded)
    path = _claude_code_trace()
    assert run(parse(["--simulate", "--window", "12000", "--json", str(path)])) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["api"] == "messages" and doc["traces"][0]["native"] is True
    base, proxy = doc["totals"]["no_proxy"], doc["totals"]["ctxproxy"]
    assert base["rejected"] >= 1
    assert proxy["rejected"] == 0 and proxy["failed"] == 0 and proxy["answered"] == proxy["turns"]
    baseline, through = sims
    # every request the proxy made, its own summaries included, is one Anthropic accepts: valid (tool pairing,
    # at most 4 breakpoints, max_tokens), within the window with its max_tokens, with the client's key
    assert [r.status for r in through.log] == [200] * len(through.log)
    assert {r.kind for r in through.log} >= {"turn", "summary"}
    assert all(r.prompt_tokens + 4096 <= 12000 for r in through.log if r.kind == "turn")
    assert {a for a, _ in seen[len(baseline.log):]} == {drive.SIMULATED_KEY}
    assert proxy["cached_tokens"] > 0

    # The baseline, recomputed from the recorded messages by the documented rules, with Claude Code's breakpoints
    data = json.loads(path.read_text())
    ref, rows = ReferenceCache(), []
    for t in doc["turns"]:
        n = t["index"]
        msgs = json.loads(json.dumps(data["items"][:n]))
        last = msgs[-1]["content"]
        last[-1]["cache_control"] = {"type": "ephemeral"}
        body = {"model": data["model"], "max_tokens": 4096, "tools": data["tools"], "messages": msgs}
        total = sum(k for k, _ in reference_blocks(body))
        if total + 4096 > 12000:
            rows.append((400, total, None))
            continue
        _, read, _ = ref.bill(body)
        rows.append((200, total, read))
    assert [(t["no_proxy"]["status"], t["no_proxy"]["prompt"], t["no_proxy"]["cached"]) for t in doc["turns"]] == rows

    r = cli("--simulate", "--api", "chat", str(path))  # a Messages recording is not sent as chat
    assert r.returncode == 2 and "--api messages" in r.stderr
    r = cli("--simulate", "--api", "messages", str(_codex_trace()))  # nor a Responses one as Messages
    assert r.returncode == 2 and "recorded in the Responses API: replay it with --api responses" in r.stderr


def test_replay_a_chat_example_as_messages_requests():
    r = cli("--simulate", "--api", "messages", "--window", "16000", "--json", "21")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["api"] == "messages" and doc["traces"][0]["native"] is False
    assert all(t["ctxproxy"]["status"] == 200 for t in doc["turns"])
    chat = json.loads(next(p for p in EXAMPLES if p.name.startswith("21_")).read_text())["messages"]
    assert len(doc["turns"]) == sum(1 for i, m in enumerate(chat) if i and m["role"] == "assistant")
    # sent as alternating messages: each turn's count is that of the merged conversation before the answer
    assert [t["messages"] for t in doc["turns"]] == sorted(t["messages"] for t in doc["turns"])
    assert doc["totals"]["no_proxy"]["cached_tokens"] > 0  # the client's own breakpoints cache without the proxy


def test_the_replays_routes_keep_the_api_they_forward(tmp_path):
    from proxy.engine.routing import resolve_route
    from proxy.replay.proxy_setup import proxy_settings

    sim = "http://127.0.0.1:1/v1"
    shipped = proxy_settings(str(ROOT / "config.yaml"), sim, str(tmp_path), ["m"], 32000, True, ["anthropic"])
    assert {r.name: r.upstream.api for r in shipped.routes} == {"default": "openai", "local": None,
                                                                "anthropic": "anthropic", "gemini": "google"}
    assert all(r.upstream.base_url == sim for r in shipped.routes)
    # Claude Code's bare /v1/messages takes the Anthropic route, as against the real providers
    assert resolve_route(shipped, None, {}, "claude-x", "anthropic").name == "anthropic"
    assert resolve_route(shipped, None, {}, "gpt-4o", "openai").name == "default"
    # the built-in defaults forward to api.openai.com: the default route takes Messages only when they are replayed
    assert proxy_settings(None, sim, str(tmp_path), ["m"], 32000, True, ["openai"]).routes[0].upstream.api == "openai"
    assert proxy_settings(None, sim, str(tmp_path), ["m"], 32000, True, ["anthropic"]).routes[0].upstream.api is None
    # a real upstream: its own host decides
    real = proxy_settings(str(ROOT / "config.yaml"), "https://api.anthropic.com/v1", str(tmp_path), ["m"], 32000,
                          False, ["anthropic"])
    assert {r.upstream.speaks() for r in real.routes} == {"anthropic"}


def test_the_simulator_reads_an_offload_back_when_asked(tmp_path):
    """`--read-back`: the simulated model reads each offloaded output back once; the proxy answers it in a hidden
    round, the turn still gets its answer, and the replay says so (a newcomer sees a read-back with no provider)."""
    import json as json_

    from cli_main import run_main

    done = run_main("replay", "--simulate", "--window", "8000", "07", "--read-back", "--json")
    assert done.returncode == 0, done.stderr
    doc = json_.loads(done.stdout)
    proxy = doc["totals"]["ctxproxy"]
    assert proxy["read_rounds"] == 1 and proxy["offloads"] == 1 and proxy["rejected"] == 0
    plain = json_.loads(run_main("replay", "--simulate", "--window", "8000", "07", "--json").stdout)
    assert plain["totals"]["ctxproxy"]["read_rounds"] == 0


def test_the_plot_draws_each_trace_apart_and_marks_rejections_and_compactions():
    """The next trace's first turn is no drop of the last one's (a gap, not a line that looks like a compaction);
    a turn rejected without the proxy and a compaction through it are marked."""
    import math

    from proxy.replay.plot import _apart, chart_png

    apart = _apart([10, 20, 5, 8], [2])
    assert len(apart) == 5 and math.isnan(apart[2]) and apart[3] == 5
    plain = chart_png([10, 20, 5, 8], [10, 12, 5, 6], 15, [2])
    marked = chart_png([10, 20, 5, 8], [10, 12, 5, 6], 15, [2], rejected=[2], compactions=[2])
    w, h, a = _png_pixels(plain)
    _, _, b = _png_pixels(marked)
    changed = [i for i, (p, q) in enumerate(zip(a, b)) if p != q]
    assert changed and all(q in ((214, 39, 40), (31, 119, 180), (40, 40, 40)) for q in (b[i] for i in changed))
