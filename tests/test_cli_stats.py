"""`ctxproxy stats`: a running proxy's figures as a plain text table, from a real proxy on a socket.

The command runs as users run it (a subprocess) where the process is the subject (an unreachable proxy: one
line, no traceback); its arguments and output through the CLI's main in this process (tests/cli_main.py).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from agent_runs import TOOLS, conversation
from cli_main import run_main
from proxy_server import ProxyServer, make_settings

ROOT = Path(__file__).resolve().parents[1]


def _env(env: dict[str, str] | None) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "CTXPROXY_ADMIN_TOKEN"}, **(env or {})}


def cli_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m proxy.cli stats ...` as users run it."""
    return subprocess.run([sys.executable, "-m", "proxy.cli", "stats", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=_env(env), stdin=subprocess.DEVNULL)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`ctxproxy stats ...` through main in this process: the same arguments, environment, output and status."""
    return run_main("stats", *args, env=_env(env))


def post(p: ProxyServer, msgs: list[dict], key: str, session: str | None = None, model: str = "gpt-4o") -> None:
    headers = {"authorization": f"Bearer {key}", **({"x-session-id": session} if session else {})}
    r = httpx.post(p.url + "/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": model, "messages": msgs, "tools": TOOLS})
    assert r.status_code == 200, r.text


def settled(p: ProxyServer, requests: int, headers: dict[str, str]) -> dict:
    deadline = time.monotonic() + 10
    while True:
        s = httpx.get(p.url + "/ctx/v1/stats", headers=headers).json()
        if s["totals"]["all"]["requests"] >= requests or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def n(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def total(out: str, name: str) -> str:
    m = re.search(rf"^  {re.escape(name)}:\s+(.*)$", out, re.M)
    assert m, f"no {name!r} line in:\n{out}"
    return m.group(1)


def rows(out: str, heading: str) -> list[list[str]]:
    """The rows of the table under `heading` (cells split on two or more spaces), header first."""
    block = out.split(heading, 1)[1].split("\n\n", 1)[0]
    return [re.split(r"\s{2,}", line.strip()) for line in block.strip("\n").splitlines()[1:]]


@pytest.fixture
def proxy(upstream, tmp_path):
    cfg = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", env={"CTXPROXY_ADMIN_TOKEN": "s3cret"},
                        defaults={"status_bar": {"enabled": False}})
    with ProxyServer(cfg) as p:
        yield p


def test_stats_prints_the_figures_the_proxy_serves(proxy, upstream):
    session = f"cli-{uuid.uuid4().hex[:8]}"
    msgs = conversation(8)
    post(proxy, msgs, "sk-a", session)
    post(proxy, msgs, "sk-a", session)
    post(proxy, [{**msgs[0], "content": msgs[0]["content"] + " NEW RULE."}] + msgs[1:], "sk-a", session)
    post(proxy, conversation(2), "sk-b", model="gpt-4o-mini")
    stats = settled(proxy, 4, {"x-ctx-admin-token": "s3cret"})

    r = cli("--url", proxy.url + "/", env={"CTXPROXY_ADMIN_TOKEN": "s3cret"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = r.stdout
    t = stats["totals"]["last_day"]
    assert "all tenants, last day" in out.splitlines()[0]
    assert total(out, "requests") == f"{n(t['requests'])} (errors 0)" == "4 (errors 0)"
    assert total(out, "prompt tokens") == n(t["prompt"])
    assert total(out, "cached tokens") == n(t["cached"])
    assert total(out, "hit rate") == pct(t["hit_rate"])
    assert total(out, "cache efficiency") == pct(t["efficiency"])
    assert total(out, "effective cost") == f"{n(t['effective_cost'], 1)} token units"
    assert total(out, "cache breaks") == "1"
    assert total(out, "tokens saved") == (f"{n(t['saved_tokens'])} (offload {n(t['saved_offload'])}, compression "
                                          f"{n(t['saved_compress'])}, added by the proxy -{n(t['added_tokens'])})")
    assert t["saved_tokens"] == t["client_tokens"] - t["sent_tokens"] < 0  # nothing to offload: the read tool costs
    assert total(out, "offloads") == "0" and total(out, "compactions") == "0"
    assert total(out, "read back") == "0 of 0 handles given, in 0 hidden rounds"

    groups = rows(out, "by route and model (last day)")
    assert len(groups) == len(stats["groups"]) == 2
    for row, g in zip(groups, stats["groups"]):
        w = g["last_day"]
        assert row == [g["route"], g["model"], n(w["requests"]), n(w["prompt"]), n(w["cached"]), pct(w["hit_rate"]),
                       pct(w["efficiency"]), n(w["saved_tokens"]), n(w["breaks"])]

    listed = httpx.get(proxy.url + "/ctx/v1/sessions", headers={"x-ctx-admin-token": "s3cret"}).json()["sessions"]
    sessions = rows(out, "recent sessions")
    assert [s[0] for s in sessions] == [s["session"] for s in listed]
    for row, s in zip(sessions, listed):
        assert row[1:8] == [s["model"], n(s["requests"]), n(s["prompt"]), n(s["cached"]), n(s["breaks"]),
                            n(s["offloads"]), n(s["saved_tokens"])]
        assert row[-1] == (s["last_break"] or "-")
    assert next(s for s in sessions if s[0] == session)[-1] == "system prompt changed"

    # --window, --token, --json
    r = cli("--url", proxy.url, "--token", "s3cret", "--window", "all", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["totals"]["all"]["requests"] == 4

    # a client's key: its own tenant only
    r = cli("--url", proxy.url, "--api-key", "sk-b", "--window", "all")
    assert r.returncode == 0, r.stderr
    assert "this API key's tenant, all time" in r.stdout and total(r.stdout, "requests") == "1 (errors 0)"
    assert session not in r.stdout

    # one session's timeline, request by request, the break on the third
    r = cli("--url", proxy.url, "--session", session, env={"CTXPROXY_ADMIN_TOKEN": "s3cret"})
    assert r.returncode == 0, r.stderr
    timeline = httpx.get(f"{proxy.url}/ctx/v1/sessions/{session}", headers={"x-ctx-admin-token": "s3cret"}).json()
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"session {session}: route default, model gpt-4o, 3 requests")
    assert lines[1].startswith("offloads 0, compactions 0, tokens saved ")
    table = [re.split(r"\s{2,}", x.strip()) for x in lines[4:]]
    assert len(table) == 3
    for cells, req in zip(table, timeline["requests"]):
        assert cells[2:6] == ["200", n(req["prompt"]), n(req["cached"]), n(req["cacheable"])]
        assert cells[8] == n(req["saved"]) and req["saved"] == req["client_tokens"] - req["sent_tokens"]
    assert [c[-1] for c in table] == ["-", "-", "system prompt changed"]

    r = cli("--url", proxy.url, "--session", "no-such-session", "--token", "s3cret")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("ctxproxy: the proxy at") and "no session 'no-such-session'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_stats_wants_the_admin_token(proxy):
    for args in ((), ("--token", "wrong")):
        r = cli("--url", proxy.url, *args)
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.startswith("ctxproxy: the proxy wants the admin token: pass --token or set "
                                   "CTXPROXY_ADMIN_TOKEN"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_stats_on_an_unreachable_proxy_is_one_line():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    r = cli_process("--url", url)  # the one run as users run it
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"ctxproxy: cannot reach the proxy at {url}: "), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_request_s_items_read_as_text_in_every_api_shape():
    """`ctxproxy stats --request` shows each item's text: Responses outputs and calls, Messages parts too."""
    from proxy.cli.stats import _text

    assert _text({"type": "function_call_output", "call_id": "c1", "output": "README.md\nsetup.py"}) == \
        "README.md\nsetup.py"
    assert _text({"type": "custom_tool_call_output", "output": [{"type": "input_text", "text": "done"}]}) == "done"
    assert _text({"type": "function_call", "name": "shell", "arguments": '{"command": "ls"}'}) == \
        'shell({"command": "ls"})'
    assert _text({"role": "user", "content": [{"type": "tool_result", "content": [{"type": "text", "text": "ok"}]}]}) \
        == "ok"
    assert _text({"role": "assistant", "content": [{"type": "text", "text": "hi"},
                                                   {"type": "tool_use", "name": "Bash", "input": {"c": 1}}]}) == \
        "hi\nBash({'c': 1})"
    call = {"function": {"name": "f", "arguments": "{}"}}
    assert _text({"role": "assistant", "content": "x", "tool_calls": [call]}) == "x\nf({})"


PRICE = {"input": 1.25, "cached_input": 0.125, "output": 10.0}


def test_cost_and_savings_in_dollars_for_the_models_priced_in_config(make_proxy, upstream):
    """Users compare proxies in dollars: a model priced in config.yaml has its figures in dollars too, computed
    from the provider's own usage; an unpriced model says how to price it."""
    p = make_proxy(real=True, models={"gpt-4o": {"price": PRICE}})
    msgs = conversation(8)
    for _ in range(2):
        post(p, msgs, "sk-a", "usd-1")
    post(p, conversation(2), "sk-a", model="gpt-4o-mini")
    stats = settled(p, 3, {})
    (priced,) = [g for g in stats["groups"] if g["model"] == "gpt-4o"]
    (unpriced,) = [g for g in stats["groups"] if g["model"] == "gpt-4o-mini"]
    w = priced["all"]
    expect = ((w["prompt"] - w["cached"]) * 1.25 + w["cached"] * 0.125 + w["completion"] * 10.0) / 1e6
    assert w["cached"] > 0 and w["cost_usd"] == round(expect, 4)
    assert w["saved_usd"] == round(max(w["saved_tokens"], 0) * 1.25 / 1e6, 4)
    assert unpriced["all"]["cost_usd"] is None
    assert stats["totals"]["all"]["cost_usd"] == w["cost_usd"]  # the priced groups' sum
    r = cli("--url", p.url, "--window", "all")
    assert total(r.stdout, "cost") == f"${w['cost_usd']:,.2f} (as billed, the models priced in config.yaml)"
    bare = make_proxy(real=True)
    post(bare, conversation(2), "sk-a")
    settled(bare, 1, {})
    assert "set models.<name>.price in config.yaml" in total(cli("--url", bare.url).stdout, "cost")


def test_cache_writes_are_priced_as_the_provider_bills_them(make_proxy, upstream):
    """Anthropic bills a prompt token written to its cache apart (cache_creation_input_tokens): a price's
    cache_write is applied to exactly those."""
    model = "claude-sonnet-4-6"
    price = {"input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0}
    p = make_proxy(real=True, models={model: {"price": price}}, routes=[
        {"name": "anthropic", "upstream": {"base_url": upstream.base_url, "api": "anthropic"}}])
    system = "You are a careful engineer. " * 400
    for turn in range(2):
        r = httpx.post(p.url + "/v1/messages", timeout=30, headers={"x-api-key": "sk-usd", "anthropic-version":
                                                                    "2023-06-01", "x-session-id": "usd-cw"},
                       json={"model": model, "max_tokens": 64, "system": system,
                             "messages": [{"role": "user", "content": f"step {i}"} if i % 2 == 0 else
                                          {"role": "assistant", "content": f"done {i}"} for i in range(2 * turn + 1)]})
        assert r.status_code == 200, r.text
    stats = settled(p, 2, {})
    (g,) = [g for g in stats["groups"] if g["model"] == model]
    w = g["all"]
    assert w["cache_write"] > 0, w
    expect = ((w["prompt"] - w["cached"] - w["cache_write"]) * 3.0 + w["cached"] * 0.3 + w["cache_write"] * 3.75
              + w["completion"] * 15.0) / 1e6
    assert w["cost_usd"] == round(expect, 4)
