"""Credentials out of everything the proxy prints or logs: passwords in URLs.

A store URL (`redis://:secret@host:6379/0`) legitimately carries a password;
`ctxproxy check`, the startup line, logs and error messages show such a URL
as `redis://:***@host:6379/0`. A user name without a password is masked whole
(`https://TOKEN@host` is a common way to pass a token).
"""

from __future__ import annotations

import re

MASK = "***"
# scheme://userinfo@ — userinfo as RFC 3986 allows it (unreserved, %-escapes, sub-delims, ':'),
# so a quote, a space or a '/' ends it and a JSON log line or a sentence is never swallowed; plus
# '@', up to the last one, as parsers read an unescaped '@' in a password (`redis://:p@ss@host`).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[A-Za-z0-9\-._~%!$&'()*+,;=:@]*)@")


def _mask(m: re.Match[str]) -> str:
    user, colon, _ = m.group("userinfo").partition(":")
    return m.group("scheme") + (f"{user}:{MASK}" if colon else MASK) + "@"


def redact(text: str) -> str:
    """`text` with the password of every URL in it masked; unchanged (and cheap) when there is none."""
    if "://" not in text or "@" not in text:
        return text
    return _USERINFO.sub(_mask, text)
