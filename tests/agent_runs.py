"""Synthetic agent conversations shared by the tests that drive traffic through the proxy."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("bash", "edit")]


def conversation(turns: int) -> list[dict]:
    """A coding-agent history over 1024 tokens (so the provider caches it), one bash call per turn."""
    msgs = [{"role": "system", "content": "You are a coding agent. " + "Be careful. " * 300},
            {"role": "user", "content": "Fix the failing test in tests/test_core.py"}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                     "function": {"name": "bash", "arguments": json.dumps({"cmd": f"sed -n {i},+40p core.py"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i}: value = {i * 7}\n" * 60})
    return msgs


# --------------------------------------------------------------------------- the real Gemini CLI

GEMINI_BIN = Path(__file__).parent / "agents" / "node_modules" / ".bin" / "gemini"  # tests/agents/package.json
GEMINI_MODEL = "gemini-2.5-pro"
GEMINI_API_KEY = "gemini-test-key"
# ~/.gemini/settings.json for a headless, offline run: API-key auth (no login prompt), no usage statistics
# (Clearcut), no telemetry, no update check or nag, no IDE companion, no ripgrep download (its grep tool falls back),
# no folder-trust dialog (also --skip-trust).
GEMINI_SETTINGS: dict[str, Any] = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "ide": {"enabled": False},
    "tools": {"useRipgrep": False},
}


LISTING_LINE = re.compile(r"\s*(?:call \d+ line )?\d+\s*$")  # what the scripted agents' commands print


@dataclass
class AgentRun:
    """What an agent binary did: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def tail(self, n: int = 3000) -> str:
        """The end of what the agent printed, without the tool outputs' number lines."""
        lines = [ln for ln in self.output.splitlines() if not LISTING_LINE.match(ln)]
        return "\n".join(lines)[-n:]


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_gemini(base_url: str, workdir: Path, prompt: str = "Print the long listing, then report.", *,
               model: str = GEMINI_MODEL, api_key: str = GEMINI_API_KEY, timeout: float = 45,
               settings: dict[str, Any] | None = None, **env: str) -> AgentRun:
    """`gemini -p` on one prompt, headless, against `base_url` (the server root, a path prefix kept: the CLI adds
    /v1beta/models/{model}:streamGenerateContent?alt=sse).

    A private HOME beside `workdir` holds only GEMINI_SETTINGS (with `settings` merged in), and its TMPDIR (the CLI
    writes its error reports there); shell calls run without asking (yolo approval mode); nothing of this machine's
    configuration or environment reaches it but PATH. `env` adds variables.
    """
    home = workdir.parent / f"{workdir.name}-home"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(_merged(GEMINI_SETTINGS, settings or {}), indent=2))
    workdir.mkdir(parents=True, exist_ok=True)
    variables = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home / "tmp"),
                 "LANG": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1", "GOOGLE_GEMINI_BASE_URL": base_url,
                 "GEMINI_API_KEY": api_key, "GEMINI_TELEMETRY_ENABLED": "false", "GEMINI_CLI_NO_RELAUNCH": "true",
                 **env}
    cmd = [str(GEMINI_BIN), "--skip-trust", "--approval-mode", "yolo", "--output-format", "text", "-m", model,
           "-p", prompt]
    p = subprocess.run(cmd, cwd=workdir, env=variables, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    return AgentRun(p.returncode, p.stdout, p.stderr)
