"""Chooses the compiled ``danube._core`` modules or their pure-Python twins.

``DANUBE_NO_EXTENSIONS=1`` forces the twins.  Without it the compiled module is
used when it imports; ``extensions_loaded()`` tells which one is in use.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_FORCE_PURE = os.environ.get("DANUBE_NO_EXTENSIONS", "") not in ("", "0")
_loaded: dict[str, bool] = {}


def load(name: str) -> ModuleType:
    """Return ``danube._core.<name>`` or, failing that or when forced, ``danube._pure.<name>``."""
    if not _FORCE_PURE:
        try:
            module = importlib.import_module(f"danube._core.{name}")
            _loaded[name] = True
            return module
        except ImportError:
            pass
    _loaded[name] = False
    return importlib.import_module(f"danube._pure.{name}")


def extensions_forced_off() -> bool:
    return _FORCE_PURE


def extensions_loaded() -> dict[str, bool]:
    """Which modules came from the compiled core (True) or the twin (False)."""
    return dict(_loaded)
