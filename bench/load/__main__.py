"""``python -m bench.load``: see bench/load/__init__.py."""

from bench.load.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
