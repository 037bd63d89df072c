"""/ctx/ui in a real headless browser: Debian's chromium loads the page from a running proxy.

The page must show the figures /ctx/v1/stats serves, formatted as it formats
them, a session's timeline with its cache-break cause, and a screenshot that is
the right size and not blank. On a machine without chromium the tests skip
(install: apt-get update && apt-get install -y chromium); under CI=true they fail.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import struct
import subprocess
import time
import uuid
import zlib
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import httpx
import pytest
from agent_runs import TOOLS, conversation
from proxy_server import ProxyServer, make_settings

CHROMIUM = "/usr/bin/chromium"
INSTALL = "apt-get update && apt-get install -y chromium"
WIDTH, HEIGHT = 1280, 1000
MARKUP = '<img src=x onerror="document.title=1">'


# --------------------------------------------------------------------------- the browser

@pytest.fixture(scope="module")
def chromium() -> str:
    path = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if not path:
        if os.environ.get("CI") == "true":
            pytest.fail(f"chromium is not installed at {CHROMIUM}; the dashboard test needs it: {INSTALL} "
                        "(.ci/run installs it before the tests)", pytrace=False)
        pytest.skip(f"chromium is not installed; to run the dashboard test: {INSTALL}")
    return path


def browse(chromium: str, url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """One headless run: virtual time lets the page's fetches and rendering finish before the dump."""
    profile = tmp_path / f"profile-{uuid.uuid4().hex[:8]}"
    cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
           f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args, url]
    env = {**os.environ, "HOME": str(tmp_path)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"chromium exited {r.returncode}: {r.stderr[-2000:]}"
    return r


def dump_dom(chromium: str, url: str, tmp_path: Path, *args: str) -> str:
    dom = browse(chromium, url, tmp_path, "--dump-dom", *args).stdout
    assert "<html" in dom, dom[:500]
    return dom


def text_of(dom: str, element_id: str) -> str:
    """The text of the element with that id (no nested markup in the elements looked up this way)."""
    m = re.search(rf'id="{re.escape(element_id)}"[^>]*>([^<]*)<', dom)
    assert m, f"no #{element_id} in the page"
    return html.unescape(m.group(1))


def section(dom: str, element_id: str, end: str = "</table>") -> str:
    start = dom.index(f'id="{element_id}"')
    return html.unescape(dom[start:dom.index(end, start)])


# --------------------------------------------------------------------------- the page's number formats

def pct(x: float | None) -> str:
    """JavaScript's (x * 100).toFixed(1) + "%": the exact double, halves rounded up."""
    if x is None:
        return "—"
    return f"{Decimal(x * 100).quantize(Decimal('0.1'), rounding=ROUND_HALF_UP)}%"


def num(n: float, digits: int = 0) -> str:
    q = Decimal(n).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{q:,}"


# --------------------------------------------------------------------------- PNG, decoded with the stdlib

def png_pixels(data: bytes) -> tuple[int, int, set[bytes]]:
    """(width, height, distinct colours) of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, bytearray(), None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
        pos += 12 + length
    assert ihdr, "PNG without IHDR"
    width, height, depth, colour, _, _, interlace = ihdr
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unexpected PNG format {ihdr}"
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(bytes(idat))
    stride = width * bpp
    prev = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        start = y * (stride + 1)
        ftype, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        else:
            assert ftype == 0, f"bad PNG filter {ftype}"
        colours.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return width, height, colours


def rgb(hex_colour: str) -> bytes:
    return bytes.fromhex(hex_colour.lstrip("#"))


# --------------------------------------------------------------------------- traffic



def big_tool_result() -> list[dict]:
    log = "\n".join(f"2026-11-29T12:{i % 60:02d}:00 worker[{i}] processed item {i * 7919 % 100003} ok"
                    for i in range(3000))
    return [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Find the failing item in the log."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "bash", "arguments": '{"cmd": "cat app.log"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": log}]


def post(p: ProxyServer, msgs: list[dict], session: str | None = None, model: str = "gpt-4o") -> httpx.Response:
    headers = {"authorization": "Bearer sk-dashboard", **({"x-session-id": session} if session else {})}
    r = httpx.post(p.url + "/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": model, "messages": msgs, "tools": TOOLS})
    assert r.status_code == 200, r.text
    return r


def settled_stats(p: ProxyServer, requests: int, headers: dict | None = None) -> dict:
    """/ctx/v1/stats once the background accounting of `requests` requests has landed."""
    deadline = time.monotonic() + 10
    while True:
        s = httpx.get(p.url + "/ctx/v1/stats", headers=headers or {}).json()
        if s["totals"]["all"]["requests"] >= requests or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def proxy_settings(upstream, tmp_path: Path, env: dict | None = None):
    return make_settings(upstream.base_url, f"sqlite:///{tmp_path}/dash.db", env=env,
                         defaults={"status_bar": {"enabled": False}, "offload": {"tool_result_tokens": 2000}})


# --------------------------------------------------------------------------- tests

def test_dashboard_shows_the_stats_and_a_session_timeline(chromium, upstream, tmp_path):
    session = f"dash-{uuid.uuid4().hex[:8]}"
    with ProxyServer(proxy_settings(upstream, tmp_path)) as p:
        msgs = conversation(8)
        post(p, msgs, session)
        post(p, msgs, session)  # the same prefix again: cached
        edited = [{**msgs[0], "content": msgs[0]["content"] + " NEW RULE."}] + msgs[1:]
        broke = post(p, edited, session)
        assert broke.headers["x-ctxproxy-cache-break"] == "system prompt changed"
        post(p, big_tool_result())  # offloaded: tokens saved
        post(p, conversation(2), model="gpt-4o-mini")  # a second route/model row
        post(p, conversation(1), session=MARKUP)  # a client-chosen id is shown as text, never as markup
        stats = settled_stats(p, 6)
        totals = stats["totals"]["last_day"]
        assert totals["requests"] == 6 and totals["breaks"] == 1 and totals["saved_offload"] > 0
        assert totals["hit_rate"] is not None and 0 < totals["hit_rate"] < 1

        shot = tmp_path / "dashboard.png"  # one page load gives its DOM and its screenshot
        dom = dump_dom(chromium, f"{p.url}/ctx/ui#session={session}", tmp_path, f"--screenshot={shot}",
                       f"--window-size={WIDTH},{HEIGHT}")
        all_time = dump_dom(chromium, f"{p.url}/ctx/ui#window=all&session={session}", tmp_path)

    assert 'data-state="ready"' in dom
    # headline tiles: the figures of the default window (last day), formatted as the page formats them
    assert text_of(dom, "requests") == num(totals["requests"]) == "6"
    assert text_of(dom, "hit-rate") == pct(totals["hit_rate"])
    assert text_of(dom, "efficiency") == pct(totals["efficiency"])
    assert text_of(dom, "saved-tokens") == num(totals["saved_tokens"])
    assert text_of(dom, "saved-offload") == num(totals["saved_offload"])
    assert text_of(dom, "effective-cost") == num(totals["effective_cost"], 1)
    assert text_of(dom, "breaks") == "1"
    assert 'data-window="last_day" aria-pressed="true"' in dom
    # another window, chosen in the address as the window buttons do
    assert 'data-window="all" aria-pressed="true"' in all_time
    assert text_of(all_time, "requests") == num(stats["totals"]["all"]["requests"])
    assert text_of(all_time, "hit-rate") == pct(stats["totals"]["all"]["hit_rate"])
    # one row per route/model, with its figures
    groups = section(dom, "groups", "</tbody>")
    for g in stats["groups"]:
        row = groups[groups.index(f'data-model="{g["model"]}"'):]
        row = row[:row.index("</tr>")]
        for figure in (num(g["last_day"]["requests"]), num(g["last_day"]["prompt"]), pct(g["last_day"]["hit_rate"])):
            assert f">{figure}<" in row, (g["model"], figure, row)
    # the sessions, the selected one highlighted with its last break
    sessions = section(dom, "sessions", "</tbody>")
    assert f'data-session="{session}" class="selected"' in sessions
    assert "system prompt changed" in sessions
    assert MARKUP not in dom and html.escape(MARKUP, quote=False) in dom
    # its timeline, request by request, the break on the third
    timeline = section(dom, "timeline")
    rows = re.findall(r"<tr[^>]*data-request=.*?</tr>", timeline, re.S)
    assert len(rows) == 3
    assert 'class="break"' in rows[2] and "system prompt changed" in rows[2]
    assert "system prompt changed" not in rows[0] + rows[1]

    data = shot.read_bytes()
    width, height, colours = png_pixels(data)
    assert (width, height) == (WIDTH, HEIGHT)
    assert len(colours) > 100, f"screenshot looks blank: {len(colours)} colours"
    assert rgb("#fffaeb") in colours, "the break row of the timeline is not on screen"
    assert rgb("#c9d5ea") in colours, "the chart's bars are not on screen"
    assert rgb("#d9dee8") in colours, "the session's picture (what the client sent per turn) is not on screen"


def test_dashboard_asks_for_the_admin_token_and_handles_no_data(chromium, upstream, tmp_path):
    with ProxyServer(proxy_settings(upstream, tmp_path, env={"CTXPROXY_ADMIN_TOKEN": "s3cret"})) as p:
        refused = dump_dom(chromium, f"{p.url}/ctx/ui", tmp_path)
        wrong = dump_dom(chromium, f"{p.url}/ctx/ui#token=nope", tmp_path)
        empty = dump_dom(chromium, f"{p.url}/ctx/ui#token=s3cret", tmp_path)

    for dom in (refused, wrong):
        assert 'data-state="unauthorized"' in dom
        banner = section(dom, "auth-error", "</form>")
        assert "hidden" not in banner[:banner.index(">")]
        assert "The proxy wants the admin token" in banner and "CTXPROXY_ADMIN_TOKEN" in banner
        assert "No figures without the admin token" in section(dom, "sessions", "</tbody>")
    assert "was refused" in section(wrong, "auth-error", "</form>")

    assert 'data-state="ready"' in empty
    banner = section(empty, "auth-error", "</form>")
    assert "hidden" in banner[:banner.index(">")]
    assert text_of(empty, "requests") == "0" and text_of(empty, "hit-rate") == "—"
    assert "No sessions yet" in section(empty, "sessions", "</tbody>")
    assert "No requests in the last" in empty  # the chart and the route table say so


def test_dashboard_is_one_self_contained_page(upstream, tmp_path):
    """Served as is, with nothing to fetch from elsewhere: no scripts, styles, fonts or images by URL."""
    with ProxyServer(proxy_settings(upstream, tmp_path)) as p:
        r = httpx.get(p.url + "/ctx/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    dashboard = Path(__file__).resolve().parents[1] / "proxy" / "http" / "dashboard.html"
    assert page == dashboard.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=|@import|url\(|<link\b""", page, re.I)
    assert re.findall(r"https?://[^\s\"')]+", page) == ["http://www.w3.org/2000/svg"]  # a namespace, not a fetch
    for element_id in ("hit-rate", "efficiency", "requests", "saved-tokens", "effective-cost", "breaks", "chart",
                       "groups", "sessions", "timeline", "auth-error"):
        assert f'id="{element_id}"' in page


