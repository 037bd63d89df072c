"""`ctxproxy serve | check`: one-line errors on the terminal, never a traceback."""

from __future__ import annotations

import argparse
import os
import sys

from proxy.config import Settings, load_settings
from proxy.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctxproxy", description="OpenAI-compatible context-managing proxy")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    check = sub.add_parser("check", help="validate the configuration and print the routes")
    for sp in (serve, check):
        sp.add_argument("--config", help="path to config.yaml (default: $CTXPROXY_CONFIG, else built-in defaults)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1, or $CTXPROXY_HOST)")
    serve.add_argument("--port", type=int, help="listen port (default 8080, or $CTXPROXY_PORT)")
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
    from proxy.encodings import TokenizerUnavailable, ensure_encodings
    from proxy.logs import setup_logging

    setup_logging(settings.logging.level)
    try:
        ensure_encodings()
    except TokenizerUnavailable as e:
        raise SystemExit(f"ctxproxy: {e}") from None
    uvicorn.run(create_app(settings), host=settings.server.host, port=settings.server.port,
                loop="uvloop", http="httptools", access_log=False, log_config=None,
                timeout_graceful_shutdown=30, server_header=False, date_header=False)


def _check(settings: Settings) -> None:
    print(f"store: {settings.store.split('@')[-1]}")
    for r in settings.routes:
        glob = r.match.model or "-"
        key = f"key from ${r.upstream.api_key_env}" if r.upstream.api_key_env else "client's key"
        print(f"route {r.name}: model {glob} -> {r.upstream.base_url} ({key})")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
    except ConfigError as e:
        print(f"ctxproxy: invalid configuration: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.command == "serve":
        _serve(settings)
    else:
        _check(settings)


if __name__ == "__main__":
    main()
