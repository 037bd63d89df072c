"""The mock provider in its own process (``python -m bench.load --serve-mock``), driven over stdin.

It answers like ``tests/mock_upstream.py`` with the load benchmark's answers:
a 17-word reply (20 stream chunks) to requests without tools, tool calls to the
agents' requests, and the hostile neighbour's replies (bench/hostile.py).
"""

from __future__ import annotations

import gc
import json
import sys
import threading
from typing import Any

from bench import hostile
from bench.load.config import ANSWER
from bench.load.traffic import TOOL_NAMES


def serve_mock() -> int:
    """`--serve-mock`: a MockUpstream with the load answers, driven by JSON lines on stdin.

    Commands (one JSON object per line, answered by one line on stdout):
    ``{"cmd": "set", "delay": s, "chunk_delay": s}`` and ``{"cmd": "reset"}`` (drop
    recorded requests, the prompt cache and the token memo, keep the delays);
    EOF stops the server.
    """
    import orjson

    from tests import _mock_prompt as mp
    from tests import _mock_stream as ms
    from tests.mock_upstream import MockUpstream

    class LoadMock(MockUpstream):
        def _next_reply(self, body: dict[str, Any], call_prefix: str = "call_load") -> ms.Reply:
            neighbour = hostile.mock_reply(body.get("messages") or [])
            if neighbour is not None:
                return neighbour
            if not body.get("tools"):
                return ms.Reply(ANSWER)
            n = len(body.get("messages") or ())
            if n % 7 == 6:  # now and then the agent says something instead of calling a tool
                return ms.Reply("I looked at those files. Next I will check the tests and then make the change.")
            with self._lock:
                self._call_seq += 1
                seq = self._call_seq
            name = TOOL_NAMES[n % len(TOOL_NAMES)]
            args = {"bash": {"command": f"pytest -x tests/test_mod_{n}.py -q"},
                    "read_file": {"path": f"src/pkg/mod_{n}.py"},
                    "write_file": {"path": f"src/pkg/mod_{n}.py", "content": f"VALUE = {n}\n"},
                    "search": {"pattern": f"def handler_{n}", "glob": "*.py"},
                    "list_dir": {"path": f"src/pkg/sub_{n}"}}[name]
            return ms.Reply(None, [ms.ToolCall(f"{call_prefix}_{seq}", name, orjson.dumps(args).decode())])

    mock = LoadMock()
    settings = {"delay": 0.0, "chunk_delay": 0.0}

    def apply() -> None:
        with mock._lock:
            mock.delay = settings["delay"]
            mock.chunk_delay = settings["chunk_delay"]

    url = mock.start()
    gc.collect()
    gc.freeze()
    print(url, flush=True)

    stop = threading.Event()

    def trim() -> None:  # the recorded requests (raw bodies) would otherwise grow without bound
        while not stop.wait(2.0):
            with mock._lock:
                mock.requests.clear()
                mock.errors.clear()

    threading.Thread(target=trim, daemon=True).start()
    try:
        for line in sys.stdin:
            try:
                cmd = json.loads(line)
            except ValueError:
                print("error: not JSON", flush=True)
                continue
            if cmd.get("cmd") == "set":
                settings.update({k: float(cmd[k]) for k in ("delay", "chunk_delay") if k in cmd})
                apply()
            elif cmd.get("cmd") == "reset":
                mock.reset()
                mp.forget_tokens()
                apply()
                gc.collect()
            print("ok", flush=True)
    except KeyboardInterrupt:
        pass
    stop.set()
    mock.stop()
    return 0
