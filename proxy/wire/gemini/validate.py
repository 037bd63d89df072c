"""What a Gemini API request body must be before the proxy touches it, in Google's words.

Strict only where the proxy reads: the body is an object; `contents` a list
of contents, each an object whose `parts` is a list of objects; a
`functionCall` or `functionResponse` part an object with a string `name`;
`systemInstruction` an object; `tools` a list. Every other field (and every
part kind not invented yet) passes untouched. A countTokens body may carry its
request whole under `generateContentRequest`.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest
from proxy.wire.body import check_writable, load_object

_NAMED = ("functionCall", "functionResponse")


def parse_body(raw: bytes, *, counting: bool = False) -> dict[str, Any]:
    body = load_object(raw)
    request = body.get("generateContentRequest") if counting and "contents" not in body else body
    where = "generateContentRequest." if request is not body else ""
    if not isinstance(request, dict):
        raise _invalid("generate_content_request", "Invalid value (expected an object)")
    contents = request.get("contents")
    if not isinstance(contents, list) or not (contents or counting):
        raise _invalid(f"{where}contents", "contents is not specified" if contents is None
                       else "Invalid value (expected a non-empty list)")
    for i, content in enumerate(contents):
        parts = content.get("parts") if isinstance(content, dict) else None
        if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
            raise _invalid(f"{where}contents[{i}].parts", "Invalid value (expected a list of parts)")
        for j, part in enumerate(parts):
            for kind in _NAMED:
                if kind in part and not (isinstance(part[kind], dict) and isinstance(part[kind].get("name"), str)):
                    raise _invalid(f"{where}contents[{i}].parts[{j}].{kind}.name", "Field required")
    if "systemInstruction" in request and not isinstance(request["systemInstruction"], dict):
        raise _invalid(f"{where}system_instruction", "Invalid value (expected an object)")
    if "tools" in request and not isinstance(request["tools"], list):
        raise _invalid(f"{where}tools", "Invalid value (expected a list)")
    check_writable(body)
    return body


def _invalid(field: str, why: str) -> BadRequest:
    return BadRequest(f"Invalid JSON payload received. {field}: {why}", param=field)
