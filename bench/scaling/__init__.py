"""Benchmark: the proxy's CPU time per request as the conversation grows (steady state).

Question: once the earlier messages of a conversation have been through the
proxy, does the next request cost more CPU when the history is longer? It
should stay nearly flat: everything the proxy keeps per message is cached by
digest, so a request with n messages of which n-1 were seen before should cost
about the same at 10 or at 1,000 messages, apart from parsing and re-sending
the bytes.

History: real agent messages, unmodified. The system message and ``tools`` of
the first mini-swe-agent trajectory of the corpus (``$CTXPROXY_TRACES_DIR``),
then the non-system messages of the mini-swe-agent
trajectories one after the other, in file order (tool-call ids prefixed per
trajectory so they stay unique): 1,000 messages are about 228k tokens
(o200k_base). For each size n in ``--sizes`` (10, 50, 100, 200, 500, 1000)
and each proxy config:

* a fresh API key (so a fresh tenant and session) sends the first n-1
  messages once, unmeasured: the proxy has now seen them;
* ``--warm`` (3) unmeasured, then ``--runs`` (20) measured requests of n
  messages: the same n-1 plus a new last message each time (message n of the
  history with `` [variant k]`` appended to its text, so tool-call pairing stays
  valid and its digest is new), non-streaming, sequential.

How it is measured: the proxy runs **in this process**, its real app
(``proxy.app.create_app``: lifespan, SQLite store in a temporary directory,
JSON request log to a file, the real upstream client) driven directly through
ASGI, with no HTTP server in front (uvicorn/httptools parse the same request
line and headers whatever the history, so they are a constant, measured by
``bench.overhead``). The upstream is the mock provider
(``tests/mock_upstream.py``) in **its own subprocess**, over loopback, so none
of its work is counted. Per request the CPU time is ``time.process_time()``
(all threads of this process: the event loop and the SQLite store's worker
thread) from before the ASGI call to after the response has been received **and
the proxy's background accounting write has finished**
(``accounting.drain()``), so the deferred work after the response is counted
too. The request bodies are encoded before the clock starts. Also reported: the
in-handler time from the proxy's own log (``overhead_ms``: parse, route,
pipeline, until the upstream request is sent) and the wall time.

Configs: ``default`` (built-in defaults: status bar on, append mode; offload,
cache hints, accounting) and ``no-status-bar`` (``status_bar.enabled: false``),
both with ``models: {gpt-4o: {context_window: 1000000}}`` so that nothing
compacts (compaction is an occasional cost, not a per-request one; the mock is
told the same window). Beside them, measured the same way in the same run, the
``passthrough`` reference (``passthrough_app``): a FastAPI route that only does
``orjson.loads`` + ``orjson.dumps`` of the body and forwards it with the
proxy's upstream client, the floor for any proxy that reads and re-sends the
body; the report prints each config's CPU minus the reference's (the proxy's
own added CPU). Then the largest size is run again under cProfile for each
proxy config and the top entries (by own time and by cumulative time) are
printed: where the time goes.

Usage: ``python -m bench.scaling [--sizes 10,50,100,200,500,1000] [--runs 20]
[--proxy-src DIR] [--json PATH] [--no-profile]``. ``--proxy-src DIR`` imports
the ``proxy`` package from DIR (e.g. a ``git archive HEAD proxy`` snapshot).
Timings are printed, never asserted.

Modules: ``config``, ``history`` (the messages and request bodies), ``asgi``
(the app driven through ASGI, the pass-through reference), ``measure``,
``report`` and ``cli``.
"""
