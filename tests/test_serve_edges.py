"""What a user meets first when `ctxproxy serve` cannot do it all: a port already taken is one line on stderr (and
nothing says "listening"), a store that does not answer at start is one plain warning line, its password masked."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import test_serve
from cli_main import run_main, run_side_by_side

ROOT = Path(__file__).resolve().parents[1]
BUSY = "address already in use (another ctxproxy? set --port or server.port)"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    return {**env, "PYTHONPATH": str(ROOT)}


@contextmanager
def _taken(reuse_port: bool = False) -> Iterator[int]:
    """A port something else listens on (`reuse_port`: as another `serve --workers N` does, SO_REUSEPORT set)."""
    with socket.socket() as s:
        if reuse_port:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_already_taken_is_one_line_and_nothing_says_listening(tmp_path):
    serve = [sys.executable, "-m", "proxy.cli", "serve", "--port"]
    with _taken() as port, _taken(reuse_port=True) as shared:
        single, workers, beside_workers = run_side_by_side(
            [*serve, str(port)], [*serve, str(port), "--workers", "2"], [*serve, str(shared), "--workers", "2"],
            cwd=tmp_path, env=_env())
    for r, p in ((single, port), (workers, port), (beside_workers, shared)):
        assert r.returncode == 3, r.stderr
        assert r.stderr.splitlines() == [f"ctxproxy: cannot listen on 127.0.0.1:{p}: {BUSY}"], r.stderr
        assert r.stdout == "" and "listening" not in r.stderr.lower()
    assert not (tmp_path / "ctxproxy.db").exists()  # nothing was started


def test_an_address_no_interface_has_is_named_with_the_setting_to_change():
    r = run_main("serve", "--host", "192.0.2.1", "--port", "8080", env=_env())  # TEST-NET-1: never local
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.splitlines() == ["ctxproxy: cannot listen on 192.0.2.1:8080: no interface has this address "
                                     "(set --host or server.host)"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_binds_its_port_before_it_starts_whether_one_process_or_workers(tmp_path, workers):
    s = test_serve.serve(tmp_path, {"PYTHONPATH": str(ROOT)}, "--workers", workers)
    try:
        port = int(s.url.rsplit(":", 1)[1])
        with socket.socket() as other, pytest.raises(OSError):  # bound and listening: not to be taken
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", port))
    finally:
        assert test_serve.stop(s)
    assert "cannot listen" not in s.log.read_text()


def test_a_store_down_at_start_is_one_plain_line_on_stderr_its_password_masked(tmp_path):
    s = test_serve.serve(tmp_path, {"CTXPROXY_STORE": "redis://:secret@127.0.0.1:1/0", "PYTHONPATH": str(ROOT)})
    test_serve.stop(s)  # serving answered /healthz: its start, the store asked, is over
    text = s.log.read_text()
    plain = [line for line in text.splitlines() if not line.startswith("{")]
    assert len(plain) == 1, text
    (line,) = plain
    assert line.startswith("ctxproxy: warning: store redis://:***@127.0.0.1:1/0 is unreachable (")
    assert "connect" in line.lower() and line.endswith("); requests are forwarded unmodified until it answers")
    assert "secret" not in text
