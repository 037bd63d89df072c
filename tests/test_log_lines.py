"""A log line's timestamp: UTC to the millisecond, right across second boundaries (its seconds are remembered)."""

from __future__ import annotations

import json
import logging
import time

from proxy.logs import JsonFormatter


def _line(fmt: JsonFormatter, created: float) -> dict[str, object]:
    record = logging.LogRecord("ctxproxy", logging.INFO, __file__, 1, "request", None, None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    return json.loads(fmt.format(record))


def test_each_line_is_stamped_with_its_own_second_and_millisecond():
    fmt = JsonFormatter()
    for created in (1_767_225_599.999, 1_767_225_600.0, 1_767_225_600.5, 1_767_225_599.25, 1_800_000_000.042):
        want = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int((created % 1) * 1000):03d}Z"
        assert _line(fmt, created)["ts"] == want
    assert _line(fmt, 1_767_225_600.0)["ts"] == "2026-01-01T00:00:00.000Z"
    assert _line(fmt, 1_767_225_599.999)["ts"] == "2025-12-31T23:59:59.999Z"


# --------------------------------------------------------------------------- the handler: direct and deferred lines

import asyncio  # noqa: E402

from proxy import logs  # noqa: E402


def ours() -> None:
    """Only setup_logging's handler on the logger (pytest adds its capture handlers while a test runs)."""
    assert logs._direct is not None
    logs.log.handlers[:] = [logs._direct]


def test_a_direct_line_is_the_line_logging_writes(log_stream, monkeypatch):
    ours()
    monkeypatch.setattr(logs.time, "time", lambda: 1_767_225_600.25)
    logs.event("store unavailable", logging.WARNING, store="sqlite:///x", n=3)  # direct
    record = logging.LogRecord("ctxproxy", logging.WARNING, __file__, 1, "store unavailable", None, None)
    record.created, record.msecs = 1_767_225_600.25, 250.0
    record.fields = {"store": "sqlite:///x", "n": 3}
    assert log_stream.getvalue() == logs.log.handlers[0].format(record) + "\n"
    assert json.loads(log_stream.getvalue()) == {"ts": "2026-01-01T00:00:00.250Z", "level": "warning",
                                             "msg": "store unavailable", "store": "sqlite:///x", "n": 3}


async def test_request_lines_wait_for_the_next_line_or_the_delay(log_stream, monkeypatch):
    ours()
    monkeypatch.setattr(logs, "FLUSH_DELAY", 0.05)
    logs.request_event({"request_id": "req_1"})
    logs.request_event({"request_id": "req_2"})
    assert log_stream.getvalue() == ""  # held
    await asyncio.sleep(0.2)
    assert [json.loads(x)["request_id"] for x in log_stream.getvalue().splitlines()] == ["req_1", "req_2"]
    assert len(log_stream.calls) == 1  # both in one write
    logs.request_event({"request_id": "req_3"})
    logs.event("Shutting down")  # any other line is written at once, after the requests before it
    lines = [json.loads(x) for x in log_stream.getvalue().splitlines()]
    assert [x.get("request_id") or x["msg"] for x in lines] == ["req_1", "req_2", "req_3", "Shutting down"]
    logs.request_event({"request_id": "req_4"})
    logs.flush_logs()  # the lifespan's end
    assert json.loads(log_stream.getvalue().splitlines()[-1])["request_id"] == "req_4"


async def test_no_write_is_longer_than_an_atomic_pipe_write(log_stream):
    ours()
    for i in range(100):
        logs.request_event({"request_id": f"req_{i}", "pad": "x" * 300})
    logs.flush_logs()
    assert all(len(c) <= logs._ATOMIC for c in log_stream.calls) and len(log_stream.calls) > 1
    assert [json.loads(x)["request_id"] for x in log_stream.getvalue().splitlines()] == [f"req_{i}" for i in range(100)]


def test_off_the_event_loop_a_request_line_is_written_at_once(log_stream):
    ours()
    logs.request_event({"request_id": "req_sync"})  # no running loop: nothing would come back for it
    assert json.loads(log_stream.getvalue())["request_id"] == "req_sync"


def test_a_handler_of_someone_else_gets_every_line_through_logging(log_stream):
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    ours()
    keep = Keep()
    logs.log.addHandler(keep)
    try:
        logs.event("hello", n=1)
        logs.request_event({"request_id": "req_x"})
    finally:
        logs.log.removeHandler(keep)
    assert [(r.getMessage(), r.fields) for r in seen] == [("hello", {"n": 1}), ("request", {"request_id": "req_x"})]
    assert [json.loads(x)["msg"] for x in log_stream.getvalue().splitlines()] == ["hello", "request"]
