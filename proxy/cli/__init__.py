"""`ctxproxy serve | check | stats`: one-line errors on the terminal, never a traceback."""

from __future__ import annotations

import argparse
import os
import socket
import sys

from proxy.cli.check import check, config_warnings, startup_line
from proxy.cli.stats import DEFAULT_URL, WINDOWS, Failure, stats
from proxy.config import Settings, load_settings
from proxy.errors import ConfigError
from proxy.redact import redact, redact_url, register_secrets, register_settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctxproxy", description="OpenAI-compatible context-managing proxy")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    check_p = sub.add_parser("check", help="validate the configuration and print the routes")
    for sp in (serve, check_p):
        sp.add_argument("--config", help="path to config.yaml (default: $CTXPROXY_CONFIG, else built-in defaults)")
    check_p.add_argument("--offline", action="store_true",
                         help="only validate and print: do not ask the store and the upstreams")
    serve.add_argument("--host", help="listen address (default 127.0.0.1, or $CTXPROXY_HOST)")
    serve.add_argument("--port", type=int, help="listen port (default 8080, or $CTXPROXY_PORT)")
    serve.add_argument("--workers", metavar="N", help="processes serving the port, sharing the store (default 1, "
                                                      "or $CTXPROXY_WORKERS, or server.workers)")
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
    if getattr(args, "workers", None) is not None:  # a string: the config's validation words a bad one
        env["CTXPROXY_WORKERS"] = args.workers
    return load_settings(args.config, env)


def _listen(settings: Settings) -> list[socket.socket]:
    """The sockets `serve` will serve, bound and listening (proxy/cli/worker_sockets.py): one per address for a
    single process, one per worker with --workers N. An address it cannot listen on ends the process here, in
    one line on stderr and exit status 3, before anything says "listening"."""
    from uvicorn.config import STARTUP_FAILURE

    from proxy.cli.worker_sockets import CannotListen, bind_addresses, bind_sockets

    server = settings.server
    try:
        if server.workers > 1:
            return bind_sockets(server.host, server.port, server.workers)
        return bind_addresses(server.host, server.port)
    except CannotListen as e:
        print(redact(f"ctxproxy: {e}"), file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None


def _serve(settings: Settings, sockets: list[socket.socket]) -> None:
    """Serve on `sockets` (from _listen) until SIGTERM/SIGINT; exit status 3 if the server fails to start."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from proxy.app import create_app
    from proxy.cli.worker_sockets import log_listening
    from proxy.http.server import uvicorn_options
    from proxy.logs import event, setup_logging
    from proxy.tokens.encodings import TokenizerUnavailable, ensure_encodings

    setup_logging(settings.logging.level)
    try:
        ensure_encodings()
    except TokenizerUnavailable as e:
        raise SystemExit(f"ctxproxy: {e}") from None
    server = settings.server
    event("ctxproxy starting", listen=f"http://{server.host}:{server.port}", store=redact_url(settings.store),
          routes={r.name: redact_url(r.upstream.base_url) for r in settings.routes},
          header_timeout=server.header_timeout, body_timeout=server.body_timeout,
          keep_alive_timeout=server.keep_alive_timeout, max_connections=server.max_connections,
          workers=server.workers)
    options = {"host": server.host, "port": server.port, "loop": "uvloop", "access_log": False, "log_config": None,
               "timeout_graceful_shutdown": 30, "server_header": False, "date_header": False,
               **uvicorn_options(server)}
    if server.workers > 1:
        from proxy.cli.workers import serve_workers

        serve_workers(settings, options, sockets)
        return
    config = uvicorn.Config(create_app(settings), **options)
    log_listening(config, sockets)
    single = uvicorn.Server(config)
    try:
        single.run(sockets=sockets)  # what uvicorn.run does, on the sockets bound already
    except KeyboardInterrupt:
        pass
    if not single.started:
        raise SystemExit(STARTUP_FAILURE)


def main(argv: list[str] | None = None) -> None:
    """Run one command; its exit status: 0 done (serve: stopped by SIGTERM/SIGINT), 1 a command failed (check: a
    store that does not answer; stats: no answer from the proxy), 2 an invalid configuration, 3 serve could not
    start (an address it cannot listen on, such as a port already in use, said in one line on stderr; or the
    app failed to start), 130 interrupted."""
    args = _parser().parse_args(argv)
    if args.command == "replay":
        from proxy.replay import main as replay_main

        raise SystemExit(replay_main(args))
    if args.command == "stats":
        register_secrets(args.token, os.environ.get("CTXPROXY_ADMIN_TOKEN"), args.api_key)  # an error may echo one
        try:
            stats(args)
        except Failure as e:
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
    register_settings(settings)  # before anything is printed: no line may show a password or key it holds
    if args.command == "serve":
        sockets = _listen(settings)  # "listening" only once it is
        print(startup_line(settings, args.config or os.environ.get("CTXPROXY_CONFIG") or "built-in defaults"),
              flush=True)
        for w in config_warnings(settings):
            print(redact(f"ctxproxy: warning: {w}"), file=sys.stderr, flush=True)
        _serve(settings, sockets)
    else:
        try:
            code = check(settings, offline=args.offline)
        except KeyboardInterrupt:
            raise SystemExit(130) from None
        except BrokenPipeError:  # `ctxproxy check | head`: the reader left, nothing to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        raise SystemExit(code)
