"""``python -m bench.scaling``: see bench/scaling/__init__.py."""

from bench.scaling.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
