"""A password or key with any printable character never reaches an output channel.

The channels: `redact` and `redact_url` themselves, the JSON log line (both of its
paths), the start-up line on stdout and the `ctxproxy starting` log line, `ctxproxy
check --offline`, the store-unavailable warning and a span's recorded exception.
Every store URL form is fed passwords built from every printable ASCII character
(space included), raw and percent-encoded.
"""

from __future__ import annotations

import json
import logging
import os
import string
import sys
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from proxy import logs
from proxy import redact as redaction
from proxy.cli.check import startup_line
from proxy.config import build_settings
from proxy.errors import ConfigError
from proxy.logs import JsonFormatter
from proxy.redact import MASK, redact, redact_url, register_secrets, register_settings, register_url
from proxy.store.base import StoreError
from proxy.store.guarded import GuardedStore

CHARS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]  # the 95 printable ones, space included
# One password per character, the character twice between letters (so a parser that stops at it shows the rest),
# and one holding them all.
PASSWORDS = [f"Pw{c}9x{c}Zq" for c in CHARS] + ["".join(CHARS)]


def forms(pw: str, pw2: str | None = None) -> list[str]:
    """The store URL forms, `pw` as the password (raw, and percent-encoded) and `pw2` as sentinel_password."""
    pw2 = pw2 or pw[::-1]
    enc = quote(pw, safe="")
    return [f"redis://:{pw}@host:6379/0", f"redis://user:{pw}@h/0", f"redis://:{enc}@host:6379/0",
            f"redis://user:{enc}@h/0", f"rediss://default:{pw}@h.example.com:6380/2",
            f"redis+sentinel://:{pw}@h:26379/svc?sentinel_password={pw2}",
            f"redis+sentinel://:{enc}@h1:26379,h2:26379/svc/1?sentinel_password={quote(pw2, safe='')}",
            f"rediss+sentinel://h:26379/svc?sentinel_password={pw2}&wait=1",
            f"redis+cluster://:{pw}@h1:7000,h2:7001", f"rediss+cluster://u:{enc}@h1:7000"]


def leaks(out: str, *secrets: str) -> list[str]:
    return [s for s in secrets if s in out]


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no secret registered, and leaves none behind."""
    monkeypatch.setattr(redaction, "_secrets", set())
    monkeypatch.setattr(redaction, "_known", None)
    monkeypatch.setattr(redaction, "_suspect", redaction._HINTS)


# --------------------------------------------------------------------------- the functions


@pytest.mark.parametrize("pw", PASSWORDS, ids=range(len(PASSWORDS)))
def test_redact_url_masks_any_password_in_any_store_url_form_by_parsing_alone(pw):
    for url in forms(pw):
        out = redact_url(url)
        assert not leaks(out, pw, pw[::-1], quote(pw, safe=""), quote(pw[::-1], safe="")), (url, out)
        assert MASK in out


@pytest.mark.parametrize("pw", PASSWORDS, ids=range(len(PASSWORDS)))
def test_free_text_masks_any_password_in_a_message_once_the_url_is_known(pw):
    for url in forms(pw):
        register_url(url)
        for text in (f"cannot reach {url} (timeout)", f"ConnectionError({url!r})", json.dumps({"u": url})):
            out = redact(text)
            assert not leaks(out, pw, pw[::-1], quote(pw, safe="")), (text, out)


@pytest.mark.parametrize("c", [c for c in CHARS if c != " "])
def test_free_text_masks_an_unknown_urls_password_with_any_character_but_a_space(c):
    """A URL nobody registered (in a third party's error): the pattern alone masks it, whatever the character."""
    pw = f"Pw{c}9x{c}Zq"
    for url in (f"redis://:{pw}@host:6379/0", f"rediss://user:{pw}@h:6380/0", f"https://u:{pw}@h.example/x",
                f"redis://h:6379/0?password={pw}", f"redis+sentinel://h:26379/s?sentinel_password={pw}"):
        out = redact(f"Error connecting to {url}: refused")
        assert pw not in out and "9x" + c + "Zq" not in out, (url, out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="".join(CHARS), min_size=4, max_size=24), st.sampled_from(range(10)))
