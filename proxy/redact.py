"""Credentials out of everything the proxy prints or logs: passwords in URLs, API keys, tokens.

One redaction for every channel (logs, stdout, `ctxproxy check`, error messages,
spans), in three layers, each catching what the one before cannot:

1. The secrets the process knows (`register_settings`: the store URL's password and
   sentinel_password, the admin token, the tenant salt, each route's injected key,
   a proxy URL's password) are replaced wherever they appear, raw, percent-encoded,
   JSON-escaped or repr-escaped. This needs no pattern, so any character works.
2. A string that is a URL (`redact_url`: the store setting, a base_url) is parsed,
   not pattern-matched: its userinfo password (`redis://:***@`, `user:***@`), a lone
   user name (`***@`, a token passed as user) and the values of secret-named query
   options (`?password=`, `?sentinel_password=`, `?api_key=`...) are masked.
3. Free text (an exception's message, a URL nobody registered) is scanned for
   `scheme://` and the same URL masking is applied to each non-blank run after it,
   plus the usual API key shapes (`sk-...`, `AIza...`, `Bearer ...`, `x-api-key: ...`).

Text with none of these hints is returned as it is after one regex search: log
lines go through here on the request path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus, unquote

import orjson
import re2

if TYPE_CHECKING:
    from proxy.config import Settings

MASK = "***"
MIN_SECRET = 4  # a shorter registered value is masked only where the URL masking finds it: "abc" is ordinary text
DEFAULT_TENANT_SALT = "ctxproxy-tenant-v1"  # config.py's default: public, so never registered
PROXY_ENV = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")

# A query option is secret if its name holds one of these (password, sentinel_password, api_key, access_token...).
_SECRET_NAME = r"[\w.\-]*(?:pass|pwd|secret|token|key|auth|credential|signature)[\w.\-]*"
# A value runs to the next `&name=` (an '&' inside a password does not end it) or the end; in free text also to a
# blank. An empty value is left as is.
_QUERY_URL = re.compile(rf"(?i)([?&;]{_SECRET_NAME}=)((?:[^&]|&(?![\w.\-]+=))+)")
_QUERY_TEXT = re.compile(rf"(?i)([?&;]{_SECRET_NAME}=)((?:[^&\s]|&(?![\w.\-]+=))+)")
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
# `scheme://` and the non-blank run after it, up to the next `scheme://` (a URL in a query is its own URL).
_URL_RUN = re.compile(rf"\b({_SCHEME})((?:(?!{_SCHEME})\S)+)")
# One host[:port] (a name, IPv4, [IPv6]): an authority that is one of these, or several joined by ',' (a cluster's
# seed nodes), ends where it seems to; otherwise (`:pa/ss@host`) a '/', '?' or '#' before the '@' was the password's.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]*\]|[\w.~%\-]+)(?::\d*)?")
_STORE_SCHEMES = ("redis", "rediss")  # and their +cluster, +sentinel forms (proxy/store/redis_url.py)
_KEYS = re.compile(
    r"\b(?P<key>sk-(?:ant-|proj-)?|AIza)[\w\-]{16,}"  # OpenAI, Anthropic, Google
    # an Authorization header's token (8 characters or more, one of them no letter: "bearer authentication" is kept)
    r"|(?P<scheme>(?i:\bbearer)\s+)(?=[\w\-.~+/]*[\d_\-.~+/])[\w\-.~+/]{8,}=*"
    # a header or option naming a key, and its value: `x-api-key: ...`, `'Authorization': 'Basic ...'`, `api_key=...`
    r"|(?P<name>(?i:\b(?:x-)?(?:goog-)?api[-_]?key|\bauthorization)[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?i:bearer|basic)\s+)?)[^\s\"',;&]{8,}"
)
# What any secret the layers mask starts with (or is), searched for first: RE2 (a DFA over the UTF-8 bytes) finds
# any of them, the registered secrets' forms too, in one pass, for about a microsecond a log line whatever their
# number; Python's re took 30 (an alternation without a common literal start is tried at every character).
_HINTS_SOURCE = rf"://|\bsk-|\bAIza|(?i:bearer|api[-_]?key|authorization|[?&;]{_SECRET_NAME}=)"
_HINTS = re2.compile(_HINTS_SOURCE.encode())

_secrets: set[str] = set()  # every registered form of every registered secret
_known: re.Pattern[str] | None = None  # those, longest first, as one alternation
_suspect: Any = _HINTS  # _HINTS or any registered form (an re2 pattern over bytes)


def register_secrets(*values: str | None) -> None:
    """Mask these values wherever they are printed from now on, whatever characters they hold.

    Each is registered as it is and in the forms it takes when printed inside something else: percent-encoded
    (in a URL), JSON-escaped (in a log line), repr-escaped (in an exception's message or a traceback)."""
    global _known, _suspect
    new = {form for value in values if value and len(value) >= MIN_SECRET for form in _forms(value)} - _secrets
    if not new:
        return
    _secrets.update(new)
    ordered = sorted(_secrets, key=len, reverse=True)  # a secret holding another is masked whole
    _known = re.compile("|".join(re.escape(s) for s in ordered))
    _suspect = re2.compile(b"|".join([_HINTS_SOURCE.encode(), *(re2.escape(_utf8(s)) for s in ordered)]))


def _forms(value: str) -> set[str]:
    """`value` as it is, percent-encoded, JSON-escaped and repr-escaped."""
    out = {value, quote(value, safe=""), quote_plus(value, safe=""), repr(value)[1:-1]}
    try:
        out.add(orjson.dumps(value)[1:-1].decode())
    except orjson.JSONEncodeError:  # a lone surrogate: no log line can hold it either
        pass
    return out


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries: its userinfo password and its secret-named query options' values, as written and
    percent-decoded. Not a lone user name: it may be a token, but as often a word (`redis://default@h`) that masked
    everywhere would hide route names; the URL masking still hides it in the URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return []
    found = [m.group(2) for m in _QUERY_URL.finditer(rest)]
    rest = _QUERY_URL.sub(lambda m: m.group(1), rest)
    userinfo = _userinfo(scheme, rest)
    if userinfo is not None:
        found.append(userinfo.partition(":")[2])
    return [form for s in found for form in {s, unquote(s)}]


def register_url(url: str | None) -> None:
    """Register the secrets a URL carries (`url_secrets`)."""
    if url:
        register_secrets(*url_secrets(url))


def register_settings(settings: Settings, environ: Mapping[str, str] | None = None) -> None:
    """Register every secret the settings (and the proxy variables of the environment) hold: called once they are
    loaded, before anything is printed (cli.py, create_app), so no later line can show one."""
    env = os.environ if environ is None else environ
    register_url(settings.store)
    salt = settings.tenant_salt if settings.tenant_salt != DEFAULT_TENANT_SALT else None
    register_secrets(settings.admin_token, salt, *(r.upstream.api_key() for r in settings.routes),
                     *_header_values(settings.otel_env))
    for name in PROXY_ENV:
        register_url(env.get(name))


def _header_values(env: Mapping[str, str]) -> Iterable[str]:
    """The values of OTEL_EXPORTER_OTLP_*HEADERS (`k=v,k2=v2`): an exporter's API key rides there."""
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        for pair in env.get(name, "").split(","):
            yield pair.partition("=")[2].strip()


def redact(text: str) -> str:
    """`text` with every secret in it masked (the module's three layers); unchanged, after one search, if none."""
    if _suspect.search(_utf8(text)) is None:
        return text
    if _known is not None:
        text = _known.sub(MASK, text)
    if "://" in text:
        text = _URL_RUN.sub(_mask_run, text)
    return _KEYS.sub(_mask_key, text)


def redact_url(url: str) -> str:
    """A URL as it may be printed: registered secrets, its userinfo and its secret query values masked.

    For a string that is a URL as a whole (the store setting, a route's base_url): a value may hold any character,
    a blank included, so nothing but '&name=' ends one."""
    if _known is not None:
        url = _known.sub(MASK, url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return redact(url)
    return scheme + sep + _mask_authority(scheme, _QUERY_URL.sub(_mask_option, rest))


def redact_value(value: object) -> object:
    """A log field's value with secrets masked: strings, and the strings inside dicts, lists and tuples; any other
    object but a number, bool or None as its redacted str (what the line would have printed)."""
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, Mapping):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return redact(str(value))


def suspect(data: bytes) -> bool:
    """Whether `data` (UTF-8) may hold a secret (a hint of one, or a registered one in any of its forms): the one
    search that lets a clean log line through as it is."""
    return _suspect.search(data) is not None


def _userinfo(scheme: str, rest: str) -> str | None:
    """The userinfo of a URL's part after `scheme://` (query secrets already masked), or None.

    As parsers read it, the authority ends at the first '/', '?' or '#' and the userinfo is what comes before its
    last '@' (an unescaped '@' in a password: `redis://:p@ss@host`). But a password may hold a raw '/', '?' or '#'
    too (`redis://:pa/ss@host`): so the userinfo runs to the last '@' of all if the URL is a store's (its path and
    options never hold one: `redis://u:12/34@host`), or if what came before the '/' is no host[:port] (':pa' is
    none). A path with an '@' after a real host (`https://h/models/m@001`) is kept."""
    last = rest.rfind("@")
    if last < 0:
        return None
    if scheme.lower().split("+")[0] in _STORE_SCHEMES:
        return rest[:last]
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if 0 <= i < end:
            end = i
    netloc = rest[:end]
    at = netloc.rfind("@")
    if at >= 0:
        return netloc[:at]
    if not netloc or all(_HOST.fullmatch(part) for part in netloc.split(",")):
        return None
    return rest[:last]


def _mask_authority(scheme: str, rest: str) -> str:
    userinfo = _userinfo(scheme, rest)
    if userinfo is None:
        return rest
    user, colon, _ = userinfo.partition(":")
    return (f"{user}:{MASK}" if colon else MASK) + rest[len(userinfo):]


def _mask_option(m: re.Match[str]) -> str:
    return m.group(1) + MASK


def _mask_run(m: re.Match[str]) -> str:
    return m.group(1) + _mask_authority(m.group(1)[:-3], _QUERY_TEXT.sub(_mask_option, m.group(2)))


def _mask_key(m: re.Match[str]) -> str:
    return (m.group("key") or m.group("scheme") or m.group("name")) + MASK
