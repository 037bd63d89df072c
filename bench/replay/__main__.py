"""``python -m bench.replay``: see bench/replay/__init__.py."""

from bench.replay.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
