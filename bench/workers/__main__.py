"""``python -m bench.workers``: see bench/workers/__init__.py."""

from bench.workers.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
