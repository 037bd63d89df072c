"""``python -m bench.overhead``: see bench/overhead/__init__.py."""

from bench.overhead.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
