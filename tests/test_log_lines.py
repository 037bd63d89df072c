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
