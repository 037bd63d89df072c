"""Import the `proxy` package from a chosen source directory (``--proxy-src``), e.g. a `git archive` snapshot.

The in-process benchmarks (scaling) measure the proxy code they import; with
``--proxy-src DIR`` that must be DIR's copy, not the working tree's (which
others may be editing) nor the installed one. The package is bound by file
location before anything imports it, so the import path stays as Python set it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def import_proxy_from(src: str) -> ModuleType:
    """The `proxy` package of `src`/proxy, imported now; later `import proxy.x` finds its modules there.

    Exits when another `proxy` was imported first (its modules would mix with DIR's)."""
    pkg_dir = os.path.join(os.path.abspath(src), "proxy")
    init = os.path.join(pkg_dir, "__init__.py")
    loaded = sys.modules.get("proxy")
    if loaded is not None:
        if os.path.dirname(os.path.abspath(loaded.__file__ or "")) == pkg_dir:
            return loaded
        raise SystemExit(f"--proxy-src {src}: `proxy` was already imported from {loaded.__file__}")
    if not os.path.exists(init):
        raise SystemExit(f"--proxy-src {src}: no proxy package there ({init} is missing)")
    spec = importlib.util.spec_from_file_location("proxy", init, submodule_search_locations=[pkg_dir])
    if spec is None or spec.loader is None:
        raise SystemExit(f"--proxy-src {src}: cannot import {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["proxy"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["proxy"]
        raise
    return module
