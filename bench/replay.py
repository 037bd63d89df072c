#!/usr/bin/env python3
"""Trajectory replay harness: real agent conversations, turn by turn, through each setting.

Every trajectory in ``/work/shared/traces`` (``$CTXPROXY_TRACES_DIR``) is
replayed as the agent that recorded it would have sent it: for each assistant
message at index ``i``, one non-streaming chat completion with ``messages[:i]``
(plus the trajectory's ``tools`` if it has them), model ``gpt-4o``,
sequentially. The provider's answer is ignored: the recorded assistant message
is what the next turn carries, so every setting sees exactly the same client
traffic.

The provider is the mock in ``tests/mock_upstream.py``, in this process (its
``requests`` list is read after every turn). It bills ``prompt_tokens`` and
``cached_tokens`` from a real token-prefix comparison with earlier prompts of
the same cache scope (``Authorization`` + model) and rejects prompts over its
window with HTTP 400 ``context_length_exceeded``. Each (setting, trajectory)
pair sends its own key, ``Bearer sk-replay-<setting>-<trace>``, so neither
provider caches nor proxy tenants mix, and the mock is reset between settings.

Settings live in a small registry (``SETTINGS``; ``register_setting`` adds
one). Four kinds:

* straight to the mock (``no-proxy``);
* client-side context management, straight to the mock: ``sliding-window-20``
  (system message(s) + the last 20 messages, leading orphan tool results
  dropped) and ``middle-out`` (OpenRouter-style: over the window, whole
  assistant+tool units are removed from the middle until the prompt fits);
* ctxproxy (``proxy_config`` = its config file; ``{}`` = built-in defaults;
  ``window_model`` adds ``models: {gpt-4o: {context_window: <--window>}}``):
  ``ctxproxy-default``, ``ctxproxy-offload-1000``, ``ctxproxy``,
  ``ctxproxy-no-status-bar``, ``ctxproxy-status-replace`` (status bar in
  ``replace`` mode). By default the proxy runs as users run it,
  ``python -m proxy.cli serve`` in a subprocess with ``CTXPROXY_UPSTREAM``
  pointing at the mock and a fresh SQLite store in a temporary directory per
  setting (``--proxy-mode inprocess`` runs ``tests/proxy_server.py`` in a
  thread instead);
* open-source proxies (``external_proxies.py``): ``cliffcompaction``,
  ``cliffcompaction-at-window`` and ``ctxkeeper``, each pip-installed (pinned)
  into its own virtualenv under ``bench/.venvs/`` by the benchmark itself and
  run as a subprocess; one that cannot be installed or started is reported
  with the exact error and skipped.

The proxies' own LLM calls (ctxproxy's summarizer, ctxkeeper's notes) reach
the same mock, which answers them with a deterministic digest of what they
send (``fake_llm.py``: the first line of each message being compacted, ~500
tokens), and everything else with "ok".

Per setting: requests sent, rejected (any non-200; of which
``context_length_exceeded``), provider-side 400s (also those a proxy retried),
prompt and cached tokens billed by the provider (successful requests, the
proxy's own calls included), hit rate = cached / prompt (and for the agent's
requests alone), effective input cost units = uncached + 0.1 x cached, the
proxy's own calls (number, prompt tokens, cost), prompt tokens relative to
``no-proxy`` (all requests, and over only the turns that succeeded in both),
wall time, cache breaks (a served request that re-bills more than 1,024 tokens
of the previous served request's prompt), ctxproxy's compactions by layer
(``x-ctxproxy-compacted``) and each compacted-history message (summary,
notes, cliff summary) with its size, and identifier retention
(``identifiers.py``): the share of file paths, URLs and hashes named in the
user and assistant messages of the trajectory that are still in the last
request the provider served for it (also over identifiers first named after
the head, and over the trajectories that pass 0.85 x the window; for ctxproxy,
why each lost one was lost). Checks, on every request the provider received:

* tool-call pairing (``tool_pairing_problems``): each assistant tool call id
  is answered by a tool message before the next assistant message, and every
  tool message answers a call of the assistant message before it;
* previews (ctxproxy, requests whose messages line up with the client's once
  status-bar messages are set aside): every message whose content was replaced
  by a placeholder (contains ``context_read(handle="``) costs fewer tokens (the
  mock's own tokenizer and rendering) than the trajectory's message at that
  position; the same original is always replaced by the same bytes; no other
  message is altered; no placeholder in a request that offers no read tool.

Usage (from the repo root)::

    python bench/replay.py [--window 128000] [--settings no-proxy,ctxproxy-default,ctxproxy-offload-1000]
                           [--traces 01,19] [--json out.json] [--final-turn] [--per-trace]
                           [--proxy-src DIR] [--proxy-mode subprocess|inprocess]
    python bench/replay.py --window 32000 --settings compress [--per-trace] ...   # issue 4's comparison

``--settings`` takes names or groups (``offload``: the default three;
``compress``: no-proxy, sliding-window-20, middle-out, ctxproxy,
ctxproxy-no-status-bar, cliffcompaction, ctxkeeper; ``status-bar``: ctxproxy,
ctxproxy-no-status-bar, ctxproxy-status-replace, whose table and issue 5's
check, hit rate with the status bar within 2 points of without, are printed
when two of them run). ``--final-turn`` also
sends each whole trajectory that ends on a tool or user message (the turn an
agent that kept going would send next: in this corpus the two biggest tool
results are final messages no recorded turn carries). ``--proxy-src DIR`` runs
the ``proxy`` package from DIR (e.g. a ``git archive`` snapshot) instead of
the installed working tree.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

if HERE not in sys.path:
    sys.path.insert(0, HERE)

from tests import mock_upstream as mu  # noqa: E402  (needs ROOT on sys.path)

import external_proxies as ext  # noqa: E402  (bench/)
import fake_llm  # noqa: E402
import identifiers as idents  # noqa: E402

TRACES_DIR = os.environ.get("CTXPROXY_TRACES_DIR", "/work/shared/traces")
MODEL = "gpt-4o"
BASELINE = "no-proxy"
PLACEHOLDER_MARK = 'context_read(handle="'  # also matches the alternate names (ctxproxy_context_read...)
CACHED_PRICE = 0.1  # a cached input token costs this share of an uncached one
REQUEST_TIMEOUT = 300.0  # seconds, per request (bounded: nothing here waits forever)
START_TIMEOUT = 30.0  # seconds for the proxy to answer /healthz
DEFAULT_OFFLOAD_TOOL_TOKENS = 20_000  # proxy/rewrite/offload.py defaults, for the "missed" check
DEFAULT_OFFLOAD_USER_TOKENS = 50_000


# --------------------------------------------------------------------------- settings registry

@dataclass(frozen=True)
class Setting:
    """One way of sending the trajectories to the provider.

    ``proxy_config`` None: not through ctxproxy. A mapping: ctxproxy's config
    file (YAML) for this setting; ``{}`` is the proxy's built-in defaults, and
    ``window_model`` adds ``models: {gpt-4o: {context_window: <--window>}}``.
    ``transform`` (client-side context management, straight to the mock):
    ``(messages, tools, window) -> messages`` applied to each request's messages.
    ``external``: the name of an open-source proxy in ``external_proxies.EXTERNALS``,
    installed into its own virtualenv and run in front of the mock.
    """

    name: str
    description: str
    proxy_config: dict[str, Any] | None = None
    transform: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, int], list[dict[str, Any]]] | None = None
    external: str | None = None
    window_model: bool = False

    @property
    def proxied(self) -> bool:
        """Through ctxproxy."""
        return self.proxy_config is not None

    @property
    def kind(self) -> str:
        return ("ctxproxy" if self.proxied else "external" if self.external else
                "client" if self.transform else "direct")

    def config_for(self, window: int) -> dict[str, Any]:
        """ctxproxy's config file for this setting at this window."""
        config = dict(self.proxy_config or {})
        if self.window_model:
            models = dict(config.get("models") or {})
            models[MODEL] = {**(models.get(MODEL) or {}), "context_window": window}
            config["models"] = models
        return config

    def offload_thresholds(self) -> tuple[int, int] | None:
        """(tool_result_tokens, user_message_tokens) when offload is on, for the checks."""
        if self.proxy_config is None:
            return None
        off = (self.proxy_config.get("defaults") or {}).get("offload") or {}
        if off.get("enabled", True) is False:
            return None
        return (int(off.get("tool_result_tokens", DEFAULT_OFFLOAD_TOOL_TOKENS)),
                int(off.get("user_message_tokens", DEFAULT_OFFLOAD_USER_TOKENS)))


SETTINGS: dict[str, Setting] = {}


def register_setting(setting: Setting) -> Setting:
    """Add a setting to the registry."""
    if setting.name in SETTINGS:
        raise ValueError(f"setting {setting.name!r} already registered")
    SETTINGS[setting.name] = setting
    return setting


# --------------------------------------------------------------------------- client-side context management

def _message_tokens_list(messages: list[dict[str, Any]]) -> list[int]:
    return [len(mu.tokens(mu.render_message(m))) for m in messages]


def _tools_tokens(tools: list[dict[str, Any]] | None) -> int:
    return len(mu.tokens("<|tools|>" + json.dumps(tools))) if tools else 0


