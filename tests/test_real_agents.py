"""The real Codex CLI and Claude Code, driven through a running proxy to the scripted mock provider.

Each test runs the agent binary (pinned in tests/agents/package.json, installed by
`npm ci --prefix tests/agents`) as a subprocess, non-interactive, with a temporary HOME
and nothing of this machine's configuration. The model is the mock's ShellAgent
(tests/_mock_agent.py): it answers each turn with a call of the agent's own shell tool
whose command prints tens of kilobytes, then a final message. At a 32k window the
same session sent straight to the mock overflows, and the agent says so; through the
proxy it completes, because the proxy offloaded or compacted.

Codex reaches the proxy two ways: a custom provider over HTTP (`supports_websockets =
false`, what the README tells users to set), and its defaults (only `openai_base_url`),
where it opens a Responses WebSocket first and falls back to HTTP after about 6.5 s of
retries while the proxy refuses it; the defaults test asserts the target (no WebSocket
trouble) and is an expected failure until the proxy serves WebSocket mode.

Without the binaries the tests skip with the install command; under CI=true they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _mock_agent import tool_names
from agent_runs import AgentRun
from mock_upstream import MockUpstream, ShellAgent

AGENTS = Path(__file__).parent / "agents"
BIN = AGENTS / "node_modules" / ".bin"
INSTALL = "npm ci --prefix tests/agents"
WINDOW = 32_000
CODEX_MODEL = "gpt-5.5"  # in Codex's bundled model catalog (no "metadata not found" warning)
CLAUDE_MODEL = "claude-opus-5-5"  # Claude Code 2.1.328's default model
CALLS = 10  # shell calls per session
CODEX_COMMAND = "seq -f 'call {n} line %g' 1 1700"  # ~29 KB of output per call, each call's its own
CLAUDE_COMMAND = "seq -f 'call {n} line %g' 1 1500"  # ~26 KB: under Claude Code's 30,000-character cut
FINAL = "All done: the listing ran as asked."
CODEX_OVERFLOW = "Codex ran out of room in the model's context window"
CLAUDE_OVERFLOW = "Autocompact is thrashing"
WEBSOCKET_TROUBLE = ("failed to connect to Responses WebSocket", "Reconnecting...", "Falling back from WebSockets")
RUN_TIMEOUT_S = 45  # one agent session; under the suite's 60 s per test


def binary(name: str) -> str:
    path = BIN / name
    if not os.access(path, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is missing; install the real agents: {INSTALL} (.ci/run does)", pytrace=False)
        pytest.skip(f"{name} is not installed; to run the real-agent tests: {INSTALL}")
    return str(path)


Run = AgentRun


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """Only what the agent needs: PATH (node for Codex's launcher), a private HOME, the given variables."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            "TERM": "dumb", "NO_COLOR": "1", **extra}


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> Run:
    cwd.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    return Run(p.returncode, p.stdout, p.stderr)


# --------------------------------------------------------------------------- Codex

def codex(tmp_path: Path, config: str, **env: str) -> Run:
    """`codex exec` on one prompt, in its own CODEX_HOME holding `config`, running commands unsandboxed."""
    home = tmp_path / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(f'model = "{CODEX_MODEL}"\n' + config)
    cmd = [binary("codex"), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
           "--color", "never", "Print the long listing, then report."]
    return run(cmd, tmp_path / "work", clean_env(home, CODEX_HOME=str(codex_home), **env))


def codex_provider(base_url: str) -> str:
    """A custom Responses provider over HTTP (no WebSocket), what the README tells Codex users to set."""
    return ('model_provider = "ctx"\n[model_providers.ctx]\nname = "ctx"\n'
            f'base_url = "{base_url}"\nwire_api = "responses"\nenv_key = "OPENAI_API_KEY"\n'
            "supports_websockets = false\n")


# --------------------------------------------------------------------------- Claude Code

def claude(tmp_path: Path, base_url: str) -> Run:
    """`claude -p` on one prompt with only its Bash tool allowed (it refuses to skip permissions as root)."""
    home = tmp_path / "home"
    cmd = [binary("claude"), "-p", "Print the long listing, then report.", "--model", CLAUDE_MODEL,
           "--allowedTools", "Bash", "--output-format", "text"]
    env = clean_env(home, ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="sk-ant-test", DISABLE_TELEMETRY="1",
                    DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    return run(cmd, tmp_path / "work", env)


# --------------------------------------------------------------------------- what the provider saw

def agent(upstream: MockUpstream, command: str, model: str, window: int = WINDOW, calls: int = CALLS) -> ShellAgent:
    upstream.windows[model] = window
    a = ShellAgent(command, calls, FINAL)
    upstream.default_reply = a
    return a


def rejected(upstream: MockUpstream) -> list[Any]:
    return [r for r in upstream.requests if r.status is not None and r.status >= 400]


def overflowed(upstream: MockUpstream, wording: str) -> bool:
    """Whether the mock rejected a prompt as over the window, in its API's wording."""
    return any(r.status == 400 and wording.encode() in (r.answer or b"") for r in upstream.requests)


def proxy_stats(p: Any) -> dict[str, Any]:
    totals: dict[str, Any] = p.get("/ctx/v1/stats").json()["totals"]["all"]
    return totals


def strings(obj: Any) -> list[str]:
    """Every string value in a JSON document."""
    if isinstance(obj, str):
        return [obj]
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else []
    return [s for v in values for s in strings(v)]


def upstream_saw_the_proxy(upstream: MockUpstream) -> None:
    """The provider got the proxy's work: its read tool after the client's, and a result replaced by a preview."""
    last = upstream.requests[-1].json
    assert tool_names(last)[-1] == "context_read", tool_names(last)
    assert any('context_read(handle="ctx_' in s for s in strings(last)), "no offload preview in the last request"


# --------------------------------------------------------------------------- the tests

def test_the_pinned_binaries_run_offline(tmp_path: Path) -> None:
    """The versions package.json pins, each with its native binary for this platform (no download at run time)."""
    pins = json.loads((AGENTS / "package.json").read_text())["dependencies"]
    env = clean_env(tmp_path)
    codex_version = run([binary("codex"), "--version"], tmp_path, env)
    assert codex_version.stdout.split() == ["codex-cli", pins["@openai/codex"]], codex_version.output
    claude_version = run([binary("claude"), "--version"], tmp_path, env)
    assert claude_version.stdout.split()[0] == pins["@anthropic-ai/claude-code"], claude_version.output


def test_codex_alone_overflows_the_window(upstream: MockUpstream, tmp_path: Path) -> None:
    a = agent(upstream, CODEX_COMMAND, CODEX_MODEL)
    r = codex(tmp_path, codex_provider(upstream.base_url), OPENAI_API_KEY="sk-test")
    assert r.returncode != 0 and CODEX_OVERFLOW in r.output, r.tail()
    assert overflowed(upstream, "context_length_exceeded")
    assert 0 < a.made < CALLS


def test_codex_through_the_proxy_finishes_in_the_same_window(upstream: MockUpstream, make_proxy: Any,
                                                              tmp_path: Path) -> None:
    a = agent(upstream, CODEX_COMMAND, CODEX_MODEL)
    p = make_proxy(real=True, models={CODEX_MODEL: {"context_window": WINDOW}})
    r = codex(tmp_path, codex_provider(p.url + "/v1"), OPENAI_API_KEY="sk-test")
    assert r.returncode == 0 and FINAL in r.stdout, r.tail()
    assert a.made == CALLS and a.tools_seen == ["exec_command"] * CALLS
    assert not rejected(upstream), [(x.status, x.answer) for x in rejected(upstream)]
    upstream_saw_the_proxy(upstream)
    stats = proxy_stats(p)
    assert stats["offloads"] + stats["compactions"] >= CALLS - 1, stats


def test_claude_code_alone_overflows_the_window(upstream: MockUpstream, tmp_path: Path) -> None:
    a = agent(upstream, CLAUDE_COMMAND, CLAUDE_MODEL)
    r = claude(tmp_path, upstream.base_url.removesuffix("/v1"))
    assert r.returncode != 0 and CLAUDE_OVERFLOW in r.output, r.tail()
    assert overflowed(upstream, "prompt is too long")
    assert a.summaries > 0  # Claude Code compacted on its own, and still ran out
    assert a.made < CALLS


@pytest.mark.parametrize("window, calls", [(WINDOW, CALLS), (64_000, 20), (128_000, 36)], ids=["32k", "64k", "128k"])
def test_claude_code_through_the_proxy_finishes_in_the_same_window(upstream: MockUpstream, make_proxy: Any,
                                                                    tmp_path: Path, window: int, calls: int) -> None:
    """The README's advice, checked with the real binary: give ctxproxy the window (here under `models:`) and
    leave Claude Code's own alone; at 32k, 64k and 128k a session of about twice the window or more completes."""
    a = agent(upstream, CLAUDE_COMMAND, CLAUDE_MODEL, window, calls)
    p = make_proxy(real=True, models={CLAUDE_MODEL: {"context_window": window}})
    r = claude(tmp_path, p.url)
    assert r.returncode == 0 and FINAL in r.stdout, r.tail()
    assert a.made == calls and a.tools_seen == ["Bash"] * calls
    assert not rejected(upstream), [(x.status, x.answer) for x in rejected(upstream)]
    upstream_saw_the_proxy(upstream)
    stats = proxy_stats(p)
    assert stats["offloads"] + stats["compactions"] >= (calls - 1 if window == WINDOW else 1), stats
    assert a.summaries == stats["own_calls"]  # Claude Code never compacted on its own: every summary was ctxproxy's


@pytest.mark.parametrize("base", ["/v1", "/r/default/v1"])
def test_codex_at_its_defaults_is_managed_without_websocket_trouble(upstream: MockUpstream, make_proxy: Any,
                                                                      tmp_path: Path, base: str) -> None:
    """Codex's built-in provider, only its base URL changed: it talks to the proxy over a Responses WebSocket."""
    a = agent(upstream, CODEX_COMMAND, CODEX_MODEL)
    p = make_proxy(real=True, models={CODEX_MODEL: {"context_window": WINDOW}})
    r = codex(tmp_path, f'openai_base_url = "{p.url}{base}"\n', OPENAI_API_KEY="sk-test", CODEX_API_KEY="sk-test")
    assert r.returncode == 0 and FINAL in r.stdout, r.tail()
    trouble = [t for t in WEBSOCKET_TROUBLE if t in r.output]
    assert not trouble, f"{trouble} in Codex's output:\n{r.tail()}"
    assert a.made == CALLS
    assert not rejected(upstream), [(x.status, x.answer) for x in rejected(upstream)]
    stats = proxy_stats(p)
    assert stats["offloads"] + stats["compactions"] >= CALLS - 1, stats