def test_generated_passwords_never_survive_the_store_setting(pw, form):
    redaction._secrets.clear()
    redaction._known, redaction._suspect = None, redaction._HINTS
    # a password that is a piece of the lines themselves ('127.', '***@h') proves nothing: set aside
    plain = startup_line(build_settings({}, {}), "test") + " store is down: refused " + \
        " ".join(redact_url(u) for u in forms("Pw0"))
    assume(pw not in plain)
    url = forms(pw)[form]
    try:
        s = build_settings({"store": url}, {})
    except ConfigError as e:  # a form these characters break: the refusal names no password either
        assert pw not in str(e)
        return
    register_settings(s)
    out = startup_line(s, "test") + "\n" + redact(f"store {s.store} is down: refused {url!r}")
    assert pw not in out, out


def test_query_options_with_secrets_are_masked_and_others_kept():
    assert redact_url("redis+sentinel://h:26379/svc?sentinel_password=s3cr%26t&wait=1") == \
        "redis+sentinel://h:26379/svc?sentinel_password=***&wait=1"
    assert redact("GET https://h/v1?api-version=2024&api_key=abcd1234 failed") == \
        "GET https://h/v1?api-version=2024&api_key=*** failed"
    assert redact_url("redis://h:6379/0?password=p%40ss") == "redis://h:6379/0?password=***"


def test_api_key_shapes_are_masked_in_free_text():
    for key in ("sk-" + "a1B2" * 10, "sk-ant-api03-" + "x_Y-" * 10, "sk-proj-" + "Zz09" * 12,
                "AIza" + "Sy" + "b" * 33):
        out = redact(f"upstream refused key {key}; authorization: Bearer {key}")
        assert key not in out and MASK in out, out
    out = redact("headers: {'x-api-key': 'k-1234567890abcdef', 'Authorization': 'Bearer abc.def-ghi_12345'}")
    assert "k-1234567890abcdef" not in out and "abc.def-ghi_12345" not in out, out


def test_short_or_common_text_is_left_alone():
    register_secrets("abc", None, "")  # too short to mask without masking ordinary text
    plain = "ctxproxy: route default -> https://api.openai.com/v1 (abc); sk-short; Bearer of news"
    assert redact(plain) == plain


# --------------------------------------------------------------------------- the channels


def _store_env(monkeypatch: pytest.MonkeyPatch, url: str, **extra: str) -> None:
    for k in list(os.environ):
        if k.startswith("CTXPROXY_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("CTXPROXY_STORE", url)
    for k, v in extra.items():
        monkeypatch.setenv(k, v)


def _main(*argv: str) -> int:
    from proxy.cli import main

    try:
        main(list(argv))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


@pytest.mark.parametrize("pw", PASSWORDS, ids=range(len(PASSWORDS)))
def test_check_offline_never_prints_the_store_password(pw, monkeypatch, capsys):
    for url in forms(pw):
        _store_env(monkeypatch, url)
        code = _main("check", "--offline")
        out = capsys.readouterr()
        assert not leaks(out.out + out.err, pw, pw[::-1], quote(pw, safe="")), (url, out)
        assert code in (0, 2), (url, out.err)


def test_check_offline_and_logs_never_show_an_injected_api_key(monkeypatch, capsys, tmp_path, log_stream):
    key = 'sk-ant-api03-{"^ key\\'
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"routes": [{"name": "r", "upstream": {"base_url": "https://api.anthropic.com/v1",
                                                                     "api_key_env": "MY_PROVIDER_KEY"}}]}))
    _store_env(monkeypatch, "sqlite:///:memory:", MY_PROVIDER_KEY=key)
    assert _main("check", "--offline", "--config", str(cfg)) == 0
    out = capsys.readouterr()
    assert key not in out.out + out.err and "key from $MY_PROVIDER_KEY" in out.out
    logs.event("upstream refused", logging.WARNING, error=f"401: invalid x-api-key {key}")
    line = log_stream.getvalue()
    assert key not in line and json.dumps(key)[1:-1] not in line, line


