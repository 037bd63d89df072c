"""The Dockerfile, built and run as the image would be, with no Docker daemon.

There is no daemon or registry on these machines, so this performs the build by
hand from the Dockerfile's own text: its `COPY` set taken from the build context
as `.dockerignore` filters it, into a scratch directory standing for the image's
root; its `RUN` lines verbatim in a fresh virtualenv standing for the base
image's Python; its `ENV` with image paths remapped into the scratch root; then
its `CMD` started as its `USER`, its `HEALTHCHECK` command run against it, and a
SIGTERM that must drain. A step that would break `docker build` fails here.

What is emulated, and why:
- The base image's Python is a virtualenv made with ``--system-site-packages``
  and no pip of its own (its ``pip`` runs the host's pip inside it): the
  dependencies already installed here are reused, so ``pip install .`` runs as
  written (build isolation included) in seconds instead of reinstalling the
  whole dependency tree from the index.
- ``useradd``/``groupadd``/``chown`` need root in the image's own ``/etc``: they
  are recorded and applied to the scratch tree (``chown`` for real when this
  runs as root).
- The ``USER`` is a throwaway uid (``setpriv``), given only the capability to
  read and traverse directories, because the host's interpreter lives under a
  private ``/root`` where the image's lives in a world-readable ``/usr/local``.
  It can write nothing but what it owns: the ``/data`` volume. Run as non-root,
  the tree is made read-only with chmod instead.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from dockerfile import BuildFailed, Image, parse

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
AUTH = {"authorization": "Bearer sk-container"}
HI = [{"role": "user", "content": "hi"}]
# The host's package-index settings reach the build's pip, as a builder's network would.
PIP_PASSTHROUGH = ("PIP_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                   "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HOME")
BUILD_TIMEOUT_S = 300


# --------------------------------------------------------------------------- the build context


def ignore_patterns(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]


def _regex(pattern: str) -> re.Pattern[str]:
    p = posixpath.normpath(pattern.lstrip("/"))
    out, i = "", 0
    while i < len(p):
        if p.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif p.startswith("**", i):
            out, i = out + ".*", i + 2
        elif p[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif p[i] == "?":
            out, i = out + "[^/]", i + 1
        elif p[i] == "[":
            j = p.index("]", i)
            out, i = out + p[i:j + 1], j + 1
        else:
            out, i = out + re.escape(p[i]), i + 1
    return re.compile(out)


def is_ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins, `!` re-includes, a matched directory takes its contents."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        rx = _regex(pattern[1:] if negate else pattern)
        if any(rx.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def context_files(context: Path, patterns: list[str]) -> set[str]:
    """Every file `docker build` would send: relative paths under the context, after .dockerignore."""
    out = set()
    prune = not any(p.startswith("!") for p in patterns)  # else an ignored folder may hold a re-included file
    for top, dirs, names in os.walk(context):
        base = Path(top).relative_to(context).as_posix()
        rels = [n if base == "." else f"{base}/{n}" for n in names]
        out.update(rel for rel in rels if not is_ignored(rel, patterns))
        if prune:
            dirs[:] = [d for d in dirs if not is_ignored(d if base == "." else f"{base}/{d}", patterns)]
    return out


# --------------------------------------------------------------------------- the build


@dataclass
class Built:
    image: Image
    root: Path
    venv: Path
    uid: int
    gid: int

    def at(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def remap(self, value: str) -> str:
        """An image path (or a sqlite:/// URL of one) as the same place inside the scratch root."""
        if value.startswith("sqlite:///"):
            return "sqlite:///" + self.remap(value.removeprefix("sqlite:///"))
        return str(self.at(value)) if value.startswith("/") else value

    def env(self, **overrides: str) -> dict[str, str]:
        env = {"PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.at("/data")),
               "LANG": "C.UTF-8"}
        env.update({k: self.remap(v) for k, v in self.image.env.items()})
        env.update(overrides)
        return env

    def as_user(self) -> list[str]:
        """The command prefix that runs as the image's USER (see the module docstring)."""
        if os.geteuid() != 0:
            return []
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def _copy(image: Image, context: Path, files: set[str], root: Path) -> None:
    for sources, dest in image.copies:
        target = root / posixpath.join(image.workdir, dest).lstrip("/")
        for src in sources:
            src = posixpath.normpath(src)
            if src in files:
                into = target / Path(src).name if len(sources) > 1 or dest.endswith("/") else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(context / src, into)
                continue
            under = sorted(f for f in files if f.startswith(src + "/"))
            if not under:
                raise BuildFailed(f"COPY {src}: not in the build context (missing, or excluded by .dockerignore)")
            for f in under:
                (target / f[len(src) + 1:]).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(context / f, target / f[len(src) + 1:])


def _make_python(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=60)
    for name in ("pip", "pip3"):  # the base image's pip: the host's, installing into this venv
        shim = venv / "bin" / name
        shim.write_text(f'#!/bin/sh\nexec "{venv / "bin" / "python"}" -m pip "$@"\n')
        shim.chmod(0o755)


def _ids(spec: str, users: dict[str, tuple[int, int]], groups: dict[str, int]) -> tuple[int, int]:
    user, _, group = spec.partition(":")
    if user.isdigit():
        uid, gid = int(user), int(user)
    elif user in users:
        uid, gid = users[user]
    else:
        raise BuildFailed(f"unknown user {user!r} (no useradd created it)")
    if group:
        gid = int(group) if group.isdigit() else groups[group]
    return uid, gid


def _option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def build(text: str, context: Path, ignore: str, scratch: Path) -> Built:
    """Perform the Dockerfile's build into `scratch` (the image's root); raises BuildFailed where docker would."""
    image = parse(text)
    assert image.base.startswith("python:"), f"FROM {image.base}: the emulation stands in for a python base image"
    root = scratch
    root.chmod(0o755)
    built = Built(image, root, root / "venv", 0, 0)
    _make_python(built.venv)
    _copy(image, context, context_files(context, ignore_patterns(ignore)), root)
    workdir = built.at(image.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    users: dict[str, tuple[int, int]] = {"root": (0, 0)}
    groups: dict[str, int] = {"root": 0}
    build_env = built.env(**{k: v for k, v in os.environ.items() if k.startswith(PIP_PASSTHROUGH)})
    for run in image.runs:
        for step in re.split(r"\s*&&\s*", run.strip()):
            words = shlex.split(step)
            if words[0] == "groupadd":
                groups[words[-1]] = int(_option(words, "--gid") or 999)
            elif words[0] == "useradd":
                gid = _option(words, "--gid")
                uid = int(_option(words, "--uid") or 999)
                users[words[-1]] = (uid, int(gid) if gid and gid.isdigit() else groups.get(gid or "", uid))
            elif words[0] == "chown":
                uid, gid = _ids(words[1], users, groups)
                for p in words[2:]:
                    if os.geteuid() == 0:
                        os.chown(built.remap(p), uid, gid)
            else:
                command = " ".join(shlex.quote(built.remap(w)) for w in words)
                done = subprocess.run(["sh", "-c", command], cwd=workdir, env=build_env, capture_output=True,
                                      text=True, timeout=BUILD_TIMEOUT_S)
                if done.returncode != 0:
                    raise BuildFailed(f"RUN {step}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    built.uid, built.gid = _ids(image.user, users, groups)
    if os.geteuid() != 0:  # no other uid to be: make everything but the volumes unwritable by hand
        volumes = {built.at(v) for v in image.volumes}
        for path in [root, *root.rglob("*")]:
            if not any(path == v or v in path.parents for v in volumes) and not path.is_symlink():
                path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return built


def _remove(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    shutil.rmtree(root)


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ctxproxy-image-"))  # not under pytest's private (0700) tmp
    yield path
    _remove(path)


@pytest.fixture(scope="module")
def built() -> Iterator[Built]:
    path = Path(tempfile.mkdtemp(prefix="ctxproxy-image-"))
    try:
        yield build(DOCKERFILE.read_text(encoding="utf-8"), REPO, DOCKERIGNORE.read_text(encoding="utf-8"), path)
    finally:
        _remove(path)


# --------------------------------------------------------------------------- running the image


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Container:
    proc: subprocess.Popen[bytes]
    url: str
    env: dict[str, str]
    log: Path


def start(b: Built, log: Path, **env: str) -> Container:
    """The image's CMD as its USER, in its WORKDIR, with its ENV; returns once /healthz answers."""
    assert isinstance(b.image.cmd, list), "CMD in exec form, so ctxproxy itself is PID 1 and gets SIGTERM"
    port = free_port()
    run_env = b.env(CTXPROXY_PORT=str(port), **env)
    program = shutil.which(b.image.cmd[0], path=run_env["PATH"])
    assert program and Path(program).is_relative_to(b.root), f"CMD {b.image.cmd[0]}: not installed by the build"
    proc = subprocess.Popen([*b.as_user(), program, *b.image.cmd[1:]], cwd=b.at(b.image.workdir), env=run_env,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return Container(proc, url, run_env, log)
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the image's CMD did not become healthy (exit {proc.poll()}): {log.read_text()}")
        time.sleep(0.05)


def healthcheck(b: Built, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    timeout = float(b.image.healthcheck_options.get("timeout", "30s").rstrip("s"))
    return subprocess.run([*b.as_user(), "sh", "-c", b.image.healthcheck], cwd=b.at(b.image.workdir), env=env,
                          capture_output=True, text=True, timeout=timeout + 5)


def as_user(b: Built, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*b.as_user(), *argv], cwd=b.root, env=b.env(), capture_output=True, text=True, timeout=30)


def stop(c: Container) -> None:
    if c.proc.poll() is None:
        c.proc.kill()
        c.proc.wait(timeout=10)


# --------------------------------------------------------------------------- the tests


@pytest.mark.timeout(120)
def test_the_image_serves_as_its_non_root_user_and_passes_its_healthcheck(built: Built, tmp_path: Path) -> None:
    c = start(built, tmp_path / "proxy.log")
    try:
        status = Path(f"/proc/{c.proc.pid}/status").read_text()
        uid = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        assert uid and int(uid.group(1)) == (built.uid if os.geteuid() == 0 else os.geteuid())
        assert built.uid != 0, "the image's USER is not root"
        check = healthcheck(built, c.env)
        assert check.returncode == 0, check.stderr
        r = httpx.get(c.url + "/readyz", timeout=5)
        assert r.status_code == 200 and r.json()["store"] is True, r.text
    finally:
        stop(c)
    # The store is where the ENV says, on the volume: written there by the USER.
    assert Path(built.remap(built.image.env["CTXPROXY_STORE"]).removeprefix("sqlite:///")).is_file()


@pytest.mark.timeout(120)
def test_the_tree_is_read_only_to_the_user_except_the_data_volume(built: Built) -> None:
    assert built.image.volumes == ["/data"]
    for image_path in (built.image.workdir, built.image.env["TIKTOKEN_CACHE_DIR"], str(built.venv)):
        place = Path(built.remap(image_path)) / "written-by-the-user"
        done = as_user(built, "touch", str(place))
        assert done.returncode != 0 and not place.exists(), f"the image's user can write {image_path}"
    place = built.at("/data") / "written-by-the-user"
    done = as_user(built, "touch", str(place))
    assert done.returncode == 0 and place.exists(), done.stderr


@pytest.mark.timeout(120)
def test_the_image_runs_its_own_installed_copy_with_encodings_baked_in(built: Built) -> None:
    done = as_user(built, str(built.venv / "bin" / "python"), "-c", "import proxy; print(proxy.__file__)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(built.venv), done.stdout
    seeded = sorted(p.name for p in built.at(built.image.env["TIKTOKEN_CACHE_DIR"]).iterdir())
    assert len(seeded) >= 2, f"the build seeds o200k_base and cl100k_base into TIKTOKEN_CACHE_DIR, got {seeded}"
    copied = {p.relative_to(built.at(built.image.workdir)).as_posix()
              for p in built.at(built.image.workdir).rglob("*") if p.is_file()}
    assert not any("__pycache__" in p or p.endswith(".db") for p in copied)
    assert not any(p.startswith(("tests/", "bench/", ".git/")) for p in copied)


@pytest.mark.timeout(120)
def test_sigterm_drains_an_in_flight_stream_then_the_container_stops(built: Built, tmp_path: Path,
                                                                      upstream: Any) -> None:
    assert built.image.stopsignal == "SIGTERM"
    c = start(built, tmp_path / "proxy.log", CTXPROXY_UPSTREAM=upstream.base_url)
    try:
        words = "one two three four five six"
        upstream.script(words)
        upstream.chunk_delay = 0.3
        events: list[Any] = []
        signalled = False
        with httpx.stream("POST", c.url + "/v1/chat/completions", headers=AUTH, timeout=10,
                          json={"model": "m", "messages": HI, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
                if not signalled:
                    c.proc.send_signal(signal.SIGTERM)
                    signalled = True
        text = "".join(e["choices"][0]["delta"].get("content") or ""
                       for e in events if isinstance(e, dict) and e["choices"])
        assert text.split() == words.split() and events[-1] == "[DONE]"
        try:
            code = c.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after SIGTERM, its stream done: {c.log.read_text()}")
        # uvicorn re-raises the SIGTERM it caught once drained (exit 143 in a container, as in tests/test_faults.py)
        assert code in (0, -signal.SIGTERM), c.log.read_text()
        assert "shutdown complete" in c.log.read_text().lower()
    finally:
        stop(c)


@pytest.mark.timeout(120)
def test_the_kubernetes_sidecar_config_serves_in_the_image_and_its_exec_probes_pass(built: Built,
                                                                                    tmp_path: Path) -> None:
    """deploy/kubernetes/sidecar's container as the kubelet would run it: its env, its ConfigMap, its probes."""
    folder = REPO / "deploy" / "kubernetes" / "sidecar"
    docs = [d for f in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text(encoding="utf-8"))]
    secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (proxy,) = deployment["spec"]["template"]["spec"]["initContainers"]
    env = {v["name"]: v["value"] if "value" in v else secrets[v["valueFrom"]["secretKeyRef"]["name"]][
        v["valueFrom"]["secretKeyRef"]["key"]] for v in proxy["env"]}
    mounted = tmp_path / "config.yaml"  # the ConfigMap volume at posixpath.dirname($CTXPROXY_CONFIG)
    mounted.write_text(config_map["data"][posixpath.basename(env["CTXPROXY_CONFIG"])])
    c = start(built, tmp_path / "proxy.log", **{**env, "CTXPROXY_CONFIG": str(mounted)})
    try:
        port = c.env["CTXPROXY_PORT"]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            argv = [a.replace(":8080/", f":{port}/") for a in proxy[kind]["exec"]["command"]]
            program = shutil.which(argv[0], path=c.env["PATH"])
            assert program, argv
            done = subprocess.run([*built.as_user(), program, *argv[1:]], env=c.env, capture_output=True,
                                  text=True, timeout=proxy[kind]["timeoutSeconds"] + 5 if "timeoutSeconds" in
                                  proxy[kind] else 10)
            assert done.returncode == 0, f"{kind}: {done.stderr}"
        r = httpx.get(c.url + "/ctx/v1/stats", headers={"authorization": f"Bearer {env['CTXPROXY_ADMIN_TOKEN']}"},
                      timeout=5)
        assert r.status_code == 200, r.text  # the admin token from the Secret opens /ctx/*
    finally:
        stop(c)
    log = (tmp_path / "proxy.log").read_text()
    assert f"http://127.0.0.1:{port}" in log and "0.0.0.0" not in log, log  # the pod's loopback only


@pytest.mark.timeout(120)
def test_the_healthcheck_fails_when_nothing_answers(built: Built) -> None:
    check = healthcheck(built, built.env(CTXPROXY_PORT=str(free_port())))
    assert check.returncode != 0


@pytest.mark.timeout(120)
def test_a_run_step_naming_a_missing_module_fails_the_build(scratch: Path) -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert "python -m proxy.tokens.encodings" in text
    broken = text.replace("python -m proxy.tokens.encodings", "python -m proxy.encodings")
    with pytest.raises(BuildFailed, match="No module named proxy.encodings"):
        build(broken, REPO, DOCKERIGNORE.read_text(encoding="utf-8"), scratch)


def test_a_copy_of_something_not_in_the_context_fails_the_build(scratch: Path) -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    ignore = DOCKERIGNORE.read_text(encoding="utf-8")
    with pytest.raises(BuildFailed, match="COPY proxyy"):
        build(text.replace("COPY proxy ./proxy", "COPY proxyy ./proxy"), REPO, ignore, scratch)
    with pytest.raises(BuildFailed, match="excluded by .dockerignore"):
        build(text, REPO, ignore + "\nproxy\n", scratch)


def test_dockerignore_keeps_repository_clutter_out_of_the_build_context(tmp_path: Path) -> None:
    kept = {"pyproject.toml", "README.md", "config.yaml", "proxy/app.py", "proxy/store/sqlite.py"}
    dropped = {".git/HEAD", "tests/test_x.py", "bench/run.py", "tests/agents/node_modules/x/index.js",
               "proxy/__pycache__/app.cpython-311.pyc", "ctxproxy.db", "proxy/ctxproxy.db-wal",
               ".pytest_cache/v/x", "ctxproxy.egg-info/PKG-INFO", "deploy/kubernetes/x.yaml"}
    for rel in kept | dropped:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert context_files(tmp_path, ignore_patterns(DOCKERIGNORE.read_text(encoding="utf-8"))) == kept
    # Docker's own rules, which the filter follows: the last match wins and `!` brings a file back.
    every = kept | dropped
    assert context_files(tmp_path, ["**/*.py", "!proxy/app.py"]) == every - {
        "proxy/store/sqlite.py", "tests/test_x.py", "bench/run.py"}


def test_the_image_labels_say_what_pyproject_says() -> None:
    image = parse(DOCKERFILE.read_text(encoding="utf-8"))
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    oci = {k.removeprefix("org.opencontainers.image."): v for k, v in image.labels.items()}
    assert oci["title"] == project["name"]
    assert oci["description"] == project["description"]
    assert oci["version"] == project["version"]
    assert oci["licenses"] == project["license"]["text"]
    assert "source" in oci and "CTXPROXY_SOURCE" in image.args
    assert image.expose == [image.env["CTXPROXY_PORT"]]