def _inspector_rows(dom: str) -> dict[int, tuple[str, str]]:
    """position -> (kind, text shown) of each message the proxy wrote, from the inspector card."""
    card = dom[dom.index('id="inspector-rows"'):]
    card = card[:card.index("</tbody>")]
    out = {}
    for kind, pos, row in re.findall(r'<tr data-kind="(\w+)" data-position="(\d+)">(.*?)</tr>', card, re.S):
        pre = re.search(r"<pre>(.*?)</pre>", row, re.S)
        out[int(pos)] = (kind, html.unescape(pre.group(1)) if pre else "")
    return out


def test_dashboard_shows_the_crafted_figures_and_what_went_upstream(chromium, upstream, tmp_path):
    import crafted

    def make(defaults: dict, name: str) -> ProxyServer:
        return ProxyServer(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/{name}.db", defaults=defaults,
                                         models={crafted.MODEL: {"context_window": crafted.WINDOW}}))

    session = f"crafted-{uuid.uuid4().hex[:8]}"
    with make(crafted.DEFAULTS, "figures") as p:
        run = crafted.drive(p, upstream, "sk-dashboard", session)
        sent = upstream.requests[-1].json
        dom = dump_dom(chromium, f"{p.url}/ctx/ui#window=all&session={session}&request=3", tmp_path)
    upstream.reset()
    with make(crafted.INSPECT_DEFAULTS, "summary") as p:
        agent = crafted.drive_summary(p, upstream, "sk-dashboard", session)
        # its timeline: request 1, the summary call request 2 made (the proxy's own, 2.1), request 2 itself
        summary_dom = dump_dom(chromium, f"{p.url}/ctx/ui#session={session}&request=2", tmp_path)

    assert 'data-state="ready"' in dom
    # the tiles: the crafted session's known figures
    assert text_of(dom, "offloads") == "3" and text_of(dom, "compactions") == "1"
    assert text_of(dom, "saved-tokens") == num(run.total("saved"))
    assert text_of(dom, "saved-offload") == num(run.total("offload"))
    assert text_of(dom, "saved-compress") == num(run.total("compress"))
    assert text_of(dom, "saved-added") == num(run.total("added"))
    assert text_of(dom, "readback") == "0/7"
    # the session's picture: context per turn, client sent against upstream got, the window and trigger lines,
    # the offloads (turns 1 and 2) and the compaction (turn 3) marked, from the same figures as the table
    assert '<div id="session-picture">' in dom  # shown
    chart = section(dom, "session-chart", "</svg>")
    turns = re.findall(r'<g data-n="(\d+)" data-client="(\d*)" data-sent="(\d+)" class="turn">(.*?)</g>', chart, re.S)
    assert [t[0] for t in turns] == ["1", "2", "3"]
    for (_, client, got, _), want in zip(turns, run.expected):
        assert int(client) - int(got) == want.saved
    assert ['class="offload"' in t[3] for t in turns] == [True, True, False]
    assert ['class="compaction"' in t[3] for t in turns] == [False, False, True]
    assert 'class="window"' in chart and 'class="trigger"' in chart
    # the timeline: offloaded by the request / in effect, and what each request saved
    timeline = section(dom, "timeline")
    rows = re.findall(r"<tr[^>]*data-request=.*?</tr>", timeline, re.S)
    assert len(rows) == 3 and 'class="selected"' in rows[2]
    for row, offl, want in zip(rows, ("2/2", "1/3", "0/3"), run.expected):
        assert f">{offl}<" in row and f">{num(want.saved)}<" in row
    # the inspector: every message the proxy wrote, in place, with the text that was sent
    shown = _inspector_rows(dom)
    written = {i: m for i, m in enumerate(sent["messages"])
               if str(m["content"]).startswith(("[ctxproxy:", "<agent_status>"))}
    assert shown.keys() == written.keys()
    # status_bar.mode replace (the default): only the current status is sent
    assert sorted(k for k, _ in shown.values()) == ["cleared"] * 4 + ["offload"] * 3 + ["status"]
    for pos, (kind, text) in shown.items():
        assert text == written[pos]["content"], (pos, kind)
    # and a summary, as it was sent
    shown = _inspector_rows(summary_dom)
    kinds = {pos: kind for pos, (kind, _) in shown.items()}
    assert kinds == {2: "summary", len(agent[1]["messages"]) - 1: "status"}
    assert shown[2][1] == agent[1]["messages"][2]["content"] and crafted.SUMMARY in shown[2][1]


