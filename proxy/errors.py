"""Every failure a client can see, as one small hierarchy with OpenAI-shaped bodies.

Agents and SDKs parse `{"error": {"message", "type", "param", "code"}}`; an error
the proxy itself raises must look exactly like one from the provider so that the
client's own retry and reporting logic keeps working unchanged.
"""

from __future__ import annotations

import orjson


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    """The OpenAI error envelope, serialized once."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


# Anthropic's error types by status (docs.anthropic.com/en/api/errors); 502/504 are the proxy's reaching the API.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "invalid_request_error", 413: "request_too_large",
                    415: "invalid_request_error", 429: "rate_limit_error", 529: "overloaded_error"}


ANTHROPIC_ERROR_TYPES = frozenset({*_ANTHROPIC_TYPES.values(), "api_error"})


def anthropic_error_body(message: str, status: int, type_: str | None = None) -> bytes:
    """Anthropic's error envelope, which its SDKs and Claude Code parse on /v1/messages.

    `type_`: an Anthropic error type to keep (the provider's own); else the one the status calls for.
    """
    if type_ not in ANTHROPIC_ERROR_TYPES:
        type_ = _ANTHROPIC_TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": type_, "message": message}})


# Google's canonical status names by HTTP status (cloud.google.com/apis/design/errors), as its error bodies say them.
_GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                  408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 415: "INVALID_ARGUMENT",
                  429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
                  502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def google_error_body(message: str, status: int) -> bytes:
    """Google's error envelope, which the Gemini SDKs and Gemini CLI parse: `{"error": {code, message, status}}`."""
    return orjson.dumps({"error": {"code": status, "message": message,
                                   "status": _GOOGLE_STATUS.get(status, "UNKNOWN")}})


class ProxyError(Exception):
    """An error the proxy answers itself; subclasses fix status, type and code."""

    status: int = 500
    type: str = "proxy_error"
    code: str | None = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)

    def anthropic_body(self) -> bytes:
        return anthropic_error_body(self.message, self.status)

    def google_body(self) -> bytes:
        return google_error_body(self.message, self.status)



class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_admin_token"


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RequestTimeout(ProxyError):
    """The client did not send its whole request in time; the connection is closed after the answer."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(ProxyError):
    """A request body in a form the proxy cannot read (a Content-Encoding it cannot undo)."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class UpstreamUnreachable(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class StoreUnavailable(ProxyError):
    status = 503
    type = "proxy_error"
    code = "store_unavailable"


class ConfigError(Exception):
    """Invalid configuration: the message names the key and what is wrong, on one line."""
