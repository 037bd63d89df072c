"""The inspector: per request, what went upstream (the proxy's own text in place), over HTTP and in `ctxproxy stats`."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import uuid

import crafted
import httpx
import pytest
from cli_main import run_main
from proxy_server import InProcessProxy, ProxyServer, make_settings

ADMIN = {"x-ctx-admin-token": "s3cret"}


def digest(m: dict) -> str:
    """blake2b-128 of the message's canonical JSON (sorted keys), as the README says; first 16 hex characters."""
    canonical = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()[:16]


def settings(upstream, tmp_path, **logging_):
    return make_settings(upstream.base_url, f"sqlite:///{tmp_path}/i.db", env={"CTXPROXY_ADMIN_TOKEN": "s3cret"},
                         models={crafted.MODEL: {"context_window": crafted.WINDOW}},
                         defaults=crafted.INSPECT_DEFAULTS, **({"logging": logging_} if logging_ else {}))


def inspect(p: InProcessProxy, session: str, n: int | str, headers: dict) -> httpx.Response:
    return p.get(f"/ctx/v1/sessions/{session}/requests/{n}", headers=headers, timeout=10)


def cli(*args: str) -> subprocess.CompletedProcess:
    """`ctxproxy stats ...` through main in this process (tests/cli_main.py), without the admin token's env."""
    return run_main("stats", *args, env={k: v for k, v in os.environ.items() if k != "CTXPROXY_ADMIN_TOKEN"})


def check_against_upstream(data: dict, client: list[dict], sent: dict) -> None:
    """Every message sent is there, in order; the proxy's with the exact text sent, the client's by index."""
    rows = [m for m in data["messages"] if m["position"] is not None]
    assert [m["position"] for m in rows] == list(range(len(sent["messages"])))
    for row, m in zip(rows, sent["messages"]):
        assert row["role"] == m["role"] and row["tokens"] == crafted.message_tokens(m)
        if row["source"] == "client":
            assert client[row["index"]] == m and row["digest"] == digest(m)
            assert "message" not in row  # the client's content is not stored unless log_content is on
        else:
            assert row["message"] == m and row["digest"] == digest(m)
            for r in row["replaces"]:
                replaced = client[r["index"]]
                assert r["tokens"] == crafted.message_tokens(replaced) and r["digest"] == digest(replaced)
    assert data["tools"]["sent"] == [t["function"]["name"] for t in sent["tools"]]
    assert data["tools"]["sent_tokens"] == crafted.tool_tokens(sent["tools"])


