"""Load benchmark: throughput, concurrent streams and memory of one ctxproxy process.

Three processes on 127.0.0.1, as in ``bench.overhead`` (whose process helpers
this reuses): the mock provider (``tests/mock_upstream.py``) in its own
subprocess (``python -m bench.load --serve-mock``, driven over a stdin line protocol), the
proxy exactly as users run it (``ctxproxy serve``, default config, SQLite store
in a temporary directory, one uvloop/httptools worker), and this process, the
client (aiohttp on uvloop, one session per phase, its connection pool sized for
the concurrency). The mock answers at a realistic pace: ``--delay`` (50 ms)
before the answer or the first stream chunk, ``--chunk-delay`` (20 ms) between
stream chunks.

Phases:

1. small non-streaming chat requests, closed loop, at each of ``--concurrency``
   (16, 64, 128) for ``--duration`` seconds (15; quick 5) after a 1 s warm-up,
   straight to the mock ("direct") and through the proxy, in adjacent runs of the
   same length (the order alternates between levels). Requests/s held (overall and
   the slowest whole second), latency p50/p99/max, latency the proxy adds (per
   percentile), errors (any non-200, malformed body or transport error), and the
   CPU each process used (% of one core; the machine's cores are shared by all
   three and by anything else running: the rest of the machine's busy time is
   "other", and the proxy's run-queue wait from schedstat is "wait"), and the
   proxy's RSS after each run. Then, unrecorded, ``py-spy record`` on the proxy
   for ``--profile-seconds`` under the same load at the highest concurrency, if
   py-spy is installed.
2. ``--streams`` (200) concurrent streaming requests at once, each ~20 chunks
   (a 17-word answer: role chunk, 17 content chunks, finish chunk, usage chunk,
   then ``[DONE]``: 20 data chunks): direct and proxied batches alternating,
   ``--stream-rounds`` each. Every stream must complete with every chunk and
   ``[DONE]``. Time to the first ``data:`` chunk p50/p99, per-stream completion
   p50/p99, batch completion.
3. ``--long-duration`` seconds (60; quick 15) of agent-like traffic through a
   fresh proxy process (its own new store, so that what phases 1-2 allocated
   neither hides nor adds growth) after a warm-up: ``--agents`` (48) simulated
   agents, each running sessions of 8-40 turns (system prompt, tools array, a
   task, then the assistant's tool calls and tool results of 0.1-8 KB, rarely
   100 KB, so the history grows), 30% of the requests streamed. The proxy's RSS
   (``/proc/<pid>/status`` VmRSS) is sampled every second: peak (also VmHWM),
   mean of the first and last thirds, and the least-squares slope in MB/min.

``--hostile`` runs, instead of the three phases, the hostile-neighbour comparison of
``bench/hostile.py`` (small requests with and without a client that sends 10 MB
single-letter tool results and pathological read-back patterns; about a minute).

Load targets, checked and printed, never asserted: >= 500 requests/s of small
non-streaming requests with zero errors, all 200 concurrent streams complete, RSS
under 300 MB, memory flat over the long run (last third's mean within 5 MB of the
first third's).

Every phase is bounded by a duration and a request count, every request by a
timeout, the whole run by ``--max-seconds``; the benchmark stops by itself.

Usage: ``python -m bench.load [--quick | --hostile] [--json PATH] [--md PATH]`` from the repo root.

Modules: ``config`` (what is sent, the targets, phase lengths), ``traffic``
(the agents' prompt, tools and tool output), ``mock`` (the mock process),
``processes``, ``measure`` (CPU, RSS), ``client`` (closed loops, stream
batches), ``agents`` (phase 3), ``pyspy`` (profiling), ``phases`` (the run),
``report`` and ``cli``.
"""
