"""ctxproxy's benchmarks, a package so that they import each other by name.

Run each one from the repository root as a module, e.g. ``python -m bench.all``,
``python -m bench.replay --window 32000 --settings compress`` or
``python -m bench.overhead --quick``: ``-m`` puts the current directory on the
import path, so ``bench``, ``tests`` (the mock provider) and the working tree's
``proxy`` are found without any path set-up in the scripts. bench/README.md
lists them.
"""
