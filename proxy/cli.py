"""`ctxproxy serve | check | stats`: one-line errors on the terminal, never a traceback."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from proxy.config import Settings, load_settings
from proxy.errors import ConfigError, ProxyError
from proxy.http.routing import resolve_route
from proxy.redact import redact


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctxproxy", description="OpenAI-compatible context-managing proxy")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    check = sub.add_parser("check", help="validate the configuration and print the routes")
    for sp in (serve, check):
        sp.add_argument("--config", help="path to config.yaml (default: $CTXPROXY_CONFIG, else built-in defaults)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1, or $CTXPROXY_HOST)")
    serve.add_argument("--port", type=int, help="listen port (default 8080, or $CTXPROXY_PORT)")
    st = sub.add_parser("stats", help="print a running proxy's cache and token figures",
                        description="Fetch /ctx/v1/stats and /ctx/v1/sessions from a running proxy and print them.")
    st.add_argument("--url", default=DEFAULT_URL, help=f"the proxy's address (default {DEFAULT_URL})")
    st.add_argument("--token", help="admin token (default: $CTXPROXY_ADMIN_TOKEN): every tenant's figures")
    st.add_argument("--api-key", help="a client's API key instead: only that tenant's figures")
    st.add_argument("--window", choices=WINDOWS, default="last_day", help="totals and rows over (default last_day)")
    st.add_argument("--session", help="print this session's timeline, request by request")
    st.add_argument("--request", metavar="N", help="with --session: what request N (as numbered in the timeline, "
                                                    "or its request id) sent upstream, message by message")
    st.add_argument("--json", action="store_true",
                    help="print the proxy's JSON as it is (/ctx/v1/stats, the session with --session, the request "
                         "with --request)")
    from proxy.replay import add_arguments as replay_arguments

    replay_arguments(sub.add_parser(
        "replay", help="replay recorded agent trajectories through an in-process proxy (--simulate: no API key)",
        description="Send each turn of recorded trajectories through an in-process ctxproxy and straight to a "
                    "provider simulator, and compare tokens, cache hits, rejections and cost."))
    return p


def _settings(args: argparse.Namespace) -> Settings:
    env = dict(os.environ)
    if getattr(args, "host", None):
        env["CTXPROXY_HOST"] = args.host
    if getattr(args, "port", None):
        env["CTXPROXY_PORT"] = str(args.port)
    return load_settings(args.config, env)


def _serve(settings: Settings) -> None:
    import uvicorn

    from proxy.app import create_app
    from proxy.http.server import uvicorn_options
    from proxy.logs import event, setup_logging
    from proxy.tokens.encodings import TokenizerUnavailable, ensure_encodings

    setup_logging(settings.logging.level)
    try:
        ensure_encodings()
    except TokenizerUnavailable as e:
        raise SystemExit(f"ctxproxy: {e}") from None
    server = settings.server
    event("ctxproxy starting", listen=f"http://{server.host}:{server.port}", store=redact(settings.store),
          routes={r.name: redact(r.upstream.base_url) for r in settings.routes},
          header_timeout=server.header_timeout, body_timeout=server.body_timeout,
          keep_alive_timeout=server.keep_alive_timeout, max_connections=server.max_connections)
    uvicorn.run(create_app(settings), host=server.host, port=server.port, loop="uvloop", access_log=False,
                log_config=None, timeout_graceful_shutdown=30, server_header=False, date_header=False,
                **uvicorn_options(server))


def _check(settings: Settings) -> None:
    print(f"store: {redact(settings.store)}")
    for r in settings.routes:
        glob = r.match.model or "-"
        key = f"key from ${r.upstream.api_key_env}" if r.upstream.api_key_env else "client's key"
        api = r.upstream.speaks() or "openai+anthropic"
        print(f"route {r.name}: model {glob} -> {redact(r.upstream.base_url)} ({api} API, {key})")
    for api, path in (("openai", "/v1/chat/completions, /v1/responses"), ("anthropic", "/v1/messages")):
        try:
            taker = resolve_route(settings, None, {}, None, api).name  # type: ignore[arg-type]
        except ProxyError:
            taker = None
        print(f"{path} without a route: " + (f"route {taker}" if taker else
              f"refused (no route's upstream speaks the {api} API; set upstream.api on one)"))
    for w in config_warnings(settings):
        print(f"warning: {w}", file=sys.stderr)


_VERSION_PATH = re.compile(r"/v\d+[a-z0-9]*(?:/|$)", re.IGNORECASE)


def config_warnings(settings: Settings) -> list[str]:
    """What is valid but probably not meant: said at start-up and by `check`, never fatal."""
    out = []
    for r in settings.routes:
        base = r.upstream.base_url
        host = (urlsplit(base).hostname or "").lower()
        for api, domain in (("anthropic", "openai.com"), ("openai", "anthropic.com")):
            if r.upstream.api == api and (host == domain or host.endswith("." + domain)):
                out.append(f"route {r.name}: upstream.api is {api}, but {base} is {domain}'s; requests of that "
                           f"API will be refused there")
        if not _VERSION_PATH.search(urlsplit(base).path):
            out.append(f"route {r.name}: upstream {base} has no version path such as /v1; chat requests will go "
                       f"to {base}/chat/completions (most providers want {base}/v1)")
    return out


def startup_line(settings: Settings, source: str) -> str:
    """One line that says where requests will go, where state is kept and which config was read."""
    routes = ", ".join(f"{r.name} -> {redact(r.upstream.base_url)}" for r in settings.routes)
    return (f"ctxproxy: listening on http://{settings.server.host}:{settings.server.port}; routes: {routes}; "
            f"store: {redact(settings.store)}; config: {source}")


# --------------------------------------------------------------------------- stats

DEFAULT_URL = "http://127.0.0.1:8080"
WINDOWS = ("last_hour", "last_day", "all")
_WINDOW_NAMES = {"last_hour": "last hour", "last_day": "last day", "all": "all time"}
_RECENT_SESSIONS = 20


class _Failure(Exception):
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
        raise _Failure(f"invalid --url {url!r}: {e}") from None
    except httpx.HTTPError as e:
        raise _Failure(f"cannot reach the proxy at {url}: {e or type(e).__name__}") from None
    try:
        body = r.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if r.status_code == 401:
        raise _Failure("the proxy wants the admin token: pass --token or set CTXPROXY_ADMIN_TOKEN"
                       + (" (the one given was refused)" if authed else ""))
    if r.status_code >= 400:
        said = message or r.text[:200].strip() or r.reason_phrase
        raise _Failure(f"the proxy at {url} answered {r.status_code}: {said}")
    if body is None:
        raise _Failure(f"{url}{path} did not answer with JSON: is it a ctxproxy?")
    return body


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
        ("cache breaks", _num(t["breaks"])),
        ("offloads", _num(t["offloads"])),
        ("compactions", _num(t["compactions"])),
        ("read back", _read_back(t)),
        ("own calls", f"{_num(t['own_calls'])} (prompt {_num(t['own_prompt'])}, cached {_num(t['own_cached'])})"),
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
        status = (str(r.get("status")) + (" stream" if r.get("stream") else "")
                  + (" degraded" if r.get("degraded") else "")
                  + (f" {r['kind']}" if r.get("kind", "turn") != "turn" else ""))  # a count_tokens, a pass-through
        offl = f"{r.get('offloaded_new', 0)}/{r['offloaded']}" if r.get("offloaded") or r.get("offloaded_new") else "-"
        comp = r.get("compacted") or "-"
        cause = r.get("break") or (f"error: {r['error']}" if r.get("error") else "-")
        rows.append([str(i), _clock(r["ts"]), status, _num(r.get("prompt")), _num(r.get("cached")),
                     _num(r.get("cacheable")), offl, comp, _num(r.get("saved")), _num(r.get("read_rounds")),
                     _num(r.get("overhead_ms"), 1), cause])
    if not rows:
        return out + ["no requests recorded"]
    return out + _table(["#", "TIME", "STATUS", "PROMPT", "CACHED", "CACHEABLE", "OFFLOADS NEW/IN EFFECT",
                         "COMPACTED", "SAVED", "READ ROUNDS", "OVERHEAD MS", "BREAK"], rows, "rllrrrrlrrrl")


_CLIENT_LINES = 20  # lines of a logged client message shown (`--json` has them all)


def _text(message: Any) -> str:
    """A message as text: its content (or text parts) and its tool calls."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    parts = [content] if isinstance(content, str) and content else []
    parts += [f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
              for c in message.get("tool_calls") or () if isinstance(c, dict)]
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


