"""Benchmark: what ctxproxy adds on the wire, direct-to-mock versus through the proxy, against a bare floor.

Four processes, all on 127.0.0.1:

* the mock provider (``tests/mock_upstream.py``) in its own subprocess
  (``python -m bench.overhead --serve-mock``), so it shares no GIL with anything else;
* the proxy exactly as users run it: ``ctxproxy serve --port P`` (uvloop +
  httptools, one worker), ``CTXPROXY_UPSTREAM`` pointing at the mock and its
  store in a temporary directory; its JSON request log goes to a file there;
* the floor (``bench/overhead/floor.py``): a bare FastAPI app that forwards the
  request body, as bytes, to the mock with one shared aiohttp ``ClientSession``
  and returns the answer (streamed back when the mock streams), under uvicorn
  with uvloop + httptools and one worker like the proxy: what any Python
  pass-through on the same stack costs, so ctxproxy's own share can be read off;
* this process, the client: one aiohttp ``ClientSession`` per target with
  persistent keep-alive connections (uvloop if available).

Every scenario runs direct, proxied and through the floor side by side in one
run, after a warm-up, interleaved request by request (sequential scenarios,
rotating which goes first) or in alternating batches (the concurrent one), so
machine noise hits them alike. Figures (milliseconds unless stated):

1. small      - a small non-streaming chat request (system + user message):
                latency median and p99, sequential.
1b. small_responses - the same conversation as a Responses API request
                (``instructions`` + ``input``), sequential; direct, ctxproxy
                and the floor (LiteLLM is set up as a chat pass-through only).
1c. small_messages - the same as an Anthropic Messages request (``system`` +
                ``messages``, ``max_tokens`` 256, a ``claude-*`` model, the key
                in ``x-api-key`` with ``anthropic-version``), the same targets.
                A table puts the three APIs side by side: each one's added time
                over direct, ctxproxy-added / floor-added, CPU per request.
1d. small_responses_ws - the small Responses turn through ctxproxy twice per
                round: over one kept-open WebSocket (``response.create`` to
                ``response.completed``) and over HTTP with ``stream: true`` (to
                the end of the stream); the ratio websocket / http of the medians
                (``bench/overhead/websocket.py``).
2. stream     - the same request with ``stream: true``: time to the first SSE
                ``data:`` line (TTFC) and to the end of the stream (TTLC).
3. c16        - 16 concurrent workers sending small non-streaming requests:
                requests/s and latency under that load.
4. long       - a 200-message, ~150k-token agent conversation (real traces,
                see ``bench/token_count.py``) whose last message is new on
                every request, non-streaming, sequential; then the same with
                the agent's ``tools`` array, as agents send it (the proxy then
                adds its ``context_read`` tool, so it re-serializes the body).
6. c16_long   - 16 concurrent workers sending those 150k-token bodies with
                tools (each a new last message): requests/s against the
                floor's, the real shape of agent traffic.

"added" = proxy minus direct, for the median and for the p99 separately (each
percentile of its own distribution, not of paired differences); "ratio" =
proxy / direct (for requests/s: proxy / direct throughput). p99 is nearest
rank, so with few samples it is close to the slowest one. The floor's table
gives, per scenario, the floor's and ctxproxy's added median and p90 and the
ratio ctxproxy-added / floor-added; for the small request it is also printed
as one line. After the run the proxy's own log is joined on
``x-ctxproxy-request-id`` to split the added time into in-handler time
(``overhead_ms``: parse, route, pipeline, until the upstream request is sent)
and everything else (ASGI server, upstream client, one more loopback hop), and
the CPU time each process spends per request of its own is read from /proc
(Linux) over the recorded loops.

Noise control: the client's garbage collector is off during each recorded loop
(collected between loops), and the mock freezes its start-up heap, so neither
of them pauses in the middle of a measurement; the proxy runs untouched. The
mock is told ``gpt-4o`` has a 1M-token window (its default 128k would reject
the long conversation; the proxy enforces no window of its own).

Timings are printed, never asserted. Target, for context: added median under
2 ms for a small request.

With ``--litellm`` one more target joins the same run: LiteLLM's proxy
(``litellm[proxy]``, pinned, see ``config.LITELLM_REQUIREMENT``), pip-installed by the
benchmark into its own virtualenv ``bench/.venvs/litellm`` (gitignored) the first
time and reused after, started as its users run it (``litellm --config FILE
--host --port``: uvicorn, one worker) with a config that makes it a plain
pass-through to the same mock (``model_name: "*"`` -> ``openai/*`` at the mock's
URL; no database, no callbacks, telemetry off, the cost map read from the
package, a master key equal to the benchmark's bearer token because LiteLLM
refuses to start without one). Every scenario then interleaves direct /
ctxproxy / floor / LiteLLM (rotating which goes first), and another table gives
each proxy's added latency and ratio against direct. When LiteLLM cannot be
installed or started, the exact error is printed and the run goes on without it.

Usage: ``python -m bench.overhead [--quick] [--litellm] [--json PATH]`` from the
repo root (``--proxy-cmd``, ``--keep-log``, ``--max-seconds``: see ``--help``).
The long conversation is built from the trajectory corpus in
``$CTXPROXY_TRACES_DIR``.

Modules: ``config`` (what is sent, how often), ``processes`` (starting and
stopping the mock, the proxy, the floor and LiteLLM), ``mock`` and ``floor``
(the two helper servers), ``client`` (targets, interleaving), ``cpu`` (CPU
accounting), ``scenarios`` (the scenarios), ``stats``, ``proxy_log`` (the
proxy's own timings), ``report`` and ``report_apis`` (the printed tables), ``targets``
(issue 27's floor targets from this run, met or not: the report's last table) and ``cli``.
"""
