"""A real LiteLLM proxy, run offline as a subprocess, for gateway tests.

LiteLLM (pinned in tests/gateways/requirements.txt) lives in its own virtualenv,
tests/gateways/.venv, so its dependencies never touch the product's environment:

    python -m venv tests/gateways/.venv && tests/gateways/.venv/bin/pip install -r tests/gateways/requirements.txt

`LiteLLMGateway` writes a proxy config into a temporary directory, starts
`python -m litellm.proxy.proxy_cli --config ... --host 127.0.0.1 --port N` from
that virtualenv in a process group of its own, waits until the proxy lists the
configured models on `/v1/models`, and on exit kills the whole group.

The config routes each name in `models` to `openai/<name>` and each name in
`anthropic_models` to `anthropic/<name>`, all at the given upstream (an
OpenAI- and Anthropic-compatible mock such as tests/mock_upstream.py); with a
`guardrail_base_url` it adds LiteLLM's `headroom` guardrail in `pre_call` mode
pointed at it (the contract is in tests/gateways/HEADROOM_CONTRACT.md).

Offline: the environment is built from scratch (PATH, a private HOME, nothing of
this machine's keys or proxies) with `LITELLM_LOCAL_MODEL_COST_MAP=True`, so the
proxy reads its bundled model-cost map instead of fetching it; no DATABASE_URL,
so no Prisma and no database; the admin UI is served from the files in the
package, nothing is downloaded. A start takes about 10 s (importing
litellm.proxy.proxy_server is most of it): use one gateway per test module.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

GATEWAYS = Path(__file__).parent / "gateways"
VENV = GATEWAYS / ".venv"
PYTHON = VENV / "bin" / "python"
REQUIREMENTS = GATEWAYS / "requirements.txt"
INSTALL = ("python -m venv tests/gateways/.venv && "
           "tests/gateways/.venv/bin/pip install -r tests/gateways/requirements.txt")
GUARDRAIL_NAME = "headroom"
DEFAULT_MASTER_KEY = "sk-litellm-gateway-test"
DEFAULT_GUARDRAIL_KEY = "sk-headroom-test"
UPSTREAM_KEY = "sk-mock-upstream"


class GatewayNotInstalled(RuntimeError):
    """The separate LiteLLM virtualenv is missing; the message names the install command."""


def venv_python() -> Path:
    """The LiteLLM virtualenv's interpreter, or GatewayNotInstalled naming the install command."""
    if not os.access(PYTHON, os.X_OK):
        raise GatewayNotInstalled(f"LiteLLM is not installed at {VENV}; to run the gateway tests: {INSTALL}")
    return PYTHON


