"""Config: defaults, per-route merge, environment overrides, and one-line errors naming the key."""

from __future__ import annotations

import sys
import textwrap

import pytest
from cli_main import run_side_by_side

from proxy.config import DEFAULT_UPSTREAM, build_settings, load_settings
from proxy.errors import ConfigError


def test_builtin_defaults_without_a_file():
    s = load_settings(None, env={})
    assert s.upstream.base_url == DEFAULT_UPSTREAM and s.store.startswith("sqlite:///")
    assert s.server.port == 8080 and [r.name for r in s.routes] == ["default"]


def test_environment_overrides_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("upstream: {base_url: http://file/v1}\nstore: sqlite:///file.db\nserver: {port: 9000}\n")
    env = {"CTXPROXY_CONFIG": str(f), "CTXPROXY_UPSTREAM": "http://env:1/v1/", "CTXPROXY_STORE": "redis://r:6379/2",
           "CTXPROXY_PORT": "9100", "CTXPROXY_HOST": "0.0.0.0", "CTXPROXY_ADMIN_TOKEN": "tok"}
    s = load_settings(None, env=env)
    assert (s.upstream.base_url, s.store, s.server.port, s.server.host, s.admin_token) == (
        "http://env:1/v1", "redis://r:6379/2", 9100, "0.0.0.0", "tok")
    assert s.route("default").upstream.base_url == "http://env:1/v1"


def test_route_upstream_inherits_and_overrides_global():
    s = build_settings({"upstream": {"base_url": "http://a/v1", "read_timeout": 30},
                        "routes": [{"name": "local", "upstream": {"base_url": "http://b/v1"}}]}, env={})
    local = s.route("local")
    assert local.upstream.base_url == "http://b/v1" and local.upstream.read_timeout == 30
    assert s.route("default").upstream.base_url == "http://a/v1"


def test_shipped_example_config_is_valid():
    s = load_settings("config.yaml", env={})
    assert {r.name for r in s.routes} == {"local", "anthropic", "gemini", "default"}
    assert s.route("anthropic").upstream.speaks() == "anthropic" and s.route("default").upstream.speaks() == "openai"
    assert s.route("gemini").upstream.speaks() == "google"


@pytest.mark.parametrize("raw,where", [
    ({"upstream": {"base_url": "ftp://x"}}, "upstream.base_url: must start with http"),
    ({"upstream": {"read_timout": 3}}, "upstream.read_timout: unknown key"),
    ({"store": "postgres://x"}, "store: expected sqlite"),
    ({"server": {"port": 70000}}, "server.port"),
    ({"routes": [{"name": "a"}, {"name": "a"}]}, "routes[1].name: duplicate"),
    ({"routes": [{"name": "bad name"}]}, "routes[0].name"),
    ({"routes": [{"name": "a", "upstream": {"connect_timeout": -1}}]}, "routes[0].upstream.connect_timeout"),
    ({"routes": [{"name": "a", "offlaod": {}}]}, "routes[0].offlaod: unknown key"),
    ({"routes": [{"name": "a", "match": {"model": 3}}]}, "routes[0].match.model"),
    ({"defaults": {"nonsense": {}}}, "defaults.nonsense: unknown section"),
    ({"logging": {"level": "loud"}}, "logging.level"),
])
def test_invalid_config_names_the_key(raw, where):
    with pytest.raises(ConfigError) as exc:
        build_settings(raw, env={}, source="config.yaml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("config.yaml: ") and where in msg


def test_bad_yaml_and_missing_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("routes: [\n  - name: a\n  bad")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_settings(f, env={})
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "missing.yaml", env={})


def test_cli_reports_invalid_config_in_one_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(textwrap.dedent("""
        routes:
          - name: coding
            upstream: {base_url: not-a-url}
    """))
    r, ok = run_side_by_side([sys.executable, "-m", "proxy.cli", "check", "--config", str(f)],
                             [sys.executable, "-m", "proxy.cli", "check", "--offline", "--config", "config.yaml"])
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "routes[0].upstream.base_url" in r.stderr
    assert "Traceback" not in r.stderr
    assert ok.returncode == 0 and "route local" in ok.stdout


def _documented_defaults_differ(documented: object, code: object, where: str) -> list[str]:
    if isinstance(documented, dict) and isinstance(code, dict):
        out = []
        for key, value in documented.items():
            if key not in code:
                out.append(f"{where}.{key}: documented but the code has no such setting")
            else:
                out += _documented_defaults_differ(value, code[key], f"{where}.{key}")
        return out
    if isinstance(code, tuple):
        code = list(code)
    return [] if documented == code else [f"{where}: config.yaml says {documented!r}, the code {code!r}"]


def test_config_yaml_shows_the_code_defaults():
    """config.yaml says it shows the defaults: every default it documents is the code's own."""
    from pathlib import Path

    import yaml

    from proxy.rewrite.settings import SECTION_MODELS
    shipped = yaml.safe_load((Path(__file__).resolve().parents[1] / "config.yaml").read_text())
    builtin = load_settings(None, env={})
    problems = []
    for name, documented in shipped["defaults"].items():
        problems += _documented_defaults_differ(documented, SECTION_MODELS[name]().model_dump(), f"defaults.{name}")
    for section in ("server", "logging"):
        problems += _documented_defaults_differ(shipped[section], getattr(builtin, section).model_dump(), section)
    problems += _documented_defaults_differ(shipped["upstream"], builtin.upstream.model_dump(), "upstream")
    top = {"store": builtin.store, "store_timeout": builtin.store_timeout,
           "store_quota_bytes": builtin.store_quota_bytes,
           "default_context_window": builtin.routes[0].context_window}
    problems += _documented_defaults_differ({k: shipped[k] for k in top}, top, "config")
    assert not problems, "\n".join(problems)
    assert set(shipped["defaults"]) == set(SECTION_MODELS), "every transform's section is documented"


def test_old_cache_section_name_still_reads():
    s = build_settings({"defaults": {"cache": {"max_breakpoints": 2}}}, env={})
    assert s.route("default").section("cache_hints").max_breakpoints == 2


def test_model_encoding_setting_changes_the_count():
    from proxy.state import ProxyState
    from proxy.tokens.counter import default_counter
    from proxy.tokens.encodings import configure_model_encodings, encoding_name_for_model

    try:
        s = build_settings({"models": {"my-model": {"encoding": "cl100k_base"}}}, env={})
        ProxyState.create(s, upstream=None, store=None)  # type: ignore[arg-type]
        assert encoding_name_for_model("my-model") == "cl100k_base"
        assert encoding_name_for_model("other-model") == "o200k_base"
        text = "ünïcødé façade naïveté " * 20
        assert default_counter.count_text(text, "my-model") != default_counter.count_text(text, "other-model")
    finally:
        configure_model_encodings({})
    with pytest.raises(ConfigError, match="encoding"):
        build_settings({"models": {"m": {"encoding": "p50k_base"}}}, env={})
