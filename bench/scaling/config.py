"""What the scaling benchmark measures: the model, the window, the history sizes and the proxy configs."""

from __future__ import annotations

from typing import Any

MODEL = "gpt-4o"
WINDOW = 1_000_000  # the mock's window for gpt-4o (bench.overhead's MOCK_WINDOW) and the proxy's
SIZES = [10, 50, 100, 200, 500, 1000]
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "no-status-bar": {"defaults": {"status_bar": {"enabled": False}}},
}
# Not a proxy config: the reference floor, see passthrough_app.
PASSTHROUGH = "passthrough"