def _client_texts(dom: str) -> list[str]:
    """The text shown in each row of the client's own messages, from the inspector card."""
    card = dom[dom.index('id="inspector-rows"'):]
    card = card[:card.index("</tbody>")]
    return [html.unescape(t) for t in re.findall(r'<tr data-kind="client">.*?<pre>(.*?)</pre>', card, re.S)]


def test_the_inspector_shows_the_text_of_tool_calls_and_their_outputs(chromium, upstream, tmp_path):
    """A Responses output's text is in `output` (a string or parts), a call's in its arguments or input, a
    Messages call is a tool_use part: each is shown, the placeholders the proxy sent for them too."""
    from test_responses_api import big_log

    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/tools.db", logging={"log_content": True},
                             defaults={"status_bar": {"enabled": False}, "offload": {"tool_result_tokens": 2000}})
    auth = {"authorization": "Bearer sk-dashboard"}
    responses, messages = f"resp-{uuid.uuid4().hex[:8]}", f"msgs-{uuid.uuid4().hex[:8]}"
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find it."}]},
             {"type": "function_call", "name": "shell", "arguments": '{"command":"cat a.log"}', "call_id": "c1"},
             {"type": "function_call_output", "call_id": "c1", "output": big_log()},
             {"type": "function_call", "name": "shell", "arguments": '{"command":"ls"}', "call_id": "c2"},
             {"type": "function_call_output", "call_id": "c2",
              "output": [{"type": "input_text", "text": "a.log b.log"}]},
             {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch", "call_id": "c3"},
             {"type": "custom_tool_call_output", "call_id": "c3", "output": "Done!"}]
    def tool_use(id_: str, cmd: str) -> dict:
        return {"type": "tool_use", "id": id_, "name": "bash", "input": {"cmd": cmd}}

    turns = [{"role": "user", "content": "Find it."},
             {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, tool_use("t1", "cat")]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": big_log()}]},
             {"role": "assistant", "content": [tool_use("t2", "ls")]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2",
                                           "content": [{"type": "text", "text": "c.log d.log"}]}]}]
    with ProxyServer(settings) as p:
        r = httpx.post(p.url + "/v1/responses", headers={**auth, "x-session-id": responses}, timeout=30,
                       json={"model": "gpt-5", "input": items})
        assert r.status_code == 200 and r.headers["x-ctxproxy-offloaded"] == "1", r.text
        placeholder = upstream.requests[-1].json["input"][2]["output"]
        r = httpx.post(p.url + "/v1/messages", headers={**auth, "x-session-id": messages}, timeout=30,
                       json={"model": "claude-sonnet-4-6", "max_tokens": 100, "messages": turns})
        assert r.status_code == 200 and r.headers["x-ctxproxy-offloaded"] == "1", r.text
        block = upstream.requests[-1].json["messages"][2]["content"][0]["content"]
        settled_stats(p, 2)
        doms = [dump_dom(chromium, f"{p.url}/ctx/ui#session={s}&request=1", tmp_path) for s in (responses, messages)]

    assert _inspector_rows(doms[0]) == {2: ("offload", placeholder)}
    assert _client_texts(doms[0]) == ['Find it.\n\nshell({"command":"cat a.log"})',
                                      'shell({"command":"ls"})\n\na.log b.log\n\napply_patch(*** Begin Patch)\n\nDone!']
    assert _inspector_rows(doms[1]) == {2: ("offload", block)}
    assert _client_texts(doms[1]) == ['Find it.\n\nLooking.\nbash({"cmd":"cat"})',
                                      'bash({"cmd":"ls"})\n\nc.log d.log']
