"""The real proxy app, in process over ASGI (InProcessProxy) or under uvicorn on a loopback port (ProxyServer).

Most tests need the app, not a socket: InProcessProxy runs the app's own lifespan on an
event loop of its own (a thread, as a server's loop would be) and hands out httpx clients,
and clients of the official SDKs, whose transport is httpx.ASGITransport on that loop. No
port, no uvicorn, no HTTP parsing. Background work of the app (accounting, summaries)
goes on between a test's requests exactly as it does in a server.

ProxyServer is kept for the tests whose subject is the transport itself: uvicorn's limits
(slow bodies, header deadlines, connection caps), client disconnects, chunk timing,
`ctxproxy stats --url` in a subprocess, and the dashboard in a browser. Both classes offer
the same helpers (post, get, request, stream, openai(), anthropic(), ...), so a test
reads the same whichever one it runs against.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import uvicorn

import proxy.app
from proxy.app import create_app
from proxy.config import Settings, build_settings
from proxy.http.server import uvicorn_options
from proxy.store.guarded import LOOP_LAG_TASK

# A request that gets no answer within its client's read timeout, or this long, fails with
# httpx.ReadTimeout naming the request that hung.
BRIDGE_TIMEOUT_S = 120.0


def make_settings(upstream_url: str, store: str, env: dict[str, str] | None = None, **raw: Any) -> Settings:
    """Settings from a config mapping and only the environment given (none of the process's)."""
    cfg: dict[str, Any] = {"upstream": {"base_url": upstream_url}, "store": store}
    for k, v in raw.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return build_settings(cfg, env=env or {})


class _Clients:
    """httpx and SDK clients bound to a proxy; every client made here is closed with the proxy."""

    url: str

    def __init__(self) -> None:
        self._closers: list[Any] = []
        self._client: httpx.Client | None = None

    # -- transports (None: a real socket to self.url) ------------------------------------------------------
    def sync_transport(self, lib: Any = httpx) -> Any:
        return None

    def async_transport(self, lib: Any = httpx) -> Any:
        return None

    # -- httpx ---------------------------------------------------------------------------------------------
    def http_client(self, lib: Any = httpx, **kw: Any) -> Any:
        """A sync client of `lib` (httpx; httpx2 for the anthropic SDK) whose base_url is the proxy."""
        kw.setdefault("base_url", self.url)
        kw.setdefault("timeout", 30)
        c = lib.Client(transport=self.sync_transport(lib), **kw)
        self._closers.append(c.close)
        return c

    def async_http_client(self, lib: Any = httpx, **kw: Any) -> Any:
        """An async client of `lib` whose base_url is the proxy; close it in the test (`async with`)."""
        kw.setdefault("base_url", self.url)
        kw.setdefault("timeout", 30)
        return lib.AsyncClient(transport=self.async_transport(lib), **kw)

    @property
    def client(self) -> httpx.Client:
        """The client behind post/get/request/stream: like httpx.post, it keeps no cookies between requests."""
        if self._client is None:
            self._client = self.http_client(cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])))
        return self._client

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.client.request(method, path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.post(path, **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.get(path, **kw)

    def stream(self, method: str, path: str, **kw: Any) -> Any:
        return self.client.stream(method, path, **kw)

    # -- SDKs ----------------------------------------------------------------------------------------------
    def openai(self, path: str = "/v1", *, http_client: httpx.Client | None = None, **kw: Any) -> openai.OpenAI:
        kw.setdefault("max_retries", 0)
        kw.setdefault("api_key", "sk-test")
        return openai.OpenAI(base_url=self.url + path, http_client=http_client or self.http_client(), **kw)

    def async_openai(self, path: str = "/v1", **kw: Any) -> openai.AsyncOpenAI:
        kw.setdefault("max_retries", 0)
        kw.setdefault("api_key", "sk-test")
        hc = kw.pop("http_client", None) or self.async_http_client()
        return openai.AsyncOpenAI(base_url=self.url + path, http_client=hc, **kw)

    def anthropic(self, path: str = "", **kw: Any) -> anthropic.Anthropic:
        kw.setdefault("max_retries", 0)
        hc = kw.pop("http_client", None) or self.http_client(httpx2)
        return anthropic.Anthropic(base_url=self.url + path, http_client=hc, **kw)

    def async_anthropic(self, path: str = "", **kw: Any) -> anthropic.AsyncAnthropic:
        kw.setdefault("max_retries", 0)
        hc = kw.pop("http_client", None) or self.async_http_client(httpx2)
        return anthropic.AsyncAnthropic(base_url=self.url + path, http_client=hc, **kw)

    def _close_clients(self) -> None:
        while self._closers:
            self._closers.pop()()
        self._client = None


class _Chunks(httpx.AsyncByteStream):
    """A request body replayed chunk by chunk, as the client sent it (declared or chunked)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self._chunks:
            yield c


def _deadline(request: Any) -> float:
    """The client's read timeout, as a bound on the whole answer (httpx's own bounds each read)."""
    read = (request.extensions.get("timeout") or {}).get("read")
    return min(read, BRIDGE_TIMEOUT_S) if read else BRIDGE_TIMEOUT_S


def _timed_out(lib: Any, request: Any) -> Exception:
    return lib.ReadTimeout(f"the in-process proxy did not answer {request.method} {request.url.path} "
                           f"within {_deadline(request):g} s", request=request)


class _SyncBridge(httpx.BaseTransport):
    """A sync transport (of httpx, or of httpx2 for the anthropic SDK) into the app's loop."""

    def __init__(self, proxy: InProcessProxy, lib: Any = httpx) -> None:
        self._proxy, self._lib = proxy, lib

    def handle_request(self, request: Any) -> Any:
        chunks = [bytes(c) for c in request.stream]
        fut = self._proxy.submit(self._proxy.forward(request.method, str(request.url), request.headers.raw, chunks))
        try:
            status, headers, body = fut.result(timeout=_deadline(request))
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise _timed_out(self._lib, request) from None
        return self._lib.Response(status, headers=headers, stream=self._lib.ByteStream(body), request=request)


class _AsyncBridge(httpx.AsyncBaseTransport):
    """An async transport, usable from any event loop, into the app's loop."""

    def __init__(self, proxy: InProcessProxy, lib: Any = httpx) -> None:
        self._proxy, self._lib = proxy, lib

    async def handle_async_request(self, request: Any) -> Any:
        chunks = [bytes(c) async for c in request.stream]
        fut = self._proxy.submit(self._proxy.forward(request.method, str(request.url), request.headers.raw, chunks))
        try:
            status, headers, body = await asyncio.wait_for(asyncio.wrap_future(fut), _deadline(request))
        except TimeoutError:
            raise _timed_out(self._lib, request) from None
        return self._lib.Response(status, headers=headers, stream=self._lib.ByteStream(body), request=request)


_GC_LOCK = threading.Lock()
# A ProxyServer's app starts as a server does (gc.collect(), gc.freeze(): what the in-process benchmarks want),
# and what it froze is unfrozen when it stops. The test suite sets this False (conftest.py): there no app
# collects or freezes (proxy.app's gc is a NoFullCollection for the whole run), and the freeze of the suite's
# own start-up heap must outlast every server.
SERVER_FREEZES = True


class NoFullCollection:
    """proxy.app's `gc` while an in-process app starts: no gc.collect() + gc.freeze(), no new thresholds.

    In a server they run once per process. In the suite they would run for every test's proxy: a full
    collection of the whole test process each time (0.3-0.7 s), and a freeze that keeps every object then
    alive, the test's own, out of the collector for good (the suite's memory grew to 2 GB). `ctxproxy serve`
    in a subprocess still runs them.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)

    @staticmethod
    def collect(*_: Any) -> int:
        return 0

    @staticmethod
    def freeze() -> None:
        return None

    @staticmethod
    def set_threshold(*_: int) -> None:  # the suite's collector keeps its own thresholds too
        return None


@contextlib.asynccontextmanager
async def _lifespan_without_gc_freeze(app: Any) -> AsyncIterator[None]:
    ctx = app.router.lifespan_context(app)
    with _GC_LOCK:  # start-up runs to its first await without yielding: the swap is seen by this app only
        previous, proxy.app.gc = proxy.app.gc, NoFullCollection()  # type: ignore[attr-defined]
        try:
            await ctx.__aenter__()
        finally:
            proxy.app.gc = previous  # type: ignore[attr-defined]
    try:
        yield
    except BaseException as e:
        if not await ctx.__aexit__(type(e), e, e.__traceback__):
            raise
    else:
        await ctx.__aexit__(None, None, None)


class InProcessProxy(_Clients):
    """`with InProcessProxy(settings) as p:` → the app started (its lifespan run), served over ASGI.

    p.url is a name, not a socket: reach the app through p.post/get/stream/client/openai()/anthropic().
    Responses arrive whole (ASGITransport buffers a stream): a test of chunk timing or of a client
    going away uses ProxyServer.
    """

    url = "http://ctxproxy.localhost"  # a loopback name (RFC 6761), as the Host of a key-injecting route must be

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.app = create_app(settings)
        self._asgi = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)  # a 500, as a server sends
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._main: asyncio.Task[Any] | None = None

    @property
    def state(self) -> Any:
        return self.app.state.proxy

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "proxy not started"
        return self._loop

    def sync_transport(self, lib: Any = httpx) -> Any:
        return _SyncBridge(self, lib)

    def async_transport(self, lib: Any = httpx) -> Any:
        return _AsyncBridge(self, lib)

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        """Run a coroutine on the app's loop (where its store, locks and upstream client live)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def settle(self, timeout: float = 30) -> None:
        """Wait until the app has no work left on its loop (background summaries, accounting writes).

        The guarded store's loop-lag monitor (its task named LOOP_LAG_TASK) beats for the app's whole
        life: it is not work, and waiting for it to end would always run into the deadline.
        """
        deadline = time.monotonic() + timeout
        while True:
            busy = [t for t in asyncio.all_tasks(self.loop)
                    if t is not self._main and not t.done() and t.get_name() != LOOP_LAG_TASK]
            if not busy:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the proxy still had {len(busy)} task(s) running after {timeout:g} s: {busy}")
            time.sleep(0.01)

    def call(self, coro: Any, timeout: float = 60) -> Any:
        """Run a coroutine on the app's loop and wait for its result."""
        return self.submit(coro).result(timeout=timeout)

    async def forward(self, method: str, url: str, headers: Any, chunks: list[bytes]) -> tuple[int, Any, bytes]:
        inner = httpx.Request(method, url, headers=headers, stream=_Chunks(chunks))
        resp = await self._asgi.handle_async_request(inner)
        body = b"".join([c async for c in resp.stream])  # type: ignore[union-attr]
        return resp.status_code, resp.headers.raw, body

    def start(self) -> str:
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(started,), name="ctxproxy-app", daemon=True)
        self._thread.start()
        started.result(timeout=60)
        return self.url

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve(started))
            # What the app left running (a request of a test that gave up on it) ends with the loop.
            rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in rest:
                t.cancel()
            if rest:
                loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    async def _serve(self, started: concurrent.futures.Future[None]) -> None:
        self._stopping = asyncio.Event()
        self._main = asyncio.current_task()
        try:
            async with _lifespan_without_gc_freeze(self.app):
                started.set_result(None)
                await self._stopping.wait()
        except BaseException as e:  # noqa: BLE001 - start-up or shutdown failure, re-raised in the test
            if not started.done():
                started.set_exception(e)
            else:
                self._failure = e

    def stop(self) -> None:
        self._close_clients()
        if self._thread is None or self._loop is None:
            return
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=30)
        alive = self._thread.is_alive()
        self._thread = None
        if alive:
            raise RuntimeError("the in-process proxy did not shut down within 30 s")
        if self._failure is not None:
            raise self._failure

    def __enter__(self) -> InProcessProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(uvicorn.Server):
    """uvicorn's Server, woken by stop() rather than finding should_exit at its next 0.1 s tick.

    Only the wait between ticks differs (uvicorn's on_tick still decides, every tick, whether to exit):
    start-up, serving and the graceful shutdown are uvicorn's own.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)

    def exit_soon(self) -> None:
        self.should_exit = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed: the server has gone
                loop.call_soon_threadsafe(self._wake.set)


class ProxyServer(_Clients):
    """`with ProxyServer(settings) as p:` → p.url is `http://127.0.0.1:PORT`, served by uvicorn as users run it."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.app = create_app(settings)
        self._unfreeze = SERVER_FREEZES
        self.url = ""
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> Any:
        return self.app.state.proxy

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, loop="asyncio", log_config=None, access_log=False,
                                timeout_graceful_shutdown=2, server_header=False, date_header=False,
                                **uvicorn_options(self.settings.server))  # served as `ctxproxy serve` serves
        self._server = _Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("proxy failed to start")
            time.sleep(0.005)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        self._close_clients()
        if self._server and self._thread:
            self._server.exit_soon()
            self._thread.join(timeout=10)
            if self._unfreeze:
                gc.unfreeze()  # what the app's start-up froze (SERVER_FREEZES)

    def __enter__(self) -> ProxyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(settings: Settings, real: bool = False) -> Iterator[InProcessProxy | ProxyServer]:
    """A started proxy for a `with`-less fixture: in process unless `real`."""
    p: InProcessProxy | ProxyServer = ProxyServer(settings) if real else InProcessProxy(settings)
    with p:
        yield p
