"""A Dockerfile read as `docker build` reads it: instructions, ARG/ENV substitution, the image's settings.

Shared by tests/test_container.py (which performs the build) and tests/test_kubernetes.py
(whose pods run the image, so its ENV is part of what their containers see).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field


class BuildFailed(AssertionError):
    """A step `docker build` would stop at."""


@dataclass
class Image:
    base: str = ""
    args: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    copies: list[tuple[list[str], str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    user: str = "root"
    volumes: list[str] = field(default_factory=list)
    expose: list[str] = field(default_factory=list)
    healthcheck_options: dict[str, str] = field(default_factory=dict)
    healthcheck: str = ""
    cmd: list[str] | str = field(default_factory=list)
    stopsignal: str = "SIGTERM"


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuation lines joined, comment lines dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#") or (not s and not buf):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        keyword, _, rest = buf.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"
    return out


def _expand(value: str, scope: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: scope.get(m.group(1) or m.group(2), ""), value)


def _pairs(args: str, scope: dict[str, str]) -> dict[str, str]:
    words = shlex.split(args)
    if words and "=" not in words[0]:  # legacy `ENV KEY value`
        return {words[0]: _expand(" ".join(words[1:]), scope)}
    return {k: _expand(v, scope) for k, _, v in (w.partition("=") for w in words)}


def _list(args: str) -> list[str]:
    return list(json.loads(args)) if args.startswith("[") else args.split()


def parse(text: str) -> Image:
    image = Image()
    for keyword, args in instructions(text):
        scope = {**image.args, **image.env}
        if keyword == "FROM":
            image.base = args
        elif keyword == "ARG":
            name, _, default = shlex.split(args)[0].partition("=")
            image.args[name] = default
        elif keyword == "LABEL":
            image.labels.update(_pairs(args, scope))
        elif keyword == "ENV":
            image.env.update(_pairs(args, scope))
        elif keyword == "WORKDIR":
            image.workdir = posixpath.join(image.workdir, _expand(args, scope))
        elif keyword == "COPY":
            words = [_expand(w, scope) for w in _list(args)]
            if any(w.startswith("--") for w in words):
                raise BuildFailed(f"COPY {args}: flags are not emulated here; add them to tests/test_container.py")
            image.copies.append((words[:-1], words[-1]))
        elif keyword == "RUN":
            if args.startswith("["):
                raise BuildFailed(f"RUN {args}: exec-form RUN is not emulated here")
            image.runs.append(args)
        elif keyword == "USER":
            image.user = _expand(args, scope)
        elif keyword == "VOLUME":
            image.volumes.extend(_list(args))
        elif keyword == "EXPOSE":
            image.expose.extend(args.split())
        elif keyword == "HEALTHCHECK":
            m = re.fullmatch(r"((?:--[\w-]+=\S+\s+)*)CMD\s+(.*)", args, re.DOTALL)
            assert m, f"HEALTHCHECK {args}: expected [--option=value ...] CMD command"
            image.healthcheck_options = dict(o[2:].split("=", 1) for o in m.group(1).split())
            image.healthcheck = m.group(2)
        elif keyword == "CMD":
            image.cmd = json.loads(args) if args.startswith("[") else args
        elif keyword == "STOPSIGNAL":
            image.stopsignal = args
        else:
            raise BuildFailed(f"{keyword}: an instruction tests/test_container.py does not emulate")
    return image
