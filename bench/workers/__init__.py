"""Benchmark: requests per second and CPU per request of `ctxproxy serve` with 1 and with 2 workers on Redis.

Question: what does a second worker process buy? One ctxproxy process runs
one event loop, so it uses at most one core; `serve --workers 2` runs two
behind the same port, sharing the store (proxy/cli/workers.py).

Set-up, in one run: a mock provider that costs next to nothing
(bench/workers/mock.py: the same answer to every request; ``tests/mock_upstream.py``
counts each prompt's tokens, about the proxy's own CPU per request, and would be
the bottleneck), in its own process, and two proxies as users start them,
``python -m proxy.cli serve --workers 1`` and ``--workers 2``, each on Redis
(``--store``, default ``redis://127.0.0.1:6379/12``; each proxy sends its own
API key, so each has its own tenant there) with the status bar off and a
1M-token window (nothing compacts: compaction is an occasional cost, not a
per-request one). Traffic: ``--concurrency`` (16) agents, each its own
session, each request the same ``--messages`` (100) real agent messages
(bench/scaling/history.py: the mini-swe-agent trajectories of the corpus,
``$CTXPROXY_TRACES_DIR``) plus a new last message, non-streaming, over
keep-alive connections (aiohttp, one connection per agent).

Interleaved: ``--rounds`` (5) rounds, each sending ``--requests`` (400) to one
proxy and then to the other (the order alternating per round), after
``--warm`` (1) unmeasured round. Per round and proxy: requests per second
(wall time of the batch) and CPU per request: the schedstat CPU time of the
proxy's parent process, its other children and every worker
(``/proc/<pid>/task/*/schedstat``, all threads) over the batch, divided by the
requests. Also how the workers shared the work (the CPU share of the parent
and of each worker; with keep-alive connections a worker serves the
connections it accepted). The figures are medians over the rounds, side
by side, and their ratio (2 workers / 1 worker). The load generator and the
mock run on the same machine and take CPU too (their CPU per request is
printed): on a 2-core machine two workers compete with them.

Usage: ``python -m bench.workers [--rounds 5] [--requests 400] [--concurrency
16] [--messages 100] [--store URL] [--json PATH]``. Timings are printed, never
asserted.

Modules: ``proxies`` (starting the proxies and the mock, the CPU of a proxy's
processes), ``mock``, ``traffic`` (the agents' requests), ``report`` and ``cli``.
"""
