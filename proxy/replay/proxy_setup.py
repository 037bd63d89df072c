"""The in-process proxy of a replay: its settings (the user's, retargeted) and its logs (kept for the report).

The user's configuration (or the built-in defaults) is used as it is, except
that every route's upstream points at the simulator (or at ``--upstream``),
the store is a temporary SQLite file, and the replayed models' window is
``--window``: what is measured is the user's proxy, on the replay's provider.

Routes keep the API they forward (``upstream.api``, else what the host of
their own base URL says, proxy/config.py), so each replayed request takes the
route it would take against the real providers; the simulator speaks every
API. Where no route would take an API the replay sends (the built-in
defaults forward to api.openai.com, which takes no Messages request), the
default route takes it, as an upstream of unknown API does. With
``--upstream`` every route forwards to that one URL, whose host decides.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import yaml

from proxy.config import DEFAULT_UPSTREAM, Settings, UpstreamSettings, build_settings
from proxy.errors import ConfigError


def _read_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{line}: {getattr(e, 'problem', e)}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of settings")
    return raw or {}


def _speaks(api: Any, base_url: Any) -> Any:
    """The API an upstream section forwards: its `api`, else what its base URL's host says (None: any)."""
    if api is not None or not isinstance(base_url, str):
        return api
    try:
        return UpstreamSettings(base_url=base_url).speaks()
    except ValueError:  # build_settings names the fault
        return None


def proxy_settings(config: str | None, upstream_url: str, store_dir: str, models: Sequence[str], window: int,
                   simulate: bool, apis: Sequence[str] = ()) -> Settings:
    """The user's configuration (or the defaults) with every upstream, the store and the models' window replaced.

    `apis`: the APIs the replay sends ("openai", "anthropic"): the default route takes one no route would.
    """
    raw = copy.deepcopy(_read_config(config))
    given = raw.get("upstream")
    top: dict[str, Any] = given if isinstance(given, dict) else {}
    top_api, top_url = top.get("api"), top.get("base_url", DEFAULT_UPSTREAM)

    def retarget(section: Any, inherited: bool) -> dict[str, Any]:
        up = dict(section) if isinstance(section, dict) else {}
        speaks = _speaks(up.get("api", top_api if inherited else None),
                         up.get("base_url", top_url if inherited else DEFAULT_UPSTREAM))
        up["base_url"] = upstream_url
        up["api"] = speaks if simulate else None
        if simulate:
            up["api_key_env"] = None  # the simulator needs no key; the replay's own header is forwarded
        return up

    raw["upstream"] = retarget(top, inherited=False)
    routes = raw.get("routes")
    if isinstance(routes, list):
        raw["routes"] = [{**r, "upstream": retarget(r.get("upstream"), inherited=True)} if isinstance(r, dict)
                         else r for r in routes]
    spoken = [raw["upstream"]["api"]] + [r["upstream"]["api"] for r in raw.get("routes") or []
                                         if isinstance(r, dict)]
    if any(not any(s in (None, api) for s in spoken) for api in apis):
        raw["upstream"]["api"] = None  # the default route takes what no route would
    raw["store"] = f"sqlite:///{os.path.join(store_dir, 'replay.db')}"
    facts = raw.get("models") if raw.get("models") is not None else {}
    if isinstance(facts, dict):  # anything else: build_settings names the fault
        facts = dict(facts)
        for m in models:
            facts[m] = {**(facts.get(m) or {}), "context_window": window}
        raw["models"] = facts
    settings = build_settings(raw, env={}, source=config or "replay settings")
    # the simulator is on loopback in this process: never through an egress proxy the environment names
    return settings.model_copy(update={"trust_env": False}) if simulate else settings


class Collect(logging.Handler):
    """The proxy's warnings and errors during a replay, kept for the report instead of the terminal."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", None) or {}
        detail = ", ".join(f"{k}={v}" for k, v in fields.items() if k in ("error", "path", "layer"))
        exc = f" ({record.exc_info[0].__name__}: {record.exc_info[1]})" if record.exc_info and record.exc_info[0] \
            else ""
        self.lines.append(f"{record.levelname.lower()}: {record.getMessage()}{exc}"
                          + (f" [{detail}]" if detail else ""))


@contextmanager
def quiet_logs() -> Iterator[Collect]:
    handler = Collect()
    saved = []
    for name in ("ctxproxy", "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        saved.append((lg, lg.handlers[:], lg.propagate, lg.level))
        lg.handlers[:] = [handler]
        lg.propagate = False
        lg.setLevel(logging.WARNING)
    try:
        yield handler
    finally:
        for lg, handlers, propagate, level in saved:
            lg.handlers[:] = handlers
            lg.propagate = propagate
            lg.setLevel(level)
