"""The status bar's defaults that its settings name: what an error looks like, what a todo tool looks like.

A module of its own so that reading the configuration (proxy/config.py, through
proxy/rewrite/settings.py) loads no codec: these are plain values.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ERROR_PATTERN = (r"(?im)^(?:error|fatal|exception)\b|traceback \(most recent call last\)|\bcommand not found\b"
                         r"|\bno such file or directory\b|\bpermission denied\b|\bexit (?:code|status):? *[1-9]"
                         r"|\b(?:\w+error|\w+exception):|\bsegmentation fault\b|\bfailed\b")


@dataclass(frozen=True)
class TodoShape:
    """How a client's todo tool looks: tool names, the list argument, the status field and its done and active
    values, and the fields naming an item (the first present is shown for the item in progress)."""

    tools: tuple[str, ...] = ("todo_write", "TodoWrite", "write_todos", "update_todos", "todowrite")
    list_arg: str = "todos"
    status_field: str = "status"
    done_values: tuple[str, ...] = ("completed", "done", "complete")
    active_values: tuple[str, ...] = ("in_progress", "in-progress", "active", "doing")
    name_fields: tuple[str, ...] = ("content", "title", "text", "description", "task")