def installed() -> bool:
    try:
        venv_python()
    except GatewayNotInstalled:
        return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _origin(base_url: str) -> str:
    """`http://host:port/v1` -> `http://host:port` (Anthropic's client appends /v1/messages itself)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class LiteLLMGateway:
    """A LiteLLM proxy on a free 127.0.0.1 port. `with LiteLLMGateway(upstream) as gw: gw.url, gw.master_key`.

    `guardrail_params` are merged into the `headroom` guardrail's litellm_params (`unreachable_fallback`,
    `timeout`, `ccr_retrieval`, `model`, ...); `extra_guardrails` are further `guardrails:` entries as
    written in a LiteLLM config (`{"guardrail_name": ..., "litellm_params": {...}}`).

    `url` has no path (`http://127.0.0.1:P`): OpenAI clients use `url + "/v1"`, Anthropic clients `url`.
    `start()` is `launch()` then `wait_ready()`; several gateways can be launched first and then waited
    for, so their ~10 s start-ups overlap.
    """

    def __init__(
        self,
        upstream_base_url: str,
        guardrail_base_url: str | None = None,
        guardrail_key: str = DEFAULT_GUARDRAIL_KEY,
        models: Sequence[str] = ("gpt-4o-mini", "agent-model"),
        anthropic_models: Sequence[str] = ("claude-opus-5-5",),
        *,
        master_key: str = DEFAULT_MASTER_KEY,
        default_on: bool = True,
        guardrail_params: Mapping[str, Any] | None = None,
        extra_guardrails: Sequence[Mapping[str, Any]] = (),
        litellm_settings: Mapping[str, Any] | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.upstream_base_url = upstream_base_url.rstrip("/")
        self.guardrail_base_url = guardrail_base_url.rstrip("/") if guardrail_base_url else None
        self.guardrail_key = guardrail_key
        self.models = tuple(models)
        self.anthropic_models = tuple(anthropic_models)
        self.master_key = master_key
        self.default_on = default_on
        self.guardrail_params = dict(guardrail_params or {})
        self.extra_guardrails = [dict(g) for g in extra_guardrails]
        self.litellm_settings = dict(litellm_settings or {})
        self.startup_timeout = startup_timeout
        self.port = 0
        self.url = ""
        self.startup_seconds: float | None = None  # launch to ready, once ready
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._launched_at = 0.0

    # ---- config

    def config(self) -> dict[str, Any]:
        """The proxy config this gateway runs (also written to `config_path`)."""
        model_list: list[dict[str, Any]] = [
            {"model_name": name,
             "litellm_params": {"model": f"openai/{name}", "api_base": self.upstream_base_url,
                                "api_key": UPSTREAM_KEY}}
            for name in self.models
        ]
        model_list += [
            {"model_name": name,
             "litellm_params": {"model": f"anthropic/{name}", "api_base": _origin(self.upstream_base_url),
                                "api_key": UPSTREAM_KEY}}
            for name in self.anthropic_models
        ]
        config: dict[str, Any] = {
            "model_list": model_list,
            "general_settings": {"master_key": self.master_key},
            "litellm_settings": {"num_retries": 0, "request_timeout": 60, **self.litellm_settings},
        }
        if self.guardrail_base_url is not None:
            config["guardrails"] = [{
                "guardrail_name": GUARDRAIL_NAME,
                "litellm_params": {
                    "guardrail": "headroom",
                    "mode": "pre_call",
                    "api_base": self.guardrail_base_url,
                    "api_key": self.guardrail_key,
                    "default_on": self.default_on,
                    **self.guardrail_params,
                },
            }]
        if self.extra_guardrails:
            config["guardrails"] = config.get("guardrails", []) + self.extra_guardrails
        return config

    @property
    def config_path(self) -> Path | None:
        return self._dir / "config.yaml" if self._dir else None

    @property
    def log_path(self) -> Path | None:
        return self._dir / "litellm.log" if self._dir else None

    def log_tail(self, chars: int = 4000) -> str:
        """The end of what the proxy printed (stdout and stderr together)."""
        path = self.log_path
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")[-chars:]

    # ---- lifecycle

    def _env(self) -> dict[str, str]:
        assert self._dir is not None
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self._dir),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the bundled cost map, not a fetch from GitHub
            "NO_COLOR": "1",
        }

    def launch(self) -> LiteLLMGateway:
        """Write the config and start the proxy process; returns at once (see `wait_ready`)."""
        if self._proc is not None:
            return self
        python = venv_python()
        self._dir = Path(tempfile.mkdtemp(prefix="litellm-gateway-"))
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))  # type: ignore[union-attr]
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(self.log_path, "wb")  # type: ignore[arg-type]  # noqa: SIM115
        self._launched_at = time.monotonic()
        self._proc = subprocess.Popen(
            [str(python), "-m", "litellm.proxy.proxy_cli", "--config", str(self.config_path),
             "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self._dir, env=self._env(), stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self) -> LiteLLMGateway:
        """Block until `/v1/models` lists every configured model; RuntimeError with the log otherwise."""
        if self._proc is None:
            self.launch()
        assert self._proc is not None
        if self.startup_seconds is not None:
            return self
        wanted = set(self.models) | set(self.anthropic_models)
        deadline = self._launched_at + self.startup_timeout
        headers = {"Authorization": f"Bearer {self.master_key}"}
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                if (code := self._proc.poll()) is not None:
                    tail = self.log_tail()
                    self.stop()
                    raise RuntimeError(f"LiteLLM proxy exited with {code} before it was ready; "
                                       f"its output:\n{tail}")
                try:
                    r = client.get(f"{self.url}/v1/models", headers=headers)
                    if r.status_code == 200 and wanted <= {m.get("id") for m in r.json().get("data", [])}:
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    tail = self.log_tail()
                    self.stop()
                    raise RuntimeError(f"LiteLLM proxy not ready after {self.startup_timeout:.0f} s; "
                                       f"its output:\n{tail}")
                time.sleep(0.1)
        self.startup_seconds = time.monotonic() - self._launched_at
        return self

    def start(self) -> LiteLLMGateway:
        return self.launch().wait_ready()

    def stop(self) -> None:
        """SIGTERM the proxy's process group, SIGKILL it after 10 s; remove the temporary directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)  # the group start_new_session made: this proxy and its children
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None and os.environ.get("LITELLM_GATEWAY_KEEP") != "1":
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> LiteLLMGateway:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
