"""The mock provider in its own process (``python -m bench.overhead --serve-mock``), so it shares no GIL."""

from __future__ import annotations

import gc
import sys
import threading

from bench.overhead.config import MOCK_WINDOW, MODEL


def serve_mock() -> int:
    """`--serve-mock`: start MockUpstream, print its URL, live until stdin closes."""
    from tests.mock_upstream import MockUpstream

    mock = MockUpstream()
    mock.windows[MODEL] = MOCK_WINDOW
    url = mock.start()
    # Startup objects (tiktoken, Starlette, uvicorn) out of the collector's way, so the
    # mock's own full collections stay short: its pauses would be noise on both paths.
    gc.collect()
    gc.freeze()
    print(url, flush=True)

    # The mock records every request (raw body included); drop them now and then so a
    # long run does not grow without bound. list.clear() is atomic under the GIL.
    stop = threading.Event()

    def trim() -> None:
        while not stop.wait(2.0):
            mock.requests.clear()
            mock.errors.clear()

    threading.Thread(target=trim, daemon=True).start()
    try:
        sys.stdin.read()  # EOF when the parent exits or closes the pipe
    except KeyboardInterrupt:
        pass
    stop.set()
    mock.stop()
    return 0
