"""The keys a config.yaml location takes, and the nearest one to a key it does not.

A typo in a config key (`tool_result_token`, `offlaod`) is refused at start; the
refusal is only useful if it says what was meant. The valid keys at a location
are read from the settings models themselves (their fields, nested models,
mappings and lists of them), so the hint never lists a key the code lacks.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

_CLOSE = 0.6  # difflib's similarity cut-off: `offlaod` finds `offload`, `nonsense` finds nothing


def _fields(t: Any) -> dict[str, Any] | None:
    """Field name -> annotation of a settings model or dataclass; None for any other type."""
    if inspect.isclass(t) and issubclass(t, BaseModel):
        return {name: f.annotation for name, f in t.model_fields.items()}
    if inspect.isclass(t) and dataclasses.is_dataclass(t):
        return {f.name: f.type for f in dataclasses.fields(t)}
    return None


def _options(t: Any) -> list[Any]:
    """The types a value of annotation `t` may be (the members of an Optional or a union, else `t`)."""
    if get_origin(t) in (Union, types.UnionType):
        return [a for a in get_args(t) if a is not type(None)]
    return [t]


def _step(t: Any, part: int | str) -> Any | None:
    """The annotation one step into `t`: a model's field, a mapping's values, a sequence's items."""
    for option in _options(t):
        fields = _fields(option)
        if fields is not None:
            if isinstance(part, str) and part in fields:
                return fields[part]
            continue
        origin, args = get_origin(option), get_args(option)
        if origin is None or not args:
            continue
        if inspect.isclass(origin) and issubclass(origin, Mapping):
            return args[-1]
        if inspect.isclass(origin) and issubclass(origin, Sequence) and isinstance(part, int):
            return args[0]
    return None


def keys_at(model: type[BaseModel], loc: Iterable[int | str]) -> list[str]:
    """The keys valid at `loc` (a pydantic error location, without the unknown key itself) under `model`."""
    t: Any = model
    for part in loc:
        t = _step(t, part)
        if t is None:
            return []
    for option in _options(t):
        fields = _fields(option)
        if fields is not None:
            return list(fields)
    return []


def unknown(name: str, known: Iterable[str], what: str = "key") -> str:
    """`unknown key; did you mean 'x'?`, or the valid keys when none is near."""
    valid = sorted(set(known))
    close = difflib.get_close_matches(name, valid, n=1, cutoff=_CLOSE)
    if close:
        return f"unknown {what}; did you mean {close[0]!r}?"
    return f"unknown {what} (valid here: {', '.join(valid)})" if valid else f"unknown {what}"