def test_serve_start_up_line_and_starting_log_line(monkeypatch, capsys):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    monkeypatch.setattr(uvicorn.Server, "run", lambda *a, **k: None)  # serve binds, then runs the server: not here
    names = (logs.LOGGER_NAME, "uvicorn", "uvicorn.error")
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level, logging.getLogger(n).propagate)
             for n in names}
    monkeypatch.setattr(logs, "_direct", None)
    served = 0
    try:
        for pw in PASSWORDS[::7] + PASSWORDS[-1:]:
            for url in forms(pw):
                _store_env(monkeypatch, url)
                _main("serve")
                logs.flush_logs()
                out = capsys.readouterr()
                assert not leaks(out.out + out.err, pw, pw[::-1], quote(pw, safe=""),
                                 json.dumps(pw)[1:-1]), (url, out)
                if "listening" in out.out:
                    assert "store: " in out.out and MASK in out.out
                    assert "ctxproxy starting" in out.err
                    served += 1
    finally:
        for n, (handlers, level, propagate) in saved.items():
            lg = logging.getLogger(n)
            lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate
    assert served > 100  # most forms are valid settings with these passwords: serve got as far as starting


class _Down:
    """A store that fails every call, saying where it could not connect."""

    def __init__(self, why: str) -> None:
        self.why = why

    async def get(self, key: str) -> Any:
        raise StoreError(self.why)

    async def ping(self) -> bool:
        return False

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("pw", PASSWORDS, ids=range(len(PASSWORDS)))
async def test_the_store_unavailable_warning_never_shows_the_password(pw, log_stream):
    logs.log.handlers[:] = [logs._direct]
    for url in forms(pw):
        g = GuardedStore(_Down("connection refused"), timeout=0.5, name=url)  # type: ignore[arg-type]
        with pytest.raises(StoreError):
            await g.get("k")
        assert await g.problem() == "connection refused"
    register_settings(build_settings({}, {}))
    for url in forms(pw):
        register_url(url)
        g = GuardedStore(_Down(f"cannot connect to {url}"), timeout=0.5, name=url)  # type: ignore[arg-type]
        await g.ping()
    text = log_stream.getvalue()
    assert "store unavailable" in text
    assert not leaks(text, pw, pw[::-1], quote(pw, safe=""), json.dumps(pw)[1:-1], json.dumps(pw[::-1])[1:-1])


def test_a_log_record_masks_passwords_with_quotes_and_backslashes_in_msg_fields_and_exc():
    pw = 'q"u\\o^t{e}'
    register_url(f"redis://:{pw}@10.0.0.1:6379/0")
    try:
        raise ConnectionError(f"cannot reach redis://:{pw}@10.0.0.1:6379/0")
    except ConnectionError:
        record = logging.LogRecord("ctxproxy", logging.ERROR, __file__, 1, f"store rediss://u:{pw}@h down",
                                   None, sys.exc_info())
    record.fields = {"store": f"redis://:{pw}@10.0.0.1:6379/0", "nested": {"u": [f"x {pw} y"]}}
    line = JsonFormatter().format(record)
    assert not leaks(line, pw, json.dumps(pw)[1:-1]), line
    out = json.loads(line)
    assert out["msg"] == "store rediss://u:***@h down" and out["store"] == "redis://:***@10.0.0.1:6379/0"
    assert out["nested"] == {"u": ["x *** y"]}


def test_an_unregistered_password_with_a_quote_is_masked_in_the_log_line():
    """The fallback alone (nobody registered it): the value is masked before the line is dumped and escaped."""
    pw = 'pa"ss{^}word'
    record = logging.LogRecord("ctxproxy", logging.ERROR, __file__, 1, "store down", None, None)
    record.fields = {"error": f"Error connecting to redis://:{pw}@10.0.0.1:6379/0."}
    line = JsonFormatter().format(record)
    assert pw not in line and json.dumps(pw)[1:-1] not in line and "ss{^}word" not in line, line


def test_a_spans_recorded_exception_is_redacted():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from proxy.telemetry.otel import OtelRequestTrace

    pw = 'sp"an^{pass}'
    register_url(f"redis://:{pw}@h:6379/0")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    req = OtelRequestTrace(tracer, tracer.start_span("r"), "openai")
    with pytest.raises(RuntimeError), req.activate():
        raise RuntimeError(f"bug with redis://:{pw}@h:6379/0 and key sk-proj-{'Ab1_' * 10}")
    (span,) = exporter.get_finished_spans()
    (ev,) = [e for e in span.events if e.name == "exception"]
    text = json.dumps(dict(ev.attributes or {}))
    assert pw not in text and json.dumps(pw)[1:-1] not in text and "Ab1_Ab1_" not in text, text
    assert "redis://:***@h:6379/0" in str(ev.attributes["exception.message"])