def _request_lines(data: dict[str, Any]) -> list[str]:
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


def _stats(args: argparse.Namespace) -> None:
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
            raise _Failure("--request needs --session: the session the request belongs to")
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


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "replay":
        from proxy.replay import main as replay_main

        raise SystemExit(replay_main(args))
    if args.command == "stats":
        try:
            _stats(args)
        except _Failure as e:
            print(redact(f"ctxproxy: {e}"), file=sys.stderr)
            raise SystemExit(1) from None
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            print(redact(f"ctxproxy: unexpected answer from the proxy at {args.url} ({type(e).__name__}: {e})"),
                  file=sys.stderr)
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            raise SystemExit(130) from None
        except BrokenPipeError:  # `ctxproxy stats | head`: the reader left, nothing to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        return
    try:
        settings = _settings(args)
    except ConfigError as e:
        print(redact(f"ctxproxy: invalid configuration: {e}"), file=sys.stderr)
        raise SystemExit(2) from None
    if args.command == "serve":
        print(startup_line(settings, args.config or os.environ.get("CTXPROXY_CONFIG") or "built-in defaults"),
              flush=True)
        for w in config_warnings(settings):
            print(f"ctxproxy: warning: {w}", file=sys.stderr, flush=True)
        _serve(settings)
    else:
        _check(settings)


if __name__ == "__main__":
    main()
