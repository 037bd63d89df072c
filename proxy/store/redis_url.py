"""The three Redis store URL forms: one server, a Redis Cluster, a Sentinel-managed primary.

    redis://[[user]:password@]host[:port][/db][?wait=N&wait_ms=M]         one server (rediss://: TLS)
    redis+cluster://[[user]:password@]host[:port][,host[:port]...][/]     a cluster, from any of its nodes
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]   the primary Sentinel names

Managed offerings (ElastiCache cluster mode, Memorystore Cluster, Valkey cluster) are the
cluster form; ElastiCache/Memorystore with a failover replica and self-run HA are usually
Sentinel or one endpoint that moves (the plain form). The password authenticates to the
data nodes; sentinels get `sentinel_password` if they need one. `wait`/`wait_ms` are the
store's own options (how many replicas must have a handle before its write returns, and
for how long to wait for them), taken out before the rest reaches redis-py.

Every message here names the scheme or the option, never the URL: it may hold a password.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

Mode = Literal["single", "cluster", "sentinel"]
SCHEMES: dict[str, tuple[Mode, bool]] = {
    "redis": ("single", False), "rediss": ("single", True),
    "redis+cluster": ("cluster", False), "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False), "rediss+sentinel": ("sentinel", True),
}
REDIS_PORT = 6379
SENTINEL_PORT = 26379
# Replicas a handle write waits for, by mode: a cluster or Sentinel set exists to survive a
# primary's loss, which only a write a replica holds does; a single server may have none.
DEFAULT_WAIT = {"single": 0, "cluster": 1, "sentinel": 1}
# How long a write waits for them: a bound well inside the store's call deadline (0.5 s by default).
DEFAULT_WAIT_MS = 100
OWN_OPTIONS = ("wait", "wait_ms", "sentinel_password")


@dataclass(frozen=True)
class RedisTarget:
    """What a Redis store URL names, parsed once."""

    mode: Mode
    ssl: bool
    nodes: tuple[tuple[str, int], ...]  # the server; the cluster's seed nodes; the sentinels
    db: int
    username: str | None
    password: str | None
    service: str | None  # the Sentinel service (master) name
    wait: int
    wait_ms: int
    sentinel_password: str | None
    single_url: str  # for "single": the URL without the store's own options, as redis-py reads it


def _fail(scheme: str, why: str) -> ValueError:
    return ValueError(f"{scheme} store URL: {why}")


def _nodes(scheme: str, hosts: str, default_port: int) -> tuple[tuple[str, int], ...]:
    out = []
    for part in hosts.split(","):
        host, _, port = part.rpartition(":") if not part.endswith("]") else (part, "", "")
        if not host:
            host, port = part, ""
        host = host.strip("[]")
        if not host:
            raise _fail(scheme, "a host is empty")
        try:
            out.append((host, int(port) if port else default_port))
        except ValueError:
            raise _fail(scheme, "a port is not a number") from None
    return tuple(out)


def _int_option(scheme: str, options: dict[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    if not raw.isdigit():
        raise _fail(scheme, f"{name} must be a whole number >= 0")
    return int(raw)


def parse_redis_url(url: str) -> RedisTarget:
    """The target a URL names; ``ValueError`` (naming the scheme, never the URL) if it is not one of the forms."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"not a Redis store URL scheme: {scheme!r}")
    mode, ssl = SCHEMES[scheme]
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {k: v for k, v in query if k in OWN_OPTIONS}
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    wait = _int_option(scheme, options, "wait", DEFAULT_WAIT[mode])
    wait_ms = _int_option(scheme, options, "wait_ms", DEFAULT_WAIT_MS)
    if mode == "single":
        rest = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k not in OWN_OPTIONS])))
        return RedisTarget(mode, ssl, (), 0, None, None, None, wait, wait_ms, None, rest)
    if not hosts:
        raise _fail(scheme, "needs at least one host:port")
    foreign = sorted({k for k, _ in query if k not in OWN_OPTIONS})
    if foreign:
        raise _fail(scheme, f"unknown option(s) {', '.join(foreign)}; accepted: {', '.join(OWN_OPTIONS)}")
    path = [p for p in parts.path.split("/") if p]
    if mode == "cluster":
        if path and path != ["0"]:
            raise _fail(scheme, "a cluster has database 0 only; give no path (or /0)")
        service, db = None, 0
    else:
        if not path or len(path) > 2:
            raise _fail(scheme, "needs /<service-name>[/<db>] after the sentinels")
        service = unquote(path[0])
        if len(path) == 2 and not path[1].isdigit():
            raise _fail(scheme, "the database after the service name must be a number")
        db = int(path[1]) if len(path) == 2 else 0
    return RedisTarget(mode, ssl, _nodes(scheme, hosts, REDIS_PORT if mode == "cluster" else SENTINEL_PORT), db,
                       unquote(user) or None, unquote(password) or None, service, wait, wait_ms,
                       options.get("sentinel_password") or None, "")