def sliding_window(keep: int) -> Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, int], list[dict[str, Any]]]:
    """System message(s) + the last `keep` messages; leading orphan tool messages dropped (pairing stays valid)."""
    def transform(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  window: int) -> list[dict[str, Any]]:
        h = 0
        while h < len(messages) and messages[h].get("role") in ("system", "developer"):
            h += 1
        tail = messages[h:][-keep:]
        while tail and tail[0].get("role") == "tool":
            tail = tail[1:]
        return messages[:h] + tail
    return transform


def _units(messages: list[dict[str, Any]], start: int) -> list[tuple[int, int]]:
    """[lo, hi) spans from `start`: an assistant message with the tool messages after it, or one other message."""
    out, i = [], start
    while i < len(messages):
        j = i + 1
        if messages[i].get("role") == "assistant":
            while j < len(messages) and messages[j].get("role") == "tool":
                j += 1
        out.append((i, j))
        i = j
    return out


def middle_out(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               window: int) -> list[dict[str, Any]]:
    """OpenRouter-style middle-out: over the window, remove messages from the middle until the prompt fits.

    Stateless, per request. The leading system message(s) always stay; the rest
    is cut into units (an assistant message with its tool results, or one other
    message) and the k units around the middle are removed, k the smallest that
    fits (binary search; the removed block grows around the same centre, so the
    size is monotonic in k). The first and the last unit always stay, so the
    request may still be over when the newest message alone is too big. The
    window is the mock's exact count (the client is assumed to know it).
    """
    counts = _message_tokens_list(messages)
    fixed = _tools_tokens(tools)
    if fixed + sum(counts) <= window:
        return messages
    h = 0
    while h < len(messages) and messages[h].get("role") in ("system", "developer"):
        h += 1
    units = _units(messages, h)
    if len(units) < 3:
        return messages
    sizes = [sum(counts[a:b]) for a, b in units]
    total = fixed + sum(counts)
    mid = len(units) // 2

    def block(k: int) -> tuple[int, int]:
        lo = max(1, mid - k // 2)
        hi = min(len(units) - 1, lo + k)
        lo = max(1, hi - k)
        return lo, hi

    def fits(k: int) -> bool:
        lo, hi = block(k)
        return total - sum(sizes[lo:hi]) <= window

    lo_k, hi_k = 1, len(units) - 2
    if not fits(hi_k):
        k = hi_k
    else:
        while lo_k < hi_k:
            m = (lo_k + hi_k) // 2
            if fits(m):
                hi_k = m
            else:
                lo_k = m + 1
        k = lo_k
    a, b = block(k)
    return messages[:units[a][0]] + messages[units[b - 1][1]:]


register_setting(Setting(BASELINE, "straight to the mock provider"))
register_setting(Setting("ctxproxy-default", "ctxproxy, built-in defaults (offload on, tool results > 20k tokens)",
                         {}))
register_setting(Setting("ctxproxy-offload-1000", "ctxproxy, offload.tool_result_tokens: 1000",
                         {"defaults": {"offload": {"tool_result_tokens": 1000}}}))
register_setting(Setting("sliding-window-20", "client-side: system message(s) + last 20 messages (leading orphan "
                                              "tool results dropped), straight to the mock",
                         transform=sliding_window(20)))
register_setting(Setting("middle-out", "client-side, OpenRouter-style: over the window, middle messages removed "
                                       "(whole assistant+tool units) until it fits, straight to the mock",
                         transform=middle_out))
register_setting(Setting("ctxproxy", "ctxproxy, built-in defaults + models: {gpt-4o: {context_window: <window>}}",
                         {}, window_model=True))
register_setting(Setting("ctxproxy-no-status-bar", "as ctxproxy, with defaults.status_bar.enabled: false (proxy "
                                                   "commits with a status bar, 23f7ccd and later)",
                         {"defaults": {"status_bar": {"enabled": False}}}, window_model=True))
register_setting(Setting("ctxproxy-status-replace", "as ctxproxy, with defaults.status_bar.mode: replace (only the "
                                                    "latest status message is sent; issue 5)",
                         {"defaults": {"status_bar": {"mode": "replace"}}}, window_model=True))
register_setting(Setting("cliffcompaction", "cliffcompaction==0.1.0 (cliff serve --threshold 0.85 x window)",
                         external="cliffcompaction"))
register_setting(Setting("cliffcompaction-at-window", "cliffcompaction==0.1.0 (cliff serve --threshold <window>)",
                         external="cliffcompaction-at-window"))
register_setting(Setting("ctxkeeper", "ctxkeeper==1.2.0 (--recipe agent --budget <window>)", external="ctxkeeper"))

DEFAULT_SETTINGS = [BASELINE, "ctxproxy-default", "ctxproxy-offload-1000"]
COMPRESS_SETTINGS = [BASELINE, "sliding-window-20", "middle-out", "ctxproxy", "ctxproxy-no-status-bar",
                     "cliffcompaction", "ctxkeeper"]
STATUS_BAR_SETTINGS = ["ctxproxy", "ctxproxy-no-status-bar", "ctxproxy-status-replace"]
FRONTIER_SETTINGS = [f"ctxproxy+compress.trigger={t}" + extra for extra in ("", "+status_bar.enabled=false")
                     for t in (0.5, 0.6, 0.7)]
SETTING_GROUPS = {"offload": DEFAULT_SETTINGS, "compress": COMPRESS_SETTINGS, "status-bar": STATUS_BAR_SETTINGS,
                  "frontier": FRONTIER_SETTINGS}


def derived_setting(name: str) -> Setting | None:
    """`ctxproxy+section.key=value+...`: ctxproxy with those defaults overridden (values read as YAML).

    So a trade-off (e.g. the compaction trigger against hit rate and cost) is reproduced by naming the
    settings on the command line, with nothing edited.
    """
    base, _, rest = name.partition("+")
    if base != "ctxproxy" or not rest:
        return None
    defaults: dict[str, Any] = {}
    for item in rest.split("+"):
        key, eq, value = item.partition("=")
        section, dot, field_ = key.partition(".")
        if not (eq and dot and section and field_):
            raise ValueError(f"setting {name!r}: expected section.key=value, got {item!r}")
        defaults.setdefault(section, {})[field_] = yaml.safe_load(value)
    return register_setting(Setting(name, f"as ctxproxy, with defaults {json.dumps(defaults)}",
                                    {"defaults": defaults}, window_model=True))


# --------------------------------------------------------------------------- trajectories

@dataclass
class Trace:
    id: str  # "01"
    name: str  # file name without .json
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None

    def turns(self, final: bool = False) -> list[int]:
        """Indexes of the assistant messages: one request per index, with messages[:i].

        `final`: when the trajectory ends on a tool or user message, also len(messages),
        the request an agent that kept going would send next (the recorded runs stop
        there: e.g. mini-swe-agent's last tool result is its submission diff).
        """
        out = [i for i, m in enumerate(self.messages) if m.get("role") == "assistant"]
        if final and self.messages and self.messages[-1].get("role") != "assistant":
            out.append(len(self.messages))
        return out


def load_traces(directory: str = TRACES_DIR, select: Iterable[str] | None = None) -> list[Trace]:
    """Trajectories in file order; `select` keeps those whose id (file-name prefix) is listed."""
    wanted = {s.strip().zfill(2) for s in select} if select else None
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        name = os.path.basename(path)[:-5]
        tid = name.split("_", 1)[0]
        if wanted is not None and tid not in wanted:
            continue
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        out.append(Trace(tid, name, data["messages"], data.get("tools") or None))
    if wanted is not None and {t.id for t in out} != wanted:
        missing = sorted(wanted - {t.id for t in out})
        raise SystemExit(f"replay: no trajectory {', '.join(missing)} in {directory}")
    return out


def request_body(trace: Trace, i: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": trace.messages[:i]}
    if trace.tools:
        body["tools"] = trace.tools
    return body


def encode_body(body: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as httpx >= 0.28 (the OpenAI SDK's transport) sends it."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# --------------------------------------------------------------------------- checks (reusable)

def tool_pairing_problems(messages: list[dict[str, Any]], strict: bool = False) -> list[str]:
    """What is wrong with the tool-call pairing of one request's messages ([] = valid).

    Each tool call id of an assistant message must be answered by a tool message
    after it and before the next assistant message (or the end of the request);
    each tool message must answer a call of the latest assistant message, once.
    `strict` adds OpenAI's stricter rule: the answers follow the call immediately,
    with no other message between them.
    """
    problems: list[str] = []
    open_at = -1  # index of the assistant message whose calls are being answered
    calls: set[str] = set()
    pending: set[str] = set()
    for j, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            if pending:
                problems.append(f"messages[{open_at}]: tool call(s) {sorted(pending)} unanswered "
                                f"before the next assistant message [{j}]")
            ids = [c.get("id") for c in m.get("tool_calls") or [] if isinstance(c, dict)]
            if len(set(ids)) != len(ids):
                problems.append(f"messages[{j}]: duplicate tool call ids {ids}")
            if any(not isinstance(x, str) or not x for x in ids):
                problems.append(f"messages[{j}]: tool call without an id")
            open_at, calls, pending = j, {x for x in ids if isinstance(x, str)}, {x for x in ids if isinstance(x, str)}
        elif role == "tool":
            tid = m.get("tool_call_id")
            if tid not in calls:
                problems.append(f"messages[{j}]: tool message for {tid!r} answers no call of the "
                                f"preceding assistant message [{open_at}]")
            elif tid not in pending:
                problems.append(f"messages[{j}]: second tool message for {tid!r}")
            else:
                pending.discard(tid)
        elif strict and pending:
            problems.append(f"messages[{j}]: {role} message between tool call(s) {sorted(pending)} "
                            f"of [{open_at}] and their results")
    if pending:
        problems.append(f"messages[{open_at}]: tool call(s) {sorted(pending)} unanswered at the end of the request")
    return problems


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def message_tokens(message: dict[str, Any]) -> int:
    """Tokens the mock provider bills for one message (its own rendering and o200k_base)."""
    return len(mu.tokens(mu.render_message(message)))


def _digest(message: Any) -> str:
    return hashlib.blake2b(json.dumps(message, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass"),
                           digest_size=12).hexdigest()


@dataclass
class RewriteCheck:
    """Accumulates the preview / transparency checks over the requests of one trajectory."""

    thresholds: tuple[int, int] | None  # (tool, user) offload thresholds of the setting, if any
    rewritten: dict[int, set[str]] = field(default_factory=dict)  # position -> digests of its placeholders
    sizes: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # position -> (orig, new, role)
    larger: list[dict[str, Any]] = field(default_factory=list)  # preview >= original (violations)
    altered: list[dict[str, Any]] = field(default_factory=list)  # changed without a placeholder
    missing_read_tool: list[dict[str, Any]] = field(default_factory=list)  # placeholder, but no tools offered
    length_mismatch: list[dict[str, Any]] = field(default_factory=list)
    messages_checked: int = 0

    def check(self, turn: int, original: list[dict[str, Any]], sent: dict[str, Any]) -> None:
        """`original` = the client's messages[:turn]; `sent` = the body the provider received."""
        upstream = sent.get("messages") or []
        if len(upstream) < len(original):
            self.length_mismatch.append({"turn": turn, "client": len(original), "provider": len(upstream)})
        has_tools = bool(sent.get("tools"))
        for j, (orig, new) in enumerate(zip(original, upstream)):
            self.messages_checked += 1
            if new == orig:
                continue
            text, before = content_text(new.get("content")), content_text(orig.get("content"))
            if PLACEHOLDER_MARK in text and PLACEHOLDER_MARK not in before:
                self.rewritten.setdefault(j, set()).add(_digest(new))
                if j not in self.sizes:
                    self.sizes[j] = (message_tokens(orig), message_tokens(new), str(orig.get("role")))
                o, n, role = self.sizes[j]
                if n >= o:
                    self.larger.append({"turn": turn, "position": j, "role": role, "original_tokens": o,
                                        "preview_tokens": n})
                if not has_tools:
                    self.missing_read_tool.append({"turn": turn, "position": j})
                rest_new = {k: v for k, v in new.items() if k != "content"}
                rest_orig = {k: v for k, v in orig.items() if k != "content"}
                if rest_new != rest_orig:
                    self.altered.append({"turn": turn, "position": j,
                                         "what": "non-content fields of a rewritten message"})
            else:
                self.altered.append({"turn": turn, "position": j, "role": orig.get("role"),
                                     "what": "changed without a placeholder"})

    def missed(self, messages: list[dict[str, Any]], last_turn: int) -> list[dict[str, Any]]:
        """Messages sent at least once, clearly over the threshold (mock tokens > 1.1 x), never offloaded."""
        if self.thresholds is None:
            return []
        tool_t, user_t = self.thresholds
        out = []
        for j, m in enumerate(messages[:last_turn]):
            limit = tool_t if m.get("role") in ("tool", "function") else user_t if m.get("role") == "user" else None
            if limit is None or j in self.rewritten:
                continue
            n = message_tokens(m)
            if n > limit * 1.1:
                out.append({"position": j, "role": m.get("role"), "tokens": n})
        return out

    def summary(self) -> dict[str, Any]:
        ratios = [n / o for o, n, _ in self.sizes.values() if o]
        return {
            "messages_checked": self.messages_checked,
            "rewritten_messages": len(self.rewritten),
            "original_tokens": sum(o for o, _, _ in self.sizes.values()),
            "preview_tokens": sum(n for _, n, _ in self.sizes.values()),
            "max_preview_share": round(max(ratios), 4) if ratios else None,
            "detail": [{"position": j, "role": role, "original_tokens": o, "preview_tokens": n}
                       for j, (o, n, role) in sorted(self.sizes.items())],
            "preview_not_smaller": self.larger,
            "unstable_rewrites": sorted(j for j, d in self.rewritten.items() if len(d) > 1),
            "altered_without_placeholder": self.altered,
            "placeholder_without_read_tool": self.missing_read_tool,
            "fewer_messages_upstream": self.length_mismatch,
        }


# --------------------------------------------------------------------------- targets

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def proxy_subprocess(config: dict[str, Any], upstream: str, tmp: str,
                     src: str | None = None) -> Iterator[dict[str, Any]]:
    """`python -m proxy.cli serve` on a free port; yields {url, log, cmd, start_s}; stops it after.

    `src`: a directory holding the `proxy` package to run instead of the installed one
    (e.g. a `git archive` snapshot, so parallel edits in the working tree do not leak in).
    """
    port = free_port()
    cmd = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port)]
    if config:
        path = os.path.join(tmp, "config.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        cmd += ["--config", path]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    env.update(CTXPROXY_UPSTREAM=upstream, CTXPROXY_STORE=f"sqlite:///{os.path.join(tmp, 'ctxproxy.db')}")
    if src:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src), *filter(None, [env.get("PYTHONPATH")])])
    log_path = os.path.join(tmp, "proxy.log")
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"proxy exited with {proc.returncode}: {open(log_path).read()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"proxy not healthy after {START_TIMEOUT:.0f}s")
            time.sleep(0.05)
        yield {"url": url, "log": log_path, "cmd": cmd, "start_s": time.perf_counter() - t0, "pid": proc.pid}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextmanager
def proxy_inprocess(config: dict[str, Any], upstream: str, tmp: str,
                    src: str | None = None) -> Iterator[dict[str, Any]]:
    """The proxy app under uvicorn in a thread of this process (tests/proxy_server.py)."""
    if src:
        raise SystemExit("replay: --proxy-src needs --proxy-mode subprocess")
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from proxy_server import ProxyServer, make_settings  # type: ignore[import-not-found]

    t0 = time.perf_counter()
    settings = make_settings(upstream, f"sqlite:///{os.path.join(tmp, 'ctxproxy.db')}", **config)
    with ProxyServer(settings) as p:
        yield {"url": p.url, "log": None, "cmd": ["in-process"], "start_s": time.perf_counter() - t0, "pid": None}


def proxy_log(path: str | None) -> dict[str, Any]:
    """Sums over the proxy's per-request JSON log lines (in-handler time before forwarding, total)."""
    out = {"requests_logged": 0, "overhead_ms": 0.0, "total_ms": 0.0, "max_overhead_ms": 0.0, "errors": []}
    if not path or not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("level") in ("error", "warning", "critical"):
                out["errors"].append(rec.get("msg"))
            if rec.get("msg") != "request":
                continue
            out["requests_logged"] += 1
            oh = float(rec.get("overhead_ms") or 0.0)
            out["overhead_ms"] += oh
            out["max_overhead_ms"] = max(out["max_overhead_ms"], oh)
            out["total_ms"] += float(rec.get("total_ms") or 0.0)
    out["overhead_ms"] = round(out["overhead_ms"], 1)
    out["total_ms"] = round(out["total_ms"], 1)
    out["max_overhead_ms"] = round(out["max_overhead_ms"], 1)
    return out


# --------------------------------------------------------------------------- replay

def _error_code(content: bytes) -> str | None:
    try:
        err = json.loads(content).get("error") or {}
        return err.get("code") or err.get("type")
    except (ValueError, AttributeError):
        return None


SUMMARY_MARKS = ("<context_summary>",  # ctxproxy layer 2
                 "[ctxproxy:",  # ctxproxy archive fallback (a span behind a placeholder)
                 "The following is a summary of your previous actions",  # cliffcompaction
                 "[[NOTES kept by the context keeper")  # ctxkeeper
BREAK_TOKENS = 1024  # a request that re-bills more than this much of the previous prompt broke the cached prefix


def _is_status(m: dict[str, Any]) -> bool:
    return m.get("role") == "user" and isinstance(m.get("content"), str) and m["content"].startswith("<agent_status>")


def _chunks_common(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> int:
    """Tokens of the common prefix of two prompts given as chunks (the mock's rendering)."""
    n = 0
    for x, y in zip(a, b):
        if x == y:
            n += len(x)
            continue
        n += mu.common_prefix_len(x, y)
        break
    return n


def _summary_stats(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The compacted-history message of a request (summary / notes / archive note), with its size."""
    for j, m in enumerate(messages):
        text = content_text(m.get("content"))
        if m.get("role") == "user" and text.startswith(SUMMARY_MARKS):
            out: dict[str, Any] = {"position": j, "tokens": message_tokens(m), "chars": len(text)}
            if text.startswith("<context_summary>"):
                body, _, listing = text.partition("\n## Identifiers (verbatim from the compacted messages)\n")
                listing = listing.rsplit("\n</context_summary>", 1)[0]
                ids = [x for x in listing.splitlines() if x.strip()]
                out.update(kind="summary", identifiers_listed=len(ids),
                           identifier_tokens=len(mu.tokens("\n".join(ids))) if ids else 0,
                           digest_tokens=len(mu.tokens(body)))
            elif text.startswith("[ctxproxy:"):
                out["kind"] = "archive"
            else:
                out["kind"] = "notes" if text.startswith("[[NOTES") else "cliff-summary"
            return out
    return None


def replay_trace(client: httpx.Client, base: str, setting: Setting, trace: Trace,
                 mock: mu.MockUpstream, final_turn: bool = False, window: int = mu.DEFAULT_WINDOW,
                 proxy_history: Any = None) -> dict[str, Any]:
    """All turns of one trajectory, sequentially; the per-trajectory row plus per-request rows.

    The provider's requests of each turn are split into the agent's (what the
    client asked, as forwarded: possibly rejected and retried) and the proxy's
    own calls (summaries, notes: `fake_llm.kind`). Token figures count both;
    the `proxy_*` fields count the proxy's own calls alone.
    """
    auth = f"Bearer sk-replay-{setting.name}-{trace.id}"
    headers = {"authorization": auth, "content-type": "application/json"}
    if setting.external and ext.EXTERNALS[setting.external].session_header:
        headers[ext.EXTERNALS[setting.external].session_header] = f"replay-{setting.name}-{trace.id}"
    check = RewriteCheck(setting.offload_thresholds()) if setting.proxied else None
    requests: list[dict[str, Any]] = []
    pairing: list[dict[str, Any]] = []
    strict_bad = 0  # requests breaking OpenAI's stricter rule (results right after their calls)
    t_client = 0.0
    turns = trace.turns(final_turn)
    compacted_views = 0  # ctxproxy requests whose messages no longer line up with the client's (not position-checked)
    summaries: list[dict[str, Any]] = []  # each distinct compacted-history message, when it first appears
    seen_summaries: set[str] = set()
    prev_chunks: list[tuple[int, ...]] | None = None
    last_served: dict[str, Any] | None = None
    mock.requests.clear()  # sequential: nothing in flight; keeps memory to one trajectory's bodies
    mock.cache.clear()  # one trajectory at a time (keyless proxies share one cache scope; a no-op for the others)
    for i in turns:
        body = request_body(trace, i)
        if setting.transform is not None:
            body["messages"] = setting.transform(body["messages"], body.get("tools"), window)
        raw = encode_body(body)
        before = len(mock.requests)
        t0 = time.perf_counter()
        resp = client.post(base + "/chat/completions", content=raw, headers=headers)
        dt = time.perf_counter() - t0
        t_client += dt
        sent = mock.requests[before:]
        row: dict[str, Any] = {"turn": i, "status": resp.status_code, "ms": round(dt * 1000, 2),
                               "upstream_requests": len(sent), "prompt_tokens": 0, "cached_tokens": 0,
                               "body_bytes": len(raw), "proxy_calls": 0, "proxy_prompt_tokens": 0,
                               "proxy_cached_tokens": 0, "proxy_completion_tokens": 0, "provider_rejections": 0,
                               "client_messages": len(body["messages"])}
        if resp.status_code != 200:
            row["error"] = _error_code(resp.content)
        if "x-ctxproxy-offloaded" in resp.headers:
            row["offloaded"] = int(resp.headers["x-ctxproxy-offloaded"])
            row["tokens_saved"] = int(resp.headers.get("x-ctxproxy-tokens-saved", 0))
        if "x-ctxproxy-compacted" in resp.headers:
            row["compacted"] = resp.headers["x-ctxproxy-compacted"]
            row["tokens_before"] = int(resp.headers.get("x-ctxproxy-tokens-before", 0))
            row["tokens_after"] = int(resp.headers.get("x-ctxproxy-tokens-after", 0))
        if "x-ctxproxy-compaction" in resp.headers:
            row["compaction_version"] = int(resp.headers["x-ctxproxy-compaction"])
        if "x-ctxproxy-cache-break" in resp.headers:  # the proxy's own account of a break (since 71dd356)
            row["proxy_break_cause"] = resp.headers["x-ctxproxy-cache-break"]
        if "x-ctxproxy-status-bar" in resp.headers:
            row["status_bar"] = True
        if "x-ctxproxy-window-learned" in resp.headers:
            row["window_learned"] = int(resp.headers["x-ctxproxy-window-learned"])
        agent = []
        for rec in sent:
            own = fake_llm.kind(rec.json)
            if rec.status != 200:
                row["provider_rejections"] += 1
            if rec.status == 200 and rec.usage:
                row["prompt_tokens"] += rec.usage["prompt_tokens"]
                row["cached_tokens"] += rec.usage["prompt_tokens_details"]["cached_tokens"]
            if own is not None:
                row["proxy_calls"] += 1
                row.setdefault("proxy_call_kinds", []).append(own if rec.status == 200 else f"{own}:{rec.status}")
                if rec.status == 200 and rec.usage:
                    row["proxy_prompt_tokens"] += rec.usage["prompt_tokens"]
                    row["proxy_cached_tokens"] += rec.usage["prompt_tokens_details"]["cached_tokens"]
                    row["proxy_completion_tokens"] += rec.usage["completion_tokens"]
            else:
                agent.append(rec)
            if isinstance(rec.json, dict):
                msgs = rec.json.get("messages") or []
                problems = tool_pairing_problems(msgs)
                if problems:
                    pairing.append({"turn": i, "problems": problems[:3], "count": len(problems),
                                    "proxy_call": own})
                if problems or tool_pairing_problems(msgs, strict=True):
                    strict_bad += 1
        served = next((rec for rec in reversed(agent) if rec.status == 200 and isinstance(rec.json, dict)), None)
        if not sent and resp.status_code == 200:
            row["error"] = "no upstream request recorded"
        if served is not None:
            up = served.json
            row["upstream_messages"] = len(up.get("messages") or [])
            if check is not None:
                # the status bar (proxy 23f7ccd and later) adds `<agent_status>` user messages: set them aside
                aligned = [m for m in up.get("messages") or [] if not _is_status(m)]
                if len(aligned) == len(body["messages"]):
                    check.check(i, body["messages"], {**up, "messages": aligned})
                else:
                    compacted_views += 1
            chunks = mu.prompt_chunks(up)
            if prev_chunks is not None:
                lost = sum(len(c) for c in prev_chunks) - _chunks_common(prev_chunks, chunks)
                row["prefix_lost_tokens"] = lost
                if lost > BREAK_TOKENS:
                    row["cache_break"] = True
            prev_chunks = chunks
            last_served = up
            st = _summary_stats(up.get("messages") or [])
            if st is not None:
                key = _digest(up["messages"][st["position"]])
                if key not in seen_summaries:
                    seen_summaries.add(key)
                    st.update(turn=i, uncached_tokens=row["prompt_tokens"] - row["cached_tokens"],
                              proxy_prompt_tokens=row["proxy_prompt_tokens"])
                    summaries.append(st)
        agent_last = agent[-1] if agent else None
        if agent_last is not None and agent_last.status != 200 and isinstance(agent_last.json, dict):
            # what the provider was asked to read, even though it refused
            row["attempted_prompt_tokens"] = sum(len(c) for c in mu.prompt_chunks(agent_last.json))
        requests.append(row)
    mock.requests.clear()
    out = _aggregate(requests)
    out.update(trace=trace.id, name=trace.name, client_s=round(t_client, 3),
               client_pairing_problems=sum(1 for i in turns if tool_pairing_problems(trace.messages[:i])),
               pairing_problems=len(pairing), pairing_problems_strict=strict_bad, pairing_examples=pairing[:3])
    raw_last = trace.messages[:turns[-1]] if turns else []
    ret = idents.retention(raw_last, (last_served or {}).get("messages"))
    if proxy_history is not None and ret["lost"] and last_served is not None:
        ret["diagnosis"] = diagnose_lost(ret["lost"], raw_last, last_served["messages"], proxy_history)
    del ret["lost"]
    if last_served is not None:
        listing = ""
        for m in last_served.get("messages") or []:
            text = content_text(m.get("content"))
            if text.startswith("<context_summary>"):
                listing = text.partition("\n## Identifiers (verbatim from the compacted messages)\n")[2]
        listed = [x for x in listing.rsplit("\n</context_summary>", 1)[0].splitlines() if x.strip()]
        if listed:  # ctxproxy's code-written list in the last request, and how much of it is an identifier by our rules
            ret["last_list"] = {"entries": len(listed),
                                "not_identifiers_by_bench_rules": [x for x in listed if x not in idents.extract(x)]}
    out["identifiers"] = ret
    out["summaries"] = summaries
    if check is not None:
        out["rewrites"] = check.summary()
        out["rewrites"]["over_threshold_not_offloaded"] = check.missed(trace.messages, turns[-1] if turns else 0)
        out["rewrites"]["compacted_views"] = compacted_views
    out["rows"] = requests
    return out


def diagnose_lost(lost: list[str], raw: list[dict[str, Any]], sent: list[dict[str, Any]],
                  history: Any) -> dict[str, Any]:
    """Why ctxproxy's last request lacks an identifier the raw trajectory named (diagnosis only).

    `history` is the proxy's own proxy/rewrite/compress/history.py module (loaded from the proxy under test), whose identifier
    regex decides what its code-written list can hold: an identifier it does not match can only survive in the
    model-written part or verbatim. Categories: `proxy regex misses it` (no match of the proxy's regex in any
    message naming it, exactly as written), `matched, not listed` (the regex finds it but the last summary's list
    does not have it: cap, token budget, or dropped at a later compaction), `no summary` (compacted without one).
    """
    listing = ""
    for m in sent:
        text = content_text(m.get("content"))
        if text.startswith("<context_summary>"):
            listing = text.partition("\n## Identifiers (verbatim from the compacted messages)\n")[2]
    listed = set(x.strip() for x in listing.splitlines())
    out: dict[str, list[str]] = {"proxy regex misses it": [], "matched, not listed": [], "no summary": []}
    for ident in lost:
        if not listing:
            out["no summary"].append(ident)
            continue
        proxy_ids = set()
        for m in raw:
            if ident in idents.named_text(m) or ident in history.text_of(m):
                proxy_ids.update(x.group(0).rstrip(history._TRAILING) for x in history.IDENTIFIER.finditer(history.text_of(m)))
        if ident in proxy_ids or any(ident in x for x in proxy_ids):
            out["matched, not listed"].append(ident)
        else:
            out["proxy regex misses it"].append(ident)
    out["listed_count"] = len(listed)  # type: ignore[assignment]
    return out


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    pp = sum(r.get("proxy_prompt_tokens", 0) for r in rows)
    pc = sum(r.get("proxy_cached_tokens", 0) for r in rows)
    return {
        "requests": len(rows),
        "upstream_requests": sum(r["upstream_requests"] for r in rows),
        "ok": sum(1 for r in rows if r["status"] == 200),
        "rejected": sum(1 for r in rows if r["status"] != 200),
        "context_length_exceeded": sum(1 for r in rows if r.get("error") == "context_length_exceeded"),
        "provider_rejections": sum(r.get("provider_rejections", 0) for r in rows),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": round(cached / prompt, 5) if prompt else None,
        "cost_units": round(prompt - cached + CACHED_PRICE * cached, 1),
        "proxy_calls": sum(r.get("proxy_calls", 0) for r in rows),
        "proxy_prompt_tokens": pp,
        "proxy_cached_tokens": pc,
        "proxy_completion_tokens": sum(r.get("proxy_completion_tokens", 0) for r in rows),
        "proxy_cost_units": round(pp - pc + CACHED_PRICE * pc, 1),
        "agent_hit_rate": round((cached - pc) / (prompt - pp), 5) if prompt - pp else None,
        "cache_breaks": sum(1 for r in rows if r.get("cache_break")),
        "prefix_lost_tokens": sum(r.get("prefix_lost_tokens", 0) for r in rows),
        "compactions": sum(1 for r in rows if r.get("compacted")),
        "compactions_by_layer": {k: sum(1 for r in rows if r.get("compacted") == k)
                                 for k in sorted({r["compacted"] for r in rows if r.get("compacted")})},
        "offloaded_requests": sum(1 for r in rows if r.get("offloaded")),
        "tokens_saved_header": sum(r.get("tokens_saved", 0) for r in rows),
    }


def _load_proxy_history(src: str | None) -> Any:
    """proxy/rewrite/compress/history.py of the proxy under test (standalone module), for diagnosing lost identifiers."""
    import importlib.util
    path = os.path.join(src or ROOT, "proxy", "history.py")
    spec = importlib.util.spec_from_file_location("ctxproxy_history_under_test", path)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception:
        return None
    return mod if hasattr(mod, "IDENTIFIER") else None


def replay_setting(setting: Setting, traces: list[Trace], mock: mu.MockUpstream, window: int,
                   proxy_mode: str, final_turn: bool = False, progress: bool = True,
                   proxy_src: str | None = None) -> dict[str, Any]:
    mock.reset()
    mock.default_window = window
    mock.windows[MODEL] = window
    # the proxies' own summary / notes calls get a deterministic digest of what they send (bench/fake_llm.py);
    # every other request gets "ok", as before. Bounded queue, far above what any setting uses.
    mock.script(*[fake_llm.respond] * (20 * sum(len(t.turns(final_turn)) for t in traces) + 1000))
    history = _load_proxy_history(proxy_src) if setting.proxied else None
    with tempfile.TemporaryDirectory(prefix=f"replay-{setting.name}-") as tmp:
        proxy_info: dict[str, Any] = {}
        if setting.proxied:
            runner = proxy_subprocess if proxy_mode == "subprocess" else proxy_inprocess
            cm = runner(setting.config_for(window), mock.base_url, tmp, proxy_src)
        elif setting.external:
            spec = ext.EXTERNALS[setting.external]
            try:
                proxy_info["install"] = ext.ensure_installed(
                    spec, log=lambda m: print(f"  {setting.name}: {m}", file=sys.stderr, flush=True))
            except ext.ExternalUnavailable as err:
                return _unavailable(setting, "install", str(err))
            cm = ext.running(spec, free_port(), mock.base_url[:-len("/v1")], window, tmp)
        else:
            cm = _nullcontext({"url": None, "log": None, "cmd": None, "start_s": 0.0, "pid": None})
        try:
            with cm as info, httpx.Client(timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=10.0)) as client:
                base = info["url"] + "/v1" if info["url"] else mock.base_url
                rows = []
                t0 = time.perf_counter()
                for trace in traces:
                    t1 = time.perf_counter()
                    row = replay_trace(client, base, setting, trace, mock, final_turn, window, history)
                    row["wall_s"] = round(time.perf_counter() - t1, 3)
                    rows.append(row)
                    if progress:
                        print(f"  {setting.name:<24} {trace.id} {row['requests']:>4} req {row['rejected']:>3} rej "
                              f"{row['prompt_tokens']:>10,} tok {row['wall_s']:7.2f}s", file=sys.stderr, flush=True)
                wall = time.perf_counter() - t0
                if info["cmd"]:
                    proxy_info.update(cmd=" ".join(shlex.quote(c) for c in info["cmd"]),
                                      start_s=round(info["start_s"], 3), cpu_s=_cpu_seconds(info["pid"]))
                if setting.external and info.get("log"):
                    with open(info["log"], errors="replace") as f:
                        proxy_info["log_tail"] = f.read()[-4000:]
                    proxy_info["state"] = _external_state(info.get("state"))
        except ext.ExternalUnavailable as err:
            return _unavailable(setting, "start", str(err))
        except RuntimeError as err:  # ctxproxy did not start (e.g. a config section an older --proxy-src lacks)
            if not setting.proxied:
                raise
            return _unavailable(setting, "start", str(err))
        if setting.proxied and info["log"]:
            proxy_info.update(proxy_log(info["log"]))
        if mock.errors:
            proxy_info["mock_errors"] = list(mock.errors)
    total = _aggregate([r for row in rows for r in row["rows"]])
    total.update(wall_s=round(wall, 3), client_s=round(sum(r["client_s"] for r in rows), 3),
                 pairing_problems=sum(r["pairing_problems"] for r in rows),
                 pairing_problems_strict=sum(r["pairing_problems_strict"] for r in rows),
                 client_pairing_problems=sum(r["client_pairing_problems"] for r in rows))
    ids = [r["identifiers"] for r in rows]
    total["identifiers"] = {k: sum(x[k] for x in ids) for k in ("total", "kept", "after_head", "after_head_kept")}
    if setting.proxied:
        total["rewrites"] = _sum_rewrites([r["rewrites"] for r in rows])
    return {"setting": setting.name, "description": setting.description,
            "proxy_config": setting.config_for(window) if setting.proxied else None,
            "proxy": proxy_info, "total": total, "traces": rows}


def _unavailable(setting: Setting, stage: str, error: str) -> dict[str, Any]:
    print(f"  {setting.name}: not run ({stage} failed):\n{error}", file=sys.stderr, flush=True)
    return {"setting": setting.name, "description": setting.description, "unavailable": {"stage": stage,
                                                                                          "error": error}}


def _external_state(state_dir: str | None) -> dict[str, Any]:
    """What an external proxy left in its state folder (ctxkeeper: per-session state.json counters)."""
    out: dict[str, Any] = {}
    if not state_dir or not os.path.isdir(state_dir):
        return out
    keys = ("cuts", "inplace_cuts", "inplace_failed", "notes_failed", "recalls", "requests", "upstream_calls",
            "notes_prompt_tokens", "notes_cached_tokens", "restarts")
    sums: dict[str, int] = {}
    rejected: dict[str, int] = {}
    for name in sorted(os.listdir(state_dir)):
        f = os.path.join(state_dir, name, "state.json")
        if os.path.exists(f):
            try:
                st = json.load(open(f))
            except ValueError:
                continue
            for k in keys:
                if isinstance(st.get(k), (int, float)):
                    sums[k] = sums.get(k, 0) + st[k]
        ev = os.path.join(state_dir, name, "events.jsonl")
        if os.path.exists(ev):
            for line in open(ev, errors="replace"):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                why = e.get("why") or e.get("event")
                if why:
                    why = str(why)[:90]
                    rejected[why] = rejected.get(why, 0) + 1
    out["sessions"] = sum(1 for n in os.listdir(state_dir) if os.path.isdir(os.path.join(state_dir, n)))
    out["counters"] = sums
    out["events"] = dict(sorted(rejected.items(), key=lambda kv: -kv[1])[:15])
    return out


@contextmanager
def _nullcontext(value: Any) -> Iterator[Any]:
    yield value


def _cpu_seconds(pid: int | None) -> float | None:
    """User+system CPU of a live process (Linux /proc), read just before it is stopped."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, IndexError, ValueError):
        return None


def _sum_rewrites(parts: list[dict[str, Any]]) -> dict[str, Any]:
    shares = [p["max_preview_share"] for p in parts if p["max_preview_share"] is not None]
    return {
        "messages_checked": sum(p["messages_checked"] for p in parts),
        "rewritten_messages": sum(p["rewritten_messages"] for p in parts),
        "original_tokens": sum(p["original_tokens"] for p in parts),
        "preview_tokens": sum(p["preview_tokens"] for p in parts),
        "max_preview_share": max(shares) if shares else None,
        "preview_not_smaller": sum(len(p["preview_not_smaller"]) for p in parts),
        "unstable_rewrites": sum(len(p["unstable_rewrites"]) for p in parts),
        "altered_without_placeholder": sum(len(p["altered_without_placeholder"]) for p in parts),
        "placeholder_without_read_tool": sum(len(p["placeholder_without_read_tool"]) for p in parts),
        "fewer_messages_upstream": sum(len(p["fewer_messages_upstream"]) for p in parts),
        "over_threshold_not_offloaded": sum(len(p["over_threshold_not_offloaded"]) for p in parts),
    }


# --------------------------------------------------------------------------- comparison and report

def compare(results: list[dict[str, Any]]) -> None:
    """Add ratios against the baseline: over all requests, and over turns that succeeded in both."""
    base = next((r for r in results if r["setting"] == BASELINE), None)
    if base is None:
        return
    base_rows = {(t["trace"], q["turn"]): q for t in base["traces"] for q in t["rows"]}
    for res in results:
        tot = res["total"]
        b = base["total"]
        tot["prompt_ratio"] = round(tot["prompt_tokens"] / b["prompt_tokens"], 4) if b["prompt_tokens"] else None
        tot["cost_ratio"] = round(tot["cost_units"] / b["cost_units"], 4) if b["cost_units"] else None
        both = [(q, base_rows[(t["trace"], q["turn"])]) for t in res["traces"] for q in t["rows"]
                if q["status"] == 200 and base_rows.get((t["trace"], q["turn"]), {}).get("status") == 200]
        p = sum(q["prompt_tokens"] for q, _ in both)
        c = sum(q["cached_tokens"] for q, _ in both)
        bp = sum(x["prompt_tokens"] for _, x in both)
        bc = sum(x["cached_tokens"] for _, x in both)
        saved = sum(q.get("tokens_saved", 0) for q, _ in both)
        tot["common"] = {"requests": len(both), "prompt_tokens": p, "cached_tokens": c,
                         "tokens_saved_header": saved, "tokens_saved_measured": bp - p,
                         "hit_rate": round(c / p, 5) if p else None,
                         "baseline_prompt_tokens": bp, "baseline_cached_tokens": bc,
                         "baseline_hit_rate": round(bc / bp, 5) if bp else None,
                         "prompt_ratio": round(p / bp, 4) if bp else None}
        tot["hit_rate_delta_points"] = (round((tot["hit_rate"] - b["hit_rate"]) * 100, 3)
                                        if tot["hit_rate"] is not None and b["hit_rate"] is not None else None)
        for t in res["traces"]:
            bt = next((x for x in base["traces"] if x["trace"] == t["trace"]), None)
            if bt and bt["prompt_tokens"]:
                t["prompt_ratio"] = round(t["prompt_tokens"] / bt["prompt_tokens"], 4)


def _hit_note(delta: float | None, limit: float) -> str:
    if delta is not None and abs(delta) > limit and delta > 0:
        return (f" (fails only upward: the proxy's hit rate is {delta:.2f} points higher, "
                f"i.e. it is not lower by more than {limit} points)")
    return ""


def acceptance(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 3's criteria, evaluated as written (|difference|); each with the figures it rests on."""
    by = {r["setting"]: r["total"] for r in results}
    out = []
    b = by.get(BASELINE)
    if b is None:
        return out
    if "ctxproxy-default" in by:
        d = by["ctxproxy-default"]
        delta = d["hit_rate_delta_points"]
        out.append({"criterion": "default thresholds: hit rate within 0.5 points of no-proxy",
                    "met": delta is not None and abs(delta) <= 0.5,
                    "figures": f"{_pct(d['hit_rate'])} vs {_pct(b['hit_rate'])} ({delta:+.2f} points); "
                               f"over turns both served: {_pct(d['common']['hit_rate'])} vs "
                               f"{_pct(d['common']['baseline_hit_rate'])}" + _hit_note(delta, 0.5),
                    "met_one_sided": delta is not None and delta >= -0.5})
        out.append({"criterion": "default thresholds: no request fails",
                    "met": d["rejected"] == 0,
                    "figures": f"{d['rejected']} rejected ({d['context_length_exceeded']} context_length_exceeded); "
                               f"no-proxy: {b['rejected']} rejected ({b['context_length_exceeded']} "
                               f"context_length_exceeded)"})
    if "ctxproxy-offload-1000" in by:
        o = by["ctxproxy-offload-1000"]
        delta = o["hit_rate_delta_points"]
        out.append({"criterion": "tool_result_tokens 1000: prompt tokens <= 85% of no-proxy's",
                    "met": o["prompt_ratio"] is not None and o["prompt_ratio"] <= 0.85,
                    "figures": f"{o['prompt_tokens']:,} / {b['prompt_tokens']:,} = {_pct(o['prompt_ratio'])} "
                               f"(over turns both served: {_pct(o['common']['prompt_ratio'])})"})
        out.append({"criterion": "tool_result_tokens 1000: hit rate within 2 points of no-proxy",
                    "met": delta is not None and abs(delta) <= 2.0,
                    "figures": f"{_pct(o['hit_rate'])} vs {_pct(b['hit_rate'])} ({delta:+.2f} points); "
                               f"over turns both served: {_pct(o['common']['hit_rate'])} vs "
                               f"{_pct(o['common']['baseline_hit_rate'])}" + _hit_note(delta, 2.0),
                    "met_one_sided": delta is not None and delta >= -2.0})
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.2f}%"


def markdown(results: list[dict[str, Any]], criteria: list[dict[str, Any]]) -> str:
    lines = ["| setting | requests | rejected (ctx exceeded) | prompt tokens | cached tokens | hit rate | "
             "cost units | prompt vs no-proxy | prompt vs no-proxy, turns both served | wall s | proxy CPU s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["total"]
        common = t.get("common") or {}
        lines.append(f"| {r['setting']} | {t['requests']} | {t['rejected']} ({t['context_length_exceeded']}) | "
                     f"{t['prompt_tokens']:,} | {t['cached_tokens']:,} | {_pct(t['hit_rate'])} | "
                     f"{t['cost_units']:,.0f} | {_pct(t.get('prompt_ratio'))} | {_pct(common.get('prompt_ratio'))} | "
                     f"{t['wall_s']:.1f} | {r['proxy'].get('cpu_s') if r['proxy'].get('cpu_s') is not None else '-'} |")
    lines += ["", "| setting | tool pairing: bad requests, strict (client's own) | rewritten msgs | preview not smaller | "
              "max preview share | unstable rewrites | altered w/o placeholder | placeholder w/o read tool | "
              "over threshold, not offloaded | proxy overhead ms (sum / max) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["total"]
        w = t.get("rewrites")
        p = r["proxy"]
        if w is None:
            lines.append(f"| {r['setting']} | {t['pairing_problems']}, {t['pairing_problems_strict']} ({t['client_pairing_problems']}) | - | - | - | - | - | - | - | - |")
            continue
        share = "-" if w["max_preview_share"] is None else f"{w['max_preview_share']:.3f}"
        lines.append(f"| {r['setting']} | {t['pairing_problems']}, {t['pairing_problems_strict']} ({t['client_pairing_problems']}) | "
                     f"{w['rewritten_messages']} | {w['preview_not_smaller']} | {share} | {w['unstable_rewrites']} | "
                     f"{w['altered_without_placeholder']} | {w['placeholder_without_read_tool']} | "
                     f"{w['over_threshold_not_offloaded']} | {p.get('overhead_ms', '-')} / {p.get('max_overhead_ms', '-')} |")
    if criteria:
        lines += ["", "| issue 3 criterion | met | figures |", "|---|---|---|"]
        lines += [f"| {c['criterion']} | {'yes' if c['met'] else '**no**'} | {c['figures']} |" for c in criteria]
    return "\n".join(lines)


def per_trace_markdown(results: list[dict[str, Any]]) -> str:
    names = [r["setting"] for r in results]
    head = "| trace | turns | " + " | ".join(f"{n}: prompt / hit / rej" for n in names) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(names)]
    traces = [t["trace"] for t in results[0]["traces"]]
    for k, tid in enumerate(traces):
        cells = []
        for r in results:
            t = r["traces"][k]
            cells.append(f"{t['prompt_tokens']:,} / {_pct(t['hit_rate'])} / {t['rejected']}")
        lines.append(f"| {tid} | {results[0]['traces'][k]['requests']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- compression report (issue 4)

def over_trigger_traces(traces: list[Trace], window: int, final_turn: bool, share: float = 0.85) -> list[str]:
    """Trajectories whose largest request (the mock's count, as the client sends it) passes share x window."""
    out = []
    for t in traces:
        turns = t.turns(final_turn)
        if turns and max(sum(len(c) for c in mu.prompt_chunks(request_body(t, i))) for i in turns) > share * window:
            out.append(t.id)
    return out


def _ids_over(res: dict[str, Any], subset: list[str]) -> dict[str, int]:
    rows = [t["identifiers"] for t in res["traces"] if t["trace"] in subset]
    return {k: sum(r[k] for r in rows) for k in ("total", "kept", "after_head", "after_head_kept")}


def _share(kept: int, total: int) -> str:
    return f"{kept / total * 100:.1f}% ({kept}/{total})" if total else "n/a"


def _available(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if "total" in r]


def compress_markdown(results: list[dict[str, Any]], subset: list[str]) -> str:
    ok = _available(results)
    by = {r["setting"]: r["total"] for r in ok}
    ref = by.get("sliding-window-20")
    lines = ["| setting | requests | rejected (ctx exceeded) | provider 400s | prompt tokens | cached tokens | hit rate "
             "(agent only) | cost units | cost vs sliding-window-20 | proxy's own calls: n / prompt tok / cost units | "
             "identifiers kept: all / after head | same, trajectories over trigger | pairing: bad requests, strict | "
             "cache breaks | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if "total" not in r:
            lines.append(f"| {r['setting']} | not run: {r['unavailable']['stage']} failed (see below) |"
                         + " |" * 13)
            continue
        t = r["total"]
        i = t["identifiers"]
        o = _ids_over(r, subset)
        vs = f"{t['cost_units'] / ref['cost_units'] * 100:.1f}%" if ref and ref["cost_units"] else "-"
        own = (f"{t['proxy_calls']} / {t['proxy_prompt_tokens']:,} / {t['proxy_cost_units']:,.0f}"
               if t["proxy_calls"] else "0")
        lines.append(
            f"| {r['setting']} | {t['requests']} | {t['rejected']} ({t['context_length_exceeded']}) | "
            f"{t['provider_rejections']} | {t['prompt_tokens']:,} | {t['cached_tokens']:,} | "
            f"{_pct(t['hit_rate'])} ({_pct(t['agent_hit_rate'])}) | {t['cost_units']:,.0f} | {vs} | {own} | "
            f"{_share(i['kept'], i['total'])} / {_share(i['after_head_kept'], i['after_head'])} | "
            f"{_share(o['kept'], o['total'])} / {_share(o['after_head_kept'], o['after_head'])} | "
            f"{t['pairing_problems']}, {t['pairing_problems_strict']} | {t['cache_breaks']} | {t['wall_s']:.1f} |")
    return "\n".join(lines)


def issue8_markdown(results: list[dict[str, Any]], ours: str = "ctxproxy") -> str:
    """Issue 8's targets: among settings with no length rejection, is `ours` cheapest, best cached, best kept?"""
    ok = [r for r in _available(results) if r["total"]["rejected"] == 0]
    mine = next((r for r in ok if r["setting"] == ours), None)
    if mine is None:
        return ""
    measures = [("lowest effective cost (cost units)", lambda t: -t["cost_units"], lambda t: f"{t['cost_units']:,.0f}"),
                ("highest hit rate (all provider requests)", lambda t: t["hit_rate"], lambda t: _pct(t["hit_rate"])),
                ("highest identifier retention", lambda t: t["identifiers"]["kept"] / max(1, t["identifiers"]["total"]),
                 lambda t: _share(t["identifiers"]["kept"], t["identifiers"]["total"]))]
    lines = [f"| issue 8 target, among the {len(ok)} settings with no length rejection | {ours} | best other "
             "setting | met |", "|---|---:|---|---|"]
    for label, key, show in measures:
        others = [r for r in ok if r["setting"] != ours and not r["setting"].startswith(ours + "+")
                  and r["setting"] not in STATUS_BAR_SETTINGS]
        best = max(others, key=lambda r: key(r["total"]), default=None)
        met = best is None or key(mine["total"]) > key(best["total"])
        lines.append(f"| {label} | {show(mine['total'])} | "
                     + (f"{best['setting']}: {show(best['total'])}" if best else "-") + f" | {'yes' if met else '**no**'} |")
    return "\n".join(lines)


def acceptance_compress(results: list[dict[str, Any]], window: int, subset: list[str]) -> list[dict[str, Any]]:
    """Issue 4's criteria for the `ctxproxy` setting, as written, each with the figures it rests on."""
    out = []
    for name in ("ctxproxy", "ctxproxy-no-status-bar"):
        out += _criteria_for(results, name, window, subset)
    return out


def _criteria_for(results: list[dict[str, Any]], name: str, window: int, subset: list[str]) -> list[dict[str, Any]]:
    ok = {r["setting"]: r for r in _available(results)}
    if name not in ok:
        return []
    c = ok[name]["total"]
    out = [
        {"criterion": f"window {window:,}: no request rejected for length",
         "met": c["context_length_exceeded"] == 0,
         "figures": f"{c['context_length_exceeded']} context_length_exceeded, {c['rejected']} rejected of "
                    f"{c['requests']} (provider-side 400s, retried by the proxy: {c['provider_rejections']})"},
        {"criterion": "provider hit rate > 90% (all provider requests, the proxy's own calls included)",
         "met": c["hit_rate"] is not None and c["hit_rate"] > 0.90,
         "figures": f"{_pct(c['hit_rate'])} ({c['cached_tokens']:,} / {c['prompt_tokens']:,}); agent requests "
                    f"alone {_pct(c['agent_hit_rate'])}"},
    ]
    i = c["identifiers"]
    o = _ids_over(ok[name], subset)
    out.append({"criterion": ">= 95% identifier retention (all trajectories pooled)",
                "met": i["total"] > 0 and i["kept"] / i["total"] >= 0.95,
                "figures": f"{_share(i['kept'], i['total'])}; first named after the head: "
                           f"{_share(i['after_head_kept'], i['after_head'])}"})
    out.append({"criterion": ">= 95% identifier retention, trajectories that pass the trigger "
                             f"({len(subset)}: {', '.join(subset) or '-'})",
                "met": (o["kept"] / o["total"] >= 0.95) if o["total"] else None,
                "figures": f"{_share(o['kept'], o['total'])}; first named after the head: "
                           f"{_share(o['after_head_kept'], o['after_head'])}"})
    for other in ("sliding-window-20", "cliffcompaction"):
        if other in ok:
            t = ok[other]["total"]
            out.append({"criterion": f"effective input cost lower than {other}'s",
                        "met": c["cost_units"] < t["cost_units"],
                        "figures": f"{c['cost_units']:,.0f} vs {t['cost_units']:,.0f} "
                                   f"({c['cost_units'] / t['cost_units'] * 100:.1f}%); {other}: hit rate "
                                   f"{_pct(t['hit_rate'])}, identifiers {_share(t['identifiers']['kept'], t['identifiers']['total'])}"})
        else:
            out.append({"criterion": f"effective input cost lower than {other}'s", "met": None,
                        "figures": f"{other} not run"})
    for x in out:
        x["setting"] = name
    return out


def status_bar_markdown(results: list[dict[str, Any]]) -> str:
    """Issue 5: the status bar's modes side by side (append, the default; off; replace), with the check
    "hit rate with append within 2 points of without". Empty when fewer than two of them ran."""
    ok = {r["setting"]: r for r in _available(results)}
    names = [n for n in STATUS_BAR_SETTINGS if n in ok]
    if len(names) < 2:
        return ""
    off = ok.get("ctxproxy-no-status-bar")
    lines = ["| status bar setting | mode | prompt tokens | hit rate (agent only) | vs no status bar, points | "
             "cost units | cost vs no status bar | own calls | compactions | identifiers kept | "
             "in-handler ms (sum / max) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    modes = {"ctxproxy": "replace (default)", "ctxproxy-no-status-bar": "off",
             "ctxproxy-status-replace": "replace (set explicitly)"}
    for n in names:
        r = ok[n]
        t = r["total"]
        i = t["identifiers"]
        if off is not None:
            o = off["total"]
            dp = f"{(t['hit_rate'] - o['hit_rate']) * 100:+.2f}" if t["hit_rate"] is not None else "-"
            dc = f"{t['cost_units'] / o['cost_units'] * 100:.1f}%" if o["cost_units"] else "-"
        else:
            dp = dc = "-"
        p = r["proxy"]
        lines.append(f"| {n} | {modes[n]} | {t['prompt_tokens']:,} | {_pct(t['hit_rate'])} "
                     f"({_pct(t['agent_hit_rate'])}) | {dp} | {t['cost_units']:,.0f} | {dc} | {t['proxy_calls']} | "
                     f"{t['compactions']} | {_share(i['kept'], i['total'])} | "
                     f"{p.get('overhead_ms', '-')} / {p.get('max_overhead_ms', '-')} |")
    if off is not None and "ctxproxy" in ok:
        a, o = ok["ctxproxy"]["total"], off["total"]
        d = (a["hit_rate"] - o["hit_rate"]) * 100
        lines += ["", f"issue 5 check, hit rate with the status bar (append) within 2 points of without: "
                      f"{'met' if abs(d) <= 2.0 else 'NOT met'} ({_pct(a['hit_rate'])} vs {_pct(o['hit_rate'])}, "
                      f"{d:+.2f} points)"]
        if "ctxproxy-status-replace" in ok:
            rp = ok["ctxproxy-status-replace"]["total"]
            lines.append(f"replace mode, beside it: {_pct(rp['hit_rate'])} "
                         f"({(rp['hit_rate'] - o['hit_rate']) * 100:+.2f} points against no status bar)")
    return "\n".join(lines)


def criteria_markdown(criteria: list[dict[str, Any]], title: str) -> str:
    lines = [f"| setting | {title} | met | figures |", "|---|---|---|---|"]
    for c in criteria:
        met = "n/a" if c["met"] is None else "yes" if c["met"] else "**no**"
        lines.append(f"| {c.get('setting', '')} | {c['criterion']} | {met} | {c['figures']} |")
    return "\n".join(lines)


def compress_per_trace_markdown(results: list[dict[str, Any]], subset: list[str]) -> str:
    ok = _available(results)
    head = "| trace | turns | " + " | ".join(f"{r['setting']}: prompt / hit / rej / ids" for r in ok) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(ok)]
    for k, t0 in enumerate(ok[0]["traces"]):
        cells = []
        for r in ok:
            t = r["traces"][k]
            i = t["identifiers"]
            cells.append(f"{t['prompt_tokens']:,} / {_pct(t['hit_rate'])} / {t['rejected']} / {i['kept']}/{i['total']}")
        mark = " *" if t0["trace"] in subset else ""
        lines.append(f"| {t0['trace']}{mark} | {t0['requests']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compaction_detail(res: dict[str, Any], limit: int = 40) -> str:
    """The compacted-history messages a setting produced (per first appearance) and cache breaks vs compactions."""
    lines = []
    t = res["total"]
    rows = [(tr["trace"], q) for tr in res["traces"] for q in tr["rows"]]
    breaks_with = sum(1 for _, q in rows if q.get("cache_break") and q.get("compacted"))
    breaks_without = [(tid, q["turn"], q.get("prefix_lost_tokens")) for tid, q in rows
                      if q.get("cache_break") and not q.get("compacted")]
    comp_no_break = [(tid, q["turn"], q["compacted"]) for tid, q in rows if q.get("compacted") and not q.get("cache_break")]
    lines.append(f"{res['setting']}: {t['cache_breaks']} cache breaks (> {BREAK_TOKENS} tokens of the previous prompt "
                 f"re-billed), {t['prefix_lost_tokens']:,} prefix tokens lost in all; compactions by layer "
                 f"{t['compactions_by_layer'] or '{}'}; breaks on a compacting request {breaks_with}, "
                 f"breaks without one {len(breaks_without)}, compactions without a break {len(comp_no_break)}; "
                 f"proxy's own calls {t['proxy_calls']} ({t['proxy_prompt_tokens']:,} prompt tokens, "
                 f"{t['proxy_cached_tokens']:,} cached, {t['proxy_completion_tokens']:,} written)")
    if breaks_without:
        lines.append(f"  breaks without a compaction header (trace, turn, tokens lost): {breaks_without[:12]}")
    sums = [(tr["trace"], s) for tr in res["traces"] for s in tr.get("summaries", [])]
    if sums:
        lines.append("")
        lines.append("| trace | turn | kind | message tokens | model-written part | identifiers listed (tokens) | "
                     "uncached tokens of that request | proxy's own prompt tokens that turn |")
        lines.append("|---|---:|---|---:|---:|---:|---:|---:|")
        for tid, s in sums[:limit]:
            idl = f"{s['identifiers_listed']} ({s['identifier_tokens']:,})" if "identifiers_listed" in s else "-"
            lines.append(f"| {tid} | {s['turn']} | {s['kind']} | {s['tokens']:,} | {s.get('digest_tokens', '-')} | "
                         f"{idl} | {s['uncached_tokens']:,} | {s['proxy_prompt_tokens']:,} |")
        if len(sums) > limit:
            lines.append(f"| ... {len(sums) - limit} more | | | | | | | |")
    diag = [(tr["trace"], tr["identifiers"].get("diagnosis")) for tr in res["traces"]
            if tr["identifiers"].get("diagnosis")]
    if diag:
        lines.append("")
        for tid, d in diag:
            parts = [f"{k}: {len(v)} ({', '.join(repr(x) for x in v[:4])}{', ...' if len(v) > 4 else ''})"
                     for k, v in d.items() if isinstance(v, list) and v]
            lines.append(f"  trace {tid}: lost {sum(len(v) for v in d.values() if isinstance(v, list))}, "
                         f"last list {d.get('listed_count')} identifiers; " + "; ".join(parts))
    return "\n".join(lines)


def git_state() -> dict[str, Any]:
    """HEAD of this repository and whether proxy/ differs from it (parallel edits)."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"head": git("rev-parse", "HEAD"),
            "proxy_dirty": bool(git("status", "--porcelain", "--", "proxy"))}


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=int, default=mu.DEFAULT_WINDOW, help="the mock's context window for gpt-4o")
    ap.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                    help=f"comma-separated, from: {', '.join(SETTINGS)}; or a group: "
                         + "; ".join(f"{k} = {','.join(v)}" for k, v in SETTING_GROUPS.items()))
    ap.add_argument("--traces", default="", help="comma-separated trajectory ids (01,19); default all")
    ap.add_argument("--traces-dir", default=TRACES_DIR)
    ap.add_argument("--json", dest="json_path", help="write all results (with per-request rows) here")
    ap.add_argument("--proxy-mode", choices=("subprocess", "inprocess"), default="subprocess")
    ap.add_argument("--final-turn", action="store_true",
                    help="also send each whole trajectory that ends on a tool/user message (the next turn)")
    ap.add_argument("--proxy-src", help="directory with the proxy package to run (subprocess mode), e.g. a "
                                        "`git archive HEAD proxy` snapshot; default: the installed one")
    ap.add_argument("--per-trace", action="store_true", help="also print the per-trajectory table")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)

    names = []
    for s in (x.strip() for x in args.settings.split(",")):
        names += SETTING_GROUPS.get(s, [s] if s else [])
    names = list(dict.fromkeys(names))
    for n in names:
        if n not in SETTINGS:
            try:
                derived_setting(n)
            except ValueError as e:
                ap.error(str(e))
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        ap.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)} "
                 f"(groups: {', '.join(SETTING_GROUPS)})")
    traces = load_traces(args.traces_dir, [s for s in args.traces.split(",") if s.strip()] or None)

    t0 = time.perf_counter()
    results = []
    with mu.MockUpstream() as mock:
        for name in names:
            results.append(replay_setting(SETTINGS[name], traces, mock, args.window, args.proxy_mode,
                                          final_turn=args.final_turn, progress=not args.quiet,
                                          proxy_src=args.proxy_src))
    runtime = time.perf_counter() - t0
    ok = _available(results)
    compare(ok)
    # issue 3's criteria are about the default 128k window; at another window they would mislead
    criteria = acceptance(ok) if args.window == mu.DEFAULT_WINDOW else []
    compress_mode = any(n in COMPRESS_SETTINGS[1:] + STATUS_BAR_SETTINGS for n in names)
    subset = over_trigger_traces(traces, args.window, args.final_turn) if compress_mode else []
    criteria4 = acceptance_compress(results, args.window, subset) if compress_mode else []

    if compress_mode:
        print(compress_markdown(results, subset))
        verdict = issue8_markdown(results)
        if verdict:
            print()
            print(verdict)
        if criteria4:
            print()
            print(criteria_markdown(criteria4, "issue 4 criterion"))
        sb = status_bar_markdown(results)
        if sb:
            print()
            print(sb)
        print(f"\ntrajectories over the trigger (0.85 x {args.window:,}) as the client sends them: "
              f"{', '.join(subset) or 'none'}")
        for r in ok:
            if r["setting"] != BASELINE and (r["total"]["cache_breaks"] or r["total"]["proxy_calls"]
                                             or r["total"]["compactions"]):
                print()
                print(compaction_detail(r))
        for r in results:
            if "total" not in r:
                print(f"\n{r['setting']}: not run, {r['unavailable']['stage']} failed:\n{r['unavailable']['error']}")
        print()
    print(markdown(ok, criteria))
    if args.per_trace:
        print()
        print(compress_per_trace_markdown(ok, subset) if compress_mode else per_trace_markdown(ok))
    print(f"\n{len(traces)} trajectories, {sum(len(t.turns(args.final_turn)) for t in traces)} requests per setting "
          f"({'with' if args.final_turn else 'without'} final turns), window {args.window:,}, "
          f"proxy {args.proxy_mode}; total runtime {runtime:.1f}s")
    if args.json_path:
        out = {"command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]) if argv is None else argv,
               "window": args.window, "proxy_mode": args.proxy_mode, "final_turn": args.final_turn,
               "proxy_src": os.path.abspath(args.proxy_src) if args.proxy_src else None, "git": git_state(),
               "machine": machine(), "over_trigger_traces": subset,
               "runtime_s": round(runtime, 2), "criteria": criteria, "criteria_issue4": criteria4,
               "results": results}
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
