"""Config that catches mistakes: impossible combinations refused in one line naming the keys, typos answered with
the nearest valid key, at every level of config.yaml."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config import build_settings
from proxy.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        build_settings(raw, env={}, source="config.yaml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("config.yaml: ")
    return msg


@pytest.mark.parametrize("raw,says", [
    ({"defaults": {"compress": {"trigger": 0.1, "target": 0.5}}},
     "defaults.compress: trigger (0.1) must be above target (0.5)"),
    ({"defaults": {"compress": {"trigger": 0.5, "target": 0.5}}}, "defaults.compress: trigger (0.5) must be above"),
    # the route set one of the two keys: the route is where to look
    ({"defaults": {"compress": {"trigger": 0.5}}, "routes": [{"name": "a", "compress": {"target": 0.6}}]},
     "routes[0].compress: trigger (0.5) must be above target (0.6)"),
    # the route set neither: every route inherits the mistake from the defaults
    ({"defaults": {"compress": {"trigger": 0.15}}, "routes": [{"name": "a", "offload": {"enabled": False}}]},
     "defaults.compress: trigger (0.15) must be above target (0.2)"),
    ({"defaults": {"compress": {"precompute": 0.9}}}, "defaults.compress: precompute (0.9) must be below trigger"),
    ({"defaults": {"compress": {"strategy": "facts", "facts": []}}}, "defaults.compress: strategy facts needs"),
    ({"defaults": {"status_bar": {"context": {"at": 1.5, "text": "full"}}}},
     "defaults.status_bar: context.at (1.5) is a share of the window"),
    ({"routes": [{"name": "claude", "cache_hints": {"breakpoints": "anthropic", "max_breakpoints": 6}}]},
     "routes[0].cache_hints: max_breakpoints (6) must be at most 4"),
    ({"models": {"m": {"context_window": -8000}}}, "models.m.context_window: Input should be greater than 0"),
    ({"routes": [{"name": "a", "context_window": -1}]}, "routes[0].context_window: Input should be greater than 0"),
    ({"default_context_window": 0}, "default_context_window: Input should be greater than 0"),
])
def test_impossible_settings_are_refused_naming_the_keys(raw, says):
    assert says in refusal(raw)


def test_a_lowered_trigger_with_the_default_precompute_is_accepted():
    """precompute left at its default (0.72) under trigger 0.7 only never fires: accepted (check warns)."""
    s = build_settings({"defaults": {"compress": {"trigger": 0.7}}}, env={})
    assert s.route("default").section("compress").trigger == 0.7


@pytest.mark.parametrize("raw,says", [
    ({"stor": "sqlite:///x.db"}, "config.yaml: stor: unknown key; did you mean 'store'?"),
    ({"server": {"prot": 9000}}, "server.prot: unknown key; did you mean 'port'?"),
    ({"logging": {"levle": "info"}}, "logging.levle: unknown key; did you mean 'level'?"),
    ({"upstream": {"read_timout": 3}}, "upstream.read_timout: unknown key; did you mean 'read_timeout'?"),
    ({"models": {"m": {"context_windw": 8000}}}, "models.m.context_windw: unknown key; did you mean 'context_window'?"),
    ({"defaults": {"compres": {}}}, "defaults.compres: unknown section; did you mean 'compress'?"),
    ({"defaults": {"offload": {"tool_result_token": 500}}},
     "defaults.offload.tool_result_token: unknown key; did you mean 'tool_result_tokens'?"),
    ({"defaults": {"status_bar": {"todo": {"toolz": ["todo"]}}}},
     "defaults.status_bar.todo.toolz: unknown key; did you mean 'tools'?"),
    ({"routes": [{"name": "a", "offlaod": {}}]}, "routes[0].offlaod: unknown key; did you mean 'offload'?"),
    ({"routes": [{"name": "a", "context_windo": 5}]},
     "routes[0].context_windo: unknown key; did you mean 'context_window'?"),
    ({"routes": [{"name": "a", "match": {"modle": "x*"}}]},
     "routes[0].match.modle: unknown key; did you mean 'model'?"),
    ({"routes": [{"name": "a", "upstream": {"base_ur": "http://x/v1"}}]},
     "routes[0].upstream.base_ur: unknown key; did you mean 'base_url'?"),
    ({"routes": [{"name": "a", "compress": {"triger": 0.9}}]},
     "routes[0].compress.triger: unknown key; did you mean 'trigger'?"),
])
def test_an_unknown_key_gets_the_nearest_valid_name(raw, says):
    assert says in refusal(raw)


def test_a_key_near_nothing_gets_the_valid_keys_of_its_place():
    msg = refusal({"server": {"zzz": 1}})
    assert "server.zzz: unknown key (valid here: " in msg and "max_body_bytes" in msg and "did you mean" not in msg


def test_the_cli_says_it_in_one_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("defaults:\n  compress: {trigger: 0.1, target: 0.5}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "proxy.cli", "check", "--config", str(f)],
                       capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"ctxproxy: invalid configuration: {f}: defaults.compress: trigger (0.1) must be "
                                f"above target (0.5): a compaction brings the prompt from trigger down to target")