def test_inspector_shows_what_was_sent_upstream(upstream, tmp_path):
    with ProxyServer(settings(upstream, tmp_path)) as p:  # `ctxproxy stats --url` reads it over a socket
        key, session = f"sk-{uuid.uuid4().hex[:8]}", f"insp-{uuid.uuid4().hex[:8]}"
        agent = crafted.drive_summary(p, upstream, key, session)
        client = crafted.summary_requests()
        mine = {"authorization": f"Bearer {key}"}
        # the timeline: the first turn, the summary call the second one made (the proxy's own: 2.1), the second turn
        first, own, second = (inspect(p, session, n, mine) for n in ("1", "2.1", "2"))
        by_id = inspect(p, session, second.json()["request_id"], ADMIN)
        other = [inspect(p, session, 2, {"authorization": "Bearer sk-someone-else"}),
                 p.get(f"/ctx/v1/sessions/{session}", headers={"authorization": "Bearer sk-someone-else"})]
        missing = inspect(p, session, 3, mine)
        printed = cli("--url", p.url, "--token", "s3cret", "--session", session, "--request", "2")
        printed_first = cli("--url", p.url, "--api-key", key, "--session", session, "--request", "1")
        as_json = cli("--url", p.url, "--token", "s3cret", "--session", session, "--request", "2", "--json")

    assert first.status_code == second.status_code == 200, first.text
    # the summary call request 2 made: what it sent, the proxy's own instructions in full, the client's content
    # (its history, or a transcript of it) not recorded without logging.log_content
    assert own.status_code == 200, own.text
    sent = own.json()["sent"]
    assert own.json()["request"] == "2.1" and own.json()["entry"]["kind"] == "summary"
    assert any(m["own"] and m["text"] for m in sent) and all(m["text"] is None for m in sent if not m["own"])
    assert sum(m["tokens"] for m in sent) > 0
    assert by_id.status_code == 200 and by_id.json()["messages"] == second.json()["messages"]
    one, two = first.json(), second.json()
    check_against_upstream(one, client[0], agent[0])
    check_against_upstream(two, client[1], agent[1])

    # request 1: the offload placeholder in place of the tool result, the status bar last
    kinds = [(m["source"], m["kind"]) for m in one["messages"]]
    assert kinds == [("client", "client")] * 3 + [("proxy", "offload"), ("proxy", "status")]
    placeholder = one["messages"][3]
    assert [r["index"] for r in placeholder["replaces"]] == [3]
    assert placeholder["handle"] in placeholder["message"]["content"]
    status = one["messages"][4]["message"]["content"]
    assert status.startswith("<agent_status>") and status == agent[0]["messages"][-1]["content"]

    # request 2: one summary in place of the compacted span, the earlier status folded into it
    summary = next(m for m in two["messages"] if m["kind"] == "summary")
    assert crafted.SUMMARY in summary["message"]["content"]
    assert [r["index"] for r in summary["replaces"]] == list(range(2, 18))
    assert two["entry"]["compacted"] == "summary" and two["entry"]["saved"] == two["entry"]["client_tokens"] - \
        two["entry"]["sent_tokens"]
    assert two["tools"]["client"] == ["bash"] and two["tools"]["sent"] == ["bash", "context_read"]
    assert two["client_content"] is False

    # the CLI prints the same: the summary, the status bar and the placeholder, as sent
    assert printed.returncode == 0, printed.stderr
    for line in crafted.SUMMARY.splitlines() + agent[1]["messages"][-1]["content"].splitlines():
        assert f"      | {line}" in printed.stdout.splitlines()
    assert f"summary   user, {summary['tokens']} tokens, in place of client #2-#17 (16 messages" in printed.stdout
    assert printed_first.returncode == 0, printed_first.stderr
    for line in placeholder["message"]["content"].splitlines():
        assert f"      | {line}" in printed_first.stdout.splitlines()
    assert json.loads(as_json.stdout)["messages"] == two["messages"]

    # another tenant sees nothing; a request that does not exist is a 404 too
    assert [r.status_code for r in other] == [404, 404]
    assert other[0].json()["error"]["code"] == "session_not_found"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "request_not_found"


def test_log_content_records_the_clients_messages(upstream, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ctxproxy")
    with ProxyServer(settings(upstream, tmp_path, log_content=True)) as p:  # `ctxproxy stats --url`: a socket
        key, session = f"sk-{uuid.uuid4().hex[:8]}", f"logged-{uuid.uuid4().hex[:8]}"
        crafted.drive_summary(p, upstream, key, session)
        data = inspect(p, session, 2, {"authorization": f"Bearer {key}"}).json()  # 2.1: the summary call
        printed = cli("--url", p.url, "--api-key", key, "--session", session, "--request", "2")
    client = crafted.summary_requests()
    assert data["client_content"] is True
    for m in data["messages"]:
        for row in [m] * (m["source"] == "client") + m.get("replaces", []):
            assert row["message"] == client[1][row["index"]]
    assert "      | Find which worker failed." in printed.stdout.splitlines()
    lines = [r.fields for r in caplog.records if r.getMessage() == "request" and r.fields.get("session") == session]
    assert len(lines) == 2
    assert [x["index"] for x in lines[0]["client_messages"]] == list(range(len(client[0])))
    assert [x["index"] for x in lines[1]["client_messages"]] == list(range(len(client[0]), len(client[1])))
    assert [x["message"] for x in lines[1]["client_messages"]] == client[1][len(client[0]):]


@pytest.mark.parametrize("log_content", [False, True])
def test_no_client_content_anywhere_unless_asked(upstream, tmp_path, caplog, log_content):
    caplog.set_level(logging.INFO, logger="ctxproxy")
    marker = "SECRET-" + uuid.uuid4().hex
    with InProcessProxy(settings(upstream, tmp_path, log_content=log_content)) as p:
        key, session = f"sk-{uuid.uuid4().hex[:8]}", f"quiet-{uuid.uuid4().hex[:8]}"
        r = p.post("/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {key}",
                                                                           "x-session-id": session},
                       json={"model": "gpt-4o", "messages": [{"role": "user", "content": marker}]})
        assert r.status_code == 200
        body = inspect(p, session, 1, {"authorization": f"Bearer {key}"}).text
    logged = "\n".join(str(getattr(rec, "fields", "")) for rec in caplog.records)
    assert (marker in body) is log_content and (marker in logged) is log_content
