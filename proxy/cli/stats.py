"""`ctxproxy stats`: a running proxy's figures in the terminal, from /ctx/v1/stats and /ctx/v1/sessions.

Only reads what the proxy serves; every failure (unreachable, refused, not a
ctxproxy) is one line for stderr (`Failure`), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
WINDOWS = ("last_hour", "last_day", "all")
_WINDOW_NAMES = {"last_hour": "last hour", "last_day": "last day", "all": "all time"}
_RECENT_SESSIONS = 20


class Failure(Exception):
    """One line for stderr, exit code 1."""


def _num(n: Any, digits: int = 0) -> str:
    return "-" if n is None else f"{n:,.{digits}f}"


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _table(headers: list[str], rows: list[list[str]], align: str) -> list[str]:
    """Columns padded to their widest cell; `align` has an l or r per column."""
    widths = [max(len(c) for c in col) for col in zip(headers, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)).rstrip()
    return [line(headers)] + [line(r) for r in rows]


def _fetch(client: Any, url: str, path: str, authed: bool) -> Any:
    import httpx

    try:
        r = client.get(url + path)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
        raise Failure(f"invalid --url {url!r}: {e}") from None
    except httpx.HTTPError as e:
        raise Failure(f"cannot reach the proxy at {url}: {e or type(e).__name__}") from None
    try:
        body = r.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if r.status_code == 401:
        raise Failure("the proxy wants the admin token: pass --token or set CTXPROXY_ADMIN_TOKEN"
                       + (" (the one given was refused)" if authed else ""))
    if r.status_code >= 400:
        said = message or r.text[:200].strip() or r.reason_phrase
        raise Failure(f"the proxy at {url} answered {r.status_code}: {said}")
    if body is None:
        raise Failure(f"{url}{path} did not answer with JSON: is it a ctxproxy?")
    return body


def _usd(value: float | None, what: str) -> str:
    if value is None:
        return "- (no model has a price: set models.<name>.price in config.yaml)"
    return f"${value:,.2f} ({what})"


def _stats_lines(url: str, window: str, stats: dict[str, Any], sessions: list[dict[str, Any]]) -> list[str]:
    t = stats["totals"][window]
    scope = "all tenants" if stats.get("scope") == "all" else "this API key's tenant"
    out = [f"ctxproxy at {url}: {scope}, {_WINDOW_NAMES[window]}, at {_clock(stats['generated_at'])}", ""]
    hit = _pct(t["hit_rate"]) if t["hit_rate"] is not None else "- (the provider did not report cached tokens)"
    totals = [
        ("requests", f"{_num(t['requests'])} (errors {_num(t['errors'])})"),
        ("prompt tokens", _num(t["prompt"])),
        ("cached tokens", _num(t["cached"])),
        ("hit rate", hit),
        ("cacheable tokens", _num(t["cacheable"])),
        ("cache efficiency", _pct(t["efficiency"])),
        ("completion tokens", _num(t["completion"])),
        ("tokens saved", _saved(t)),
        ("effective cost", f"{_num(t['effective_cost'], 1)} token units"),
        ("cost", _usd(t.get("cost_usd"), "as billed, the models priced in config.yaml")),
        ("saved", _usd(t.get("saved_usd"), "the tokens saved at the uncached input price")),
        ("cache breaks", _num(t["breaks"])),
        ("offloads", _num(t["offloads"])),
        ("compactions", _num(t["compactions"])),
        ("read back", _read_back(t)),
        ("own calls", f"{_num(t['own_calls'])} (prompt {_num(t['own_prompt'])}, cached {_num(t['own_cached'])}, "
                      f"completion {_num(t.get('own_completion', 0))})"),
    ]
    out += ["totals"] + [f"  {k + ':':<19}{v}" for k, v in totals] + [""]
    rows = [[g["route"], g["model"] or "-", _num(w["requests"]), _num(w["prompt"]), _num(w["cached"]),
             _pct(w["hit_rate"]), _pct(w["efficiency"]), _num(w["saved_tokens"]), _num(w["breaks"])]
            for g in stats["groups"] for w in [g[window]] if w["requests"]]
    out.append(f"by route and model ({_WINDOW_NAMES[window]})")
    if rows:
        out += ["  " + x for x in _table(["ROUTE", "MODEL", "REQUESTS", "PROMPT", "CACHED", "HIT RATE", "EFFICIENCY",
                                          "SAVED", "BREAKS"], rows, "llrrrrrrr")]
    else:
        out.append("  no requests")
    out.append("")
    out.append("recent sessions")
    if sessions:
        rows = [[s["session"], s.get("model") or "-", _num(s["requests"]), _num(s["prompt"]), _num(s["cached"]),
                 _num(s["breaks"]), _num(s.get("offloads")), _num(s.get("saved_tokens")), _clock(s["last"]),
                 s.get("last_break") or "-"] for s in sessions[:_RECENT_SESSIONS]]
        out += ["  " + x for x in _table(["SESSION", "MODEL", "REQUESTS", "PROMPT", "CACHED", "BREAKS", "OFFLOADS",
                                          "SAVED", "LAST SEEN", "LAST BREAK"], rows, "llrrrrrrll")]
        if len(sessions) > _RECENT_SESSIONS:
            out.append(f"  ... and {len(sessions) - _RECENT_SESSIONS} more")
    else:
        out.append("  none yet")
    return out


def _saved(t: dict[str, Any]) -> str:
    return (f"{_num(t['saved_tokens'])} (offload {_num(t['saved_offload'])}, compression {_num(t['saved_compress'])}, "
            f"added by the proxy -{_num(t['added_tokens'])})")


def _read_back(t: dict[str, Any]) -> str:
    rate = f" ({_pct(t['readback_rate'])})" if t.get("readback_rate") is not None else ""
    return (f"{_num(t['handles_read'])} of {_num(t['handles_given'])} handles given{rate}, "
            f"in {_num(t['read_rounds'])} hidden rounds")


def _session_lines(data: dict[str, Any]) -> list[str]:
    s = data.get("summary") or {}
    out = [f"session {data['session']}: route {s.get('route', '-')}, model {s.get('model') or '-'}, "
           f"{_num(s.get('requests'))} requests, prompt {_num(s.get('prompt'))}, cached {_num(s.get('cached'))}, "
           f"breaks {_num(s.get('breaks'))}",
           f"offloads {_num(s.get('offloads'))}, compactions {_num(s.get('compactions'))}, tokens saved "
           + (_saved(s) if "saved_tokens" in s else "-")
           + (f", read back {_read_back(s)}" if "handles_read" in s else ""),
           ""]
    rows = []
    for i, r in enumerate(data.get("requests") or [], 1):
        label = str(r.get("n", i))  # the proxy's own calls under the request that made them: "  3.1"
        status = (str(r.get("status")) + (" stream" if r.get("stream") else "")
                  + (" degraded" if r.get("degraded") else "")
                  + (f" {r['kind']}" if r.get("kind", "turn") != "turn" else ""))  # a count_tokens, a pass-through
        offl = f"{r.get('offloaded_new', 0)}/{r['offloaded']}" if r.get("offloaded") or r.get("offloaded_new") else "-"
        comp = r.get("compacted") or "-"
        cause = r.get("break") or (f"error: {r['error']}" if r.get("error") else "-")
        rows.append(["  " + label if "." in label else label, _clock(r["ts"]), status, _num(r.get("prompt")),
                     _num(r.get("cached")), _num(r.get("cacheable")), offl, comp, _num(r.get("saved")),
                     _num(r.get("read_rounds")), _num(r.get("overhead_ms"), 1), cause])
    if not rows:
        return out + ["no requests recorded"]
    return out + _table(["#", "TIME", "STATUS", "PROMPT", "CACHED", "CACHEABLE", "OFFLOADS NEW/IN EFFECT",
                         "COMPACTED", "SAVED", "READ ROUNDS", "OVERHEAD MS", "BREAK"], rows, "rllrrrrlrrrl")


_CLIENT_LINES = 20  # lines of a logged client message shown (`--json` has them all)


def _parts_text(content: Any) -> str:
    """Text of a content value: a string, or a list of parts (a nested tool_result's own content included)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = (p.get("text") or _parts_text(p.get("content")) for p in content if isinstance(p, dict))
    return "\n".join(t for t in texts if t)


def _text(message: Any) -> str:
    """An item as text: its content (or text parts) or a Responses output, and its tool calls: Chat's
    `tool_calls`, a Responses `function_call`/`custom_tool_call` item, Messages' `tool_use` parts."""
    if not isinstance(message, dict):
        return ""
    parts = [t for t in (_parts_text(message.get("content")), _parts_text(message.get("output"))) if t]
    parts += [f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
              for c in message.get("tool_calls") or () if isinstance(c, dict)]
    if message.get("type") in ("function_call", "custom_tool_call"):
        parts.append(f"{message.get('name')}({message.get('arguments', message.get('input'))})")
    content = message.get("content")
    parts += [f"{p.get('name')}({p.get('input')})" for p in content if isinstance(p, dict)
              and p.get("type") == "tool_use"] if isinstance(content, list) else []
    return "\n".join(parts)


def _quoted(text: str, limit: int | None = None) -> list[str]:
    lines = text.split("\n")
    shown = lines if limit is None or len(lines) <= limit else lines[:limit]
    out = ["      | " + x for x in shown]
    if len(shown) < len(lines):
        out.append(f"      | ... {len(lines) - len(shown):,} more lines")
    return out


def _client_span(rows: list[dict[str, Any]]) -> str:
    if len(rows) == 1:
        r = rows[0]
        return f"#{r['index']} ({r['role']}, {_num(r['tokens'])} tokens, {r['digest']})"
    tokens = _num(sum(r['tokens'] for r in rows))
    return f"#{rows[0]['index']}-#{rows[-1]['index']} ({len(rows)} messages, {tokens} tokens)"


def _own_call_lines(data: dict[str, Any]) -> list[str]:
    """One of the proxy's own calls (a summary): what it cost and what it sent, message by message."""
    e = data.get("entry") or {}
    out = [f"session {data['session']}, request {data['request']} ({data['request_id']}): the proxy's own "
           f"{e.get('kind')} call for request {str(data['request']).split('.')[0]}, status {e.get('status')}, model "
           f"{e.get('model') or '-'}; prompt {_num(e.get('prompt'))} tokens (cached {_num(e.get('cached'))}), "
           f"completion {_num(e.get('completion'))}", "", "what it sent, in order"]
    for i, m in enumerate(data["sent"]):
        out.append(f"  {i:>7}  {'proxy' if m['own'] else 'client':<8}  {m['role']}, {_num(m['tokens'])} tokens")
        out.extend(_quoted(m["text"], _CLIENT_LINES) if m.get("text") is not None else
                   [f"      | ({_num(m['chars'])} characters of the client's content, not recorded: "
                    "logging.log_content: false)"])
    return out


def _request_lines(data: dict[str, Any]) -> list[str]:
    if "sent" in data:
        return _own_call_lines(data)
    e, tools = data.get("entry") or {}, data["tools"]
    out = [f"session {data['session']}, request {data['request']} ({data['request_id']}): status {e.get('status')}, "
           f"model {e.get('model') or '-'}, route {e.get('route')}",
           f"client sent {_num(e.get('client_tokens'))} prompt tokens ({data['client_messages']} messages, "
           f"{len(tools['client'])} tools); upstream got {_num(e.get('sent_tokens'))} "
           f"({sum(1 for m in data['messages'] if m['position'] is not None)} messages, {len(tools['sent'])} tools"
           + (f"; {_num(e['output_reserve'])} more reserved for the answer" if e.get("output_reserve") else "")
           + "); "
           f"saved {_num(e.get('saved'))} (offload {_num(e.get('saved_offload'))}, compression "
           f"{_num(e.get('saved_compress'))}, added -{_num(e.get('added'))})",
           f"offloads {e.get('offloaded_new', 0)} new, {e.get('offloaded', 0)} in effect; compacted "
           f"{e.get('compacted') or '-'}"
           + (f" ({_num(e['tokens_before'])} -> {_num(e['tokens_after'])})" if e.get("tokens_before") else "")
           + f"; cacheable {_num(e.get('cacheable'))}, cached {_num(e.get('cached'))}; "
           f"hidden read rounds {e.get('read_rounds', 0)}"
           + ("" if data.get("client_content") else "; client content not recorded (logging.log_content: false)"),
           "", "what went upstream, in order (#: position sent; client #: the client's message index)"]
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if run:
            where = f"{run[0]['position']}" + (f"-{run[-1]['position']}" if len(run) > 1 else "")
            out.append(f"  {where:>7}  client    as sent: {_client_span(run)}")
            for r in run:
                if "message" in r:
                    out.extend(_quoted(_text(r["message"]), _CLIENT_LINES))
            run.clear()

    for m in data["messages"]:
        if m["source"] == "client":
            run.append(m)
            continue
        flush()
        replaced = m.get("replaces") or []
        what = ("in place of client " + _client_span(replaced)) if replaced else "inserted"
        if m["kind"] == "dropped":
            out.append(f"  {'-':>7}  dropped   client {_client_span(replaced)}, not sent")
            continue
        marker = ", cache marker" if m.get("cache_marker") else ""
        out.append(f"  {m['position']:>7}  {m['kind']:<8}  {m['role']}, {_num(m['tokens'])} tokens, {what}{marker}")
        out.extend(_quoted(_text(m["message"])) if m.get("message") is not None else ["      | (text not recorded)"])
    flush()
    if tools["sent"] != tools["client"]:
        out += ["", f"tools: the client's {tools['client']} ({_num(tools['client_tokens'])} tokens), sent "
                    f"{tools['sent']} ({_num(tools['sent_tokens'])} tokens)"]
    if data.get("fields"):
        out += ["", "fields the proxy added: " + ", ".join(f"{k}={v!r}" for k, v in data["fields"].items())]
    for i, rnd in enumerate(data.get("rounds") or [], 1):
        u = rnd.get("usage") or {}
        out += ["", f"hidden read-back round {i}: billed prompt {_num(u.get('prompt'))}, completion "
                    f"{_num(u.get('completion'))}, cached {_num(u.get('cached'))}"]
        for call in rnd["calls"]:
            out.append(f"  model called {call['name']}({call['arguments']})")
        for a in rnd["answers"]:
            out.append(f"  proxy answered ({_num(a['tokens'])} tokens): {a['head']}")
    return out


def stats(args: argparse.Namespace) -> None:
    import httpx

    url = args.url.rstrip("/")
    token = args.token or os.environ.get("CTXPROXY_ADMIN_TOKEN") or None
    headers = {"accept": "application/json"}
    if token:
        headers["x-ctx-admin-token"] = token
    if args.api_key:
        headers["authorization"] = f"Bearer {args.api_key}"
    authed = bool(token or args.api_key)
    with httpx.Client(headers=headers, timeout=10, follow_redirects=False) as client:
        if args.request and not args.session:
            raise Failure("--request needs --session: the session the request belongs to")
        if args.session:
            from urllib.parse import quote

            # `/` encoded too (an id may hold it), and `.`: an id `.` or `..` is never a dot segment
            path = "/ctx/v1/sessions/" + quote(args.session, safe="").replace(".", "%2E")
            if args.request:
                data = _fetch(client, url, path + "/requests/" + quote(args.request, safe=""), authed)
                text = _request_lines(data) if not args.json else None
            else:
                data = _fetch(client, url, path, authed)
                text = _session_lines(data) if not args.json else None
        else:
            stats = _fetch(client, url, "/ctx/v1/stats", authed)
            if args.json:
                data, text = stats, None
            else:
                sessions = _fetch(client, url, "/ctx/v1/sessions", authed).get("sessions") or []
                text = _stats_lines(url, args.window, stats, sessions)
    if text is None:
        import json

        print(json.dumps(data, indent=2))
    else:
        print("\n".join(text))
