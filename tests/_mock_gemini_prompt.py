"""The mock provider's prompt rules for Google's Gemini API (``/v1beta/models/{model}:generateContent``).

Like tests/_mock_prompt.py (whose o200k tokenizer and prefix cache this
reuses) it imports nothing from ``proxy``: a second implementation of the
provider's rules, written from Google's documentation and from what the real
Gemini CLI sends, so that the proxy is tested against it and not against itself.

**Validation**, as the API refuses a request (400 ``INVALID_ARGUMENT``, worded
as Google words it; ``RequestError``):

* the body is a JSON object whose top-level fields are those of a
  GenerateContentRequest (camelCase or snake_case, as proto JSON accepts both);
  any other name is ``Invalid JSON payload received. Unknown name "x": Cannot
  find field.`` (an OpenAI ``stream`` or ``messages`` field is refused so);
* ``contents`` is a non-empty list of objects, each with a role ``user`` or
  ``model`` (none: the user) and a non-empty ``parts`` list, each part holding
  one of the data fields (``text``, ``functionCall``, ``functionResponse``, ...);
* ``systemInstruction`` is a Content object, ``tools`` a list of objects;
* a function call turn (a ``model`` content with ``functionCall`` parts) comes
  right after a user turn or a function response turn, and the content after it,
  if it answers with ``functionResponse`` parts, answers every call (as many
  responses as calls);
* **thought signatures**: for the models that enforce them (``gemini-3`` and
  later: ``signatures_required``), the first ``functionCall`` part of each
  model turn of the *current turn* must carry a ``thoughtSignature`` (any
  non-empty string: the API's documented ``skip_thought_signature_validator``
  sentinel passes, as the real Gemini CLI sends it). The current turn starts at
  the last user content holding a text part and no ``functionResponse`` (the
  API's documented rule; the CLI's ``ensureActiveLoopHasThoughtSignatures`` uses
  the same one). The refusal is the API's own wording (``missing_signature``),
  as users have reported it: ``Function call is missing a thought_signature in
  functionCall parts. ... Additional data, function call `default_api:NAME` ,
  position N. ...`` where N is the 1-based index of the model content in
  ``contents``.

**Rendering**: a list of chunks, each tokenized on its own so that a cached
prefix ends on part boundaries:

* the system instruction, one chunk per part: ``<|system|>\\n`` before the
  first, then the part's text and ``\\n``;
* each function declaration of each tool: ``<|tool|>{JSON, sorted keys}\\n``;
  any other tool (``googleSearch``, ``codeExecution``...) its JSON the same way;
* the contents, one chunk per part: ``<|{role}|>\\n`` before a content's first
  part, then the part's text and ``\\n``. A part's text: ``text`` its text
  (``<thought>`` before it for a thought part); ``functionCall``
  ``<function_call>{name}({JSON args, sorted keys})``; ``functionResponse``
  ``<function_response>{name}`` then, per key of ``response`` in sorted
  order, ``\\n{key}: {value}`` (a string as it is, anything else as sorted
  JSON); ``inlineData`` ``[{mimeType}]``; ``fileData`` ``[file {fileUri}]``;
  ``executableCode`` its code; ``codeExecutionResult`` its output; anything
  else its JSON with sorted keys. Ids, ``thoughtSignature`` and
  ``videoMetadata`` are not prompt text, so a signature added or dropped does
  not change the prompt.

**Implicit caching**, as Google documents it for Gemini 2.5 and later: no
markers; the cached tokens of a request are its longest common token prefix
with an earlier prompt of the same API key and model (still warm, if the
mock's ``cache_ttl`` is set), followed part by part and, inside the first part
that differs, token by token (``_mock_prompt.PrefixCache``). Reported as
``usageMetadata.cachedContentTokenCount`` (only when above 0), exactly (no
rounding: the documentation gives none, and an exact figure lets a test
recompute it), and 0 when the common prefix is shorter than the model's
minimum (``min_cacheable_tokens``: 2,048 for Gemini 2.x, 4,096 for Gemini 3
and later, as the caching page's table lists them today; 1,024 for any other
name). ``promptTokenCount`` includes the cached tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

try:  # imported as tests._mock_gemini_prompt (benchmarks) or from the pytest rootdir
    from . import _mock_prompt as mp
except ImportError:
    import _mock_prompt as mp  # type: ignore[no-redef]

ROLES = ("user", "model")
SKIP_SIGNATURE = "skip_thought_signature_validator"  # the sentinel Google documents (and the CLI sends)
MIN_CACHEABLE = 1024
# proto JSON field names of a GenerateContentRequest (each also in snake_case)
REQUEST_FIELDS = ("model", "contents", "tools", "toolConfig", "safetySettings", "systemInstruction",
                  "generationConfig", "cachedContent", "serviceTier", "store")
PART_DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
             "codeExecutionResult", "toolCall", "toolResponse")


class RequestError(Exception):
    """An error the API answers instead of running the model: HTTP status, Google's status name, message."""

    def __init__(self, message: str, *, code: int = 400, status: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def get(obj: Any, name: str, default: Any = None) -> Any:
    """A field by its camelCase name, or its snake_case one (proto JSON accepts both)."""
    if not isinstance(obj, dict):
        return default
    if name in obj:
        return obj[name]
    return obj.get(snake(name), default)


# --------------------------------------------------------------------------- models

def _version(model: str) -> tuple[int, int] | None:
    m = re.match(r"gemini-(\d+)(?:\.(\d+))?", model)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix implicit caching reports: 2,048 for Gemini 2.x, 4,096 for 3 and later, else 1,024."""
    v = _version(model)
    if v is None:
        return MIN_CACHEABLE
    return 4096 if v[0] >= 3 else 2048 if v[0] == 2 else MIN_CACHEABLE


def signatures_required(model: str) -> bool:
    """Whether the API refuses a current-turn function call without its thought signature (Gemini 3 and later)."""
    v = _version(model)
    return v is not None and v[0] >= 3


def signs_calls(model: str) -> bool:
    """Whether the model's function calls come with a thought signature (thinking models: Gemini 2.5 and later)."""
    v = _version(model)
    return v is None or v >= (2, 5)


# --------------------------------------------------------------------------- validation

def _invalid(message: str) -> RequestError:
    return RequestError(message)


def _field_error(loc: str, message: str) -> RequestError:
    """Google's field-violation wording: `* GenerateContentRequest.<loc>: <message>\\n`."""
    return RequestError(f"* GenerateContentRequest.{loc}: {message}\n")


def _check_fields(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    names = set(allowed) | {snake(n) for n in allowed}
    for key in body:
        if key not in names:
            raise _invalid(f'Invalid JSON payload received. Unknown name "{key}": Cannot find field.')


def _part_kind(part: dict[str, Any]) -> str | None:
    return next((k for k in PART_DATA if get(part, k) is not None), None)


def _check_contents(contents: Any, where: str = "contents") -> None:
    if contents is None or contents == []:
        raise _field_error(where, "contents is not specified")
    if not isinstance(contents, list):
        raise _invalid(f'Invalid value at \'{snake(where)}\' (type.googleapis.com/google.ai.generativelanguage.v1beta.'
                       f'Content), {json.dumps(contents)[:80]}')
    for i, content in enumerate(contents):
        loc = f"{where}[{i}]"
        if not isinstance(content, dict):
            raise _invalid(f"Invalid value at '{snake(loc)}' (type.googleapis.com/google.ai.generativelanguage."
                           f"v1beta.Content), {json.dumps(content)[:80]}")
        role = content.get("role")
        if role not in (None, "", *ROLES):
            raise _invalid("Please use a valid role: user, model.")
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            raise _field_error(f"{loc}.parts", "contents.parts must not be empty.")
        for k, part in enumerate(parts):
            if not isinstance(part, dict) or _part_kind(part) is None:
                raise _field_error(f"{loc}.parts[{k}].data", "required oneof field 'data' must have one "
                                   "initialized field")
            call = get(part, "functionCall")
            if call is not None and (not isinstance(call, dict) or not call.get("name")):
                raise _field_error(f"{loc}.parts[{k}].function_call.name", "Name cannot be empty.")
            answer = get(part, "functionResponse")
            if answer is not None and (not isinstance(answer, dict) or not answer.get("name")):
                raise _field_error(f"{loc}.parts[{k}].function_response.name", "Name cannot be empty.")


def _role(content: dict[str, Any]) -> str:
    return content.get("role") or "user"


def _calls(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in content["parts"] if get(p, "functionCall") is not None]


def _responses(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in content["parts"] if get(p, "functionResponse") is not None]


def _check_turns(contents: list[dict[str, Any]]) -> None:
    """A function call turn follows a user or function response turn, and is answered call for call."""
    for i, content in enumerate(contents):
        if _role(content) != "model" or not _calls(content):
            continue
        if i > 0 and _role(contents[i - 1]) != "user":
            raise _invalid("Please ensure that function call turn comes immediately after a user turn or after a "
                           "function response turn.")
        after = contents[i + 1] if i + 1 < len(contents) else None
        if after is not None and _responses(after) and len(_responses(after)) != len(_calls(content)):
            raise _invalid("Please ensure that the number of function response parts is equal to the number of "
                           "function call parts of the function call turn.")


def current_turn_start(contents: list[dict[str, Any]]) -> int:
    """Index of the last user content with a text part and no functionResponse (0 if none)."""
    for i in range(len(contents) - 1, -1, -1):
        parts = contents[i]["parts"]
        if _role(contents[i]) == "user" and any(isinstance(get(p, "text"), str) for p in parts) \
                and not any(get(p, "functionResponse") is not None for p in parts):
            return i
    return 0


def missing_signature(name: str, position: int) -> str:
    """The API's refusal of a function call without its thought signature, word for word as users report it."""
    return ("Function call is missing a thought_signature in functionCall parts. This is required for tools to work "
            "correctly, and missing thought_signature may lead to degraded model performance. Additional data, "
            f"function call `default_api:{name}` , position {position}. Please refer to "
            "https://ai.google.dev/gemini-api/docs/thought-signatures for more details.")


def _check_signatures(contents: list[dict[str, Any]]) -> None:
    for i in range(current_turn_start(contents), len(contents)):
        content = contents[i]
        calls = _calls(content) if _role(content) == "model" else []
        if calls and not get(calls[0], "thoughtSignature"):
            raise _invalid(missing_signature(get(calls[0], "functionCall")["name"], i + 1))


def _check_system(system: Any) -> None:
    if system is None:
        return
    if not isinstance(system, dict):
        raise _invalid("Invalid value at 'system_instruction' (type.googleapis.com/google.ai.generativelanguage."
                       f"v1beta.Content), {json.dumps(system)[:80]}")
    parts = system.get("parts")
    if not isinstance(parts, list) or not all(isinstance(p, dict) and _part_kind(p) for p in parts):
        raise _field_error("system_instruction.parts", "required oneof field 'data' must have one initialized field")


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _invalid("Invalid value at 'tools' (type.googleapis.com/google.ai.generativelanguage.v1beta.Tool), "
                       f"{json.dumps(tools)[:80]}")
    for k, tool in enumerate(tools):
        for j, decl in enumerate(get(tool, "functionDeclarations") or []):
            if not isinstance(decl, dict) or not decl.get("name"):
                raise _field_error(f"tools[{k}].function_declarations[{j}].name", "Name cannot be empty.")


def validate(body: Any, model: str) -> None:
    """Raise the 400 the API answers for a generateContent `body` sent to `model`, if any."""
    if not isinstance(body, dict):
        raise _invalid('Invalid JSON payload received. Unknown name "": Root element must be a message.')
    _check_fields(body, REQUEST_FIELDS)
    _check_contents(get(body, "contents"))
    _check_system(get(body, "systemInstruction"))
    _check_tools(get(body, "tools"))
    _check_turns(get(body, "contents"))
    if signatures_required(model):
        _check_signatures(get(body, "contents"))


def count_request(body: Any) -> dict[str, Any]:
    """The request a countTokens body counts: its `generateContentRequest`, or its own `contents` alone."""
    if not isinstance(body, dict):
        raise _invalid('Invalid JSON payload received. Unknown name "": Root element must be a message.')
    _check_fields(body, ("contents", "generateContentRequest"))
    inner = get(body, "generateContentRequest")
    if inner is not None and get(body, "contents") is not None:
        raise _invalid("contents and generate_content_request cannot both be set.")
    if inner is None:
        _check_contents(get(body, "contents"), "contents")
        return {"contents": get(body, "contents")}
    if not isinstance(inner, dict):
        raise _invalid('Invalid JSON payload received. Unknown name "generateContentRequest": Proto field is not '
                       "repeating, cannot start list.")
    _check_fields(inner, REQUEST_FIELDS)
    _check_contents(get(inner, "contents"))
    _check_system(get(inner, "systemInstruction"))
    _check_tools(get(inner, "tools"))
    return inner


# --------------------------------------------------------------------------- rendering

def _sorted_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def render_part(part: dict[str, Any]) -> str:
    """The text one part is billed as (see the module docstring)."""
    text = get(part, "text")
    if isinstance(text, str):
        return f"<thought>{text}" if get(part, "thought") else text
    call = get(part, "functionCall")
    if isinstance(call, dict):
        return f"<function_call>{call.get('name')}({_sorted_json(call.get('args') or {})})"
    answer = get(part, "functionResponse")
    if isinstance(answer, dict):
        response = answer.get("response")
        fields = sorted(response.items()) if isinstance(response, dict) else [("response", response)]
        return f"<function_response>{answer.get('name')}" + "".join(
            f"\n{k}: {v if isinstance(v, str) else _sorted_json(v)}" for k, v in fields)
    if isinstance(get(part, "inlineData"), dict):
        return f"[{get(get(part, 'inlineData'), 'mimeType')}]"
    if isinstance(get(part, "fileData"), dict):
        return f"[file {get(get(part, 'fileData'), 'fileUri')}]"
    if isinstance(get(part, "executableCode"), dict):
        return str(get(part, "executableCode").get("code", ""))
    if isinstance(get(part, "codeExecutionResult"), dict):
        return str(get(part, "codeExecutionResult").get("output", ""))
    rest = {k: v for k, v in part.items() if k not in ("thoughtSignature", "thought_signature", "videoMetadata",
                                                         "video_metadata")}
    return _sorted_json(rest)


@dataclass
class Prompt:
    """What one request puts in front of the model, part by part."""

    chunks: list[mp.Chunk]

    @property
    def tokens(self) -> int:
        return sum(len(c) for c in self.chunks)


def render(body: dict[str, Any]) -> Prompt:
    """Chunks of a (valid) generateContent body."""
    texts: list[str] = []
    system = get(body, "systemInstruction")
    for k, part in enumerate(get(system, "parts") or []):
        texts.append(("<|system|>\n" if k == 0 else "") + render_part(part) + "\n")
    for tool in get(body, "tools") or []:
        decls = get(tool, "functionDeclarations")
        if isinstance(decls, list):
            texts += [f"<|tool|>{_sorted_json(d)}\n" for d in decls]
            rest = {k: v for k, v in tool.items() if k not in ("functionDeclarations", "function_declarations")}
            if rest:
                texts.append(f"<|tool|>{_sorted_json(rest)}\n")
        else:
            texts.append(f"<|tool|>{_sorted_json(tool)}\n")
    for content in get(body, "contents") or []:
        header = f"<|{_role(content)}|>\n"
        for n, part in enumerate(content["parts"]):
            texts.append((header if n == 0 else "") + render_part(part) + "\n")
    return Prompt([mp.tokens(t) for t in texts])


def prompt_chunks(body: dict[str, Any]) -> list[mp.Chunk]:
    """The token chunks of a generateContent `body`: system parts, function declarations, content parts."""
    return render(body).chunks


def prompt_token_ids(body: dict[str, Any]) -> list[int]:
    """The flat prompt the mock bills for a generateContent `body` (tests recompute cache hits from it)."""
    return [t for chunk in prompt_chunks(body) for t in chunk]


def prompt_tokens(body: dict[str, Any]) -> int:
    """promptTokenCount of a generateContent `body` (and countTokens' totalTokens for it)."""
    return render(body).tokens


def cached_tokens(common_prefix: int, model: str) -> int:
    """cachedContentTokenCount for a common prefix of this many tokens: exact, or 0 below the model's minimum."""
    return common_prefix if common_prefix >= min_cacheable_tokens(model) else 0


def include_thoughts(body: dict[str, Any]) -> bool:
    """Whether the request asks for thought summaries (generationConfig.thinkingConfig.includeThoughts)."""
    return get(get(get(body, "generationConfig"), "thinkingConfig"), "includeThoughts") is True
