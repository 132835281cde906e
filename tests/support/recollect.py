"""Run a unit module's tests again in the integration tier against a real server.

The unit tier runs a suite against in-process fakes (the embedded metadata store); the integration
tier collects the same test functions a second time in a module of its own, where its conftest
defines the fixture they take (``metadata``, ``store``) as a client of a real etcd. Only the tests
that need that fixture, directly or through one of the module's fixtures, are copied, so no other
test runs twice.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any


def collect_again(namespace: dict[str, Any], module_name: str, fixture: str) -> list[str]:
    """Copy into ``namespace`` (the calling test module's globals) the tests of ``module_name`` that
    use ``fixture``, with the module's other names (its fixtures, helpers and ``pytestmark``) but not
    ``fixture`` itself, which the calling tier provides. Returns the copied tests' names."""
    module = importlib.import_module(module_name)
    names = vars(module)

    def uses(obj: Any, seen: frozenset[str] = frozenset()) -> bool:
        try:
            parameters = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return False
        for parameter in parameters:
            if parameter == fixture:
                return True
            helper = names.get(parameter)
            if parameter not in seen and helper is not None and callable(helper) and uses(helper, seen | {parameter}):
                return True
        return False

    tests = []
    for name, obj in names.items():
        if name.startswith("__") or name == fixture or name.startswith("Test"):
            continue
        if name.startswith("test"):
            if not (inspect.isfunction(obj) and uses(obj)):
                continue
            tests.append(name)
        namespace[name] = obj
    assert tests, f"{module_name} has no test using the {fixture!r} fixture"
    return tests
