"""Agent-like traffic for phase 3: a coding agent's system prompt and tools, and its tool outputs."""

from __future__ import annotations

import random

AGENT_SYSTEM = (
    "You are a coding agent working in a Python repository. You can run shell commands, read and "
    "write files, search the code and list directories with the tools provided. Work step by step: "
    "inspect the relevant files first, make the smallest change that fixes the problem, run the "
    "tests, and report what you changed. Never invent file contents; read them. Keep answers short.\n"
) * 4


TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command in the repository and return its output.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command line to run."},
            "timeout": {"type": "integer", "description": "Seconds before the command is killed."}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file, optionally a range of lines.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "start": {"type": "integer"}, "end": {"type": "integer"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a whole file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the repository for a regular expression.",
        "parameters": {"type": "object", "properties": {
            "pattern": {"type": "string"}, "glob": {"type": "string"}}, "required": ["pattern"]}}},
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]


TOOL_NAMES = [t["function"]["name"] for t in TOOLS]
STREAM_SHARE = 0.3
BIG_RESULT_SHARE = 0.005  # tool results of ~100 KB (over the default 20k-token offload threshold)


def _code_lines(rng: random.Random, n: int) -> list[str]:
    words = ["self", "value", "result", "config", "request", "items", "index", "path", "token", "count",
             "message", "session", "store", "return", "await", "async", "def", "class", "if", "for"]
    return [f"{'    ' * rng.randint(0, 3)}{rng.choice(words)}_{rng.randint(0, 999)} = "
            f"{rng.choice(words)}({rng.choice(words)}, {rng.randint(0, 99999)})  # {rng.choice(words)}"
            for _ in range(n)]


class TextPool:
    """Pre-generated tool-output lines, so the client spends its CPU on requests, not on text."""

    def __init__(self, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.lines = _code_lines(rng, 4000)

    def text(self, rng: random.Random, size: int) -> str:
        """About `size` bytes of tool output, starting at a random line of the pool."""
        out, n = [], 0
        i = rng.randrange(len(self.lines))
        while n < size:
            line = self.lines[i % len(self.lines)]
            out.append(line)
            n += len(line) + 1
            i += 1
        return "\n".join(out)


def tool_result_size(rng: random.Random) -> int:
    """The size of one tool result, bytes: mostly 0.1-8 KB (lognormal), rarely 100 KB."""
    if rng.random() < BIG_RESULT_SHARE:
        return 100_000
    return int(min(8000, max(100, rng.lognormvariate(6.6, 0.9))))  # median ~ 700 bytes
