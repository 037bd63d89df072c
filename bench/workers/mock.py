"""A provider that costs next to nothing (``python -m bench.workers.mock``), so that the proxies saturate first.

`tests/mock_upstream.py` counts every prompt's tokens and simulates the
provider's prompt cache: about as much CPU per request as the proxy itself, in
one process, which would cap both proxies at its own rate. This one reads the
body and answers the same chat completion every time (usage included, as a
provider's), over uvicorn with httptools and uvloop. It prints its base URL
once listening and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import socket
from typing import Any

import orjson

ANSWER = orjson.dumps({
    "id": "chatcmpl-bench-workers", "object": "chat.completion", "created": 0, "model": "gpt-4o",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1000, "completion_tokens": 1, "total_tokens": 1001,
              "prompt_tokens_details": {"cached_tokens": 0}}})
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> int:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="off", log_level="warning",
                            access_log=False, server_header=False, date_header=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
