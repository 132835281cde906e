"""Runs a scenario file of ``client/`` in the danube-client venv (one subprocess for all of its
tests) and hands each pytest test its own result."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support import danube_client_venv as dc

CLIENT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client")


class Results:
    def __init__(self, module: str, target: str, results: dict) -> None:
        self.module, self.target, self.results = module, target, results

    def check(self, name: str) -> None:
        """Fail with the client-side error when Danube's test ``name`` did not pass."""
        result = self.results.get(name)
        assert result is not None, f"{self.module} has no scenario {name!r} (ran: {sorted(self.results)})"
        if not result["ok"]:
            pytest.fail(
                f"{self.module}::{name} failed against {self.target} after {result['seconds']}s:\n{result['error']}",
                pytrace=False,
            )


def run(
    module: str,
    target,
    *,
    only: list[str] | None = None,
    parallel: int = 6,
    timeout: float = 300.0,
    scale: float = 3.0,
    env: dict | None = None,
) -> Results:
    """Run ``module``'s scenarios against ``target`` (anything with ``url`` and ``admin_url``);
    ``env``: more environment for the client (Danube's tests read some settings from it)."""
    dc.ensure_venv()
    cmd = [
        dc.python_path(),
        os.path.join(CLIENT_DIR, "runner.py"),
        module,
        "--url",
        target.url,
        "--admin-url",
        target.admin_url,
        "--parallel",
        str(parallel),
        "--scale",
        str(scale),
    ]
    if only:
        cmd += ["--only", *only]
    proc = subprocess.Popen(
        cmd,
        env={**dc.script_env(), **(env or {})},
        cwd=CLIENT_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{module} did not finish within {timeout}s\nstderr:\n{err[-5000:]}")
    return Results(module, target.url, dc.parse_result(module, proc.returncode, out, err))


def module_fixture(module: str, **kwargs):
    """A module-scoped fixture ``results``: ``module``'s scenarios run once against the session's broker."""

    @pytest.fixture(scope="module")
    def results(conformance_broker) -> Results:
        return run(module, conformance_broker, **kwargs)

    return results
