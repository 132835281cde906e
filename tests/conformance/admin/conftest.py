"""Danube's admin-tool tests (danube-admin/tests/*.rs), ported: our `danube admin` against a real broker.

Each test runs twice: in Danube's syntax (``--output json`` after the command, ``topics list
--namespace NS``, ``topics configure-schema``, ...) and in this project's (``-o json`` before the
group, a positional namespace, ``schemas configure-topic``, ...), which :func:`ours` derives from
Danube's argv.  Commands run in this process through ``danube.cli.admin.main`` (a process per
command would cost a second each on a loaded 2-core machine); ``DANUBE_CONFORMANCE_SUBPROCESS=1``
runs every command as its own ``python -m danube.cli.main admin`` process instead, with the
endpoint in ``DANUBE_ADMIN_ENDPOINT`` as Danube's tests pass it.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.support.broker import running_broker

SYNTAXES = ("danube", "ours")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.code == 0


def ours(argv: list[str]) -> list[str]:
    """Danube's command line in this project's own spelling (the forms it had before it took Danube's)."""
    argv = list(argv)
    front: list[str] = []
    if "--output" in argv:
        i = argv.index("--output")
        front = ["-o", argv[i + 1]]
        del argv[i : i + 2]
    if argv[:2] == ["topics", "list"] and "--namespace" in argv:
        i = argv.index("--namespace")
        argv[i : i + 2] = [argv[i + 1]]
    elif argv[:2] == ["schemas", "set-compatibility"]:
        argv[1] = "compatibility"
    elif argv[:2] == ["topics", "configure-schema"]:
        argv[:2] = ["schemas", "configure-topic"]
        argv = [
            {"--validation-policy": "--policy", "--enable-payload-validation": "--payload-validation"}.get(a, a)
            for a in argv
        ]
    elif argv[:2] == ["topics", "get-schema-config"]:
        argv[:2] = ["schemas", "topic-config"]
    return front + argv


class AdminCli:
    """Danube's ``cli()`` of danube-admin/tests/common: one admin command against the broker."""

    def __init__(self, endpoint: str, syntax: str) -> None:
        self.endpoint = endpoint
        self.syntax = syntax
        self.subprocess = os.environ.get("DANUBE_CONFORMANCE_SUBPROCESS", "") not in ("", "0")

    def __call__(self, *argv: str) -> Result:
        args = list(argv) if self.syntax == "danube" else ours(list(argv))
        if self.subprocess:
            env = {**os.environ, "DANUBE_ADMIN_ENDPOINT": self.endpoint}
            done = subprocess.run(
                [sys.executable, "-m", "danube.cli.main", "admin", *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            return Result(done.returncode, done.stdout, done.stderr)
        from danube.cli import admin

        out, err = io.StringIO(), io.StringIO()
        old = os.environ.get("DANUBE_ADMIN_ENDPOINT")
        os.environ["DANUBE_ADMIN_ENDPOINT"] = self.endpoint
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = admin.main(args)
                except SystemExit as exc:  # argparse's usage errors
                    code = exc.code if isinstance(exc.code, int) else 2
        finally:
            if old is None:
                os.environ.pop("DANUBE_ADMIN_ENDPOINT", None)
            else:
                os.environ["DANUBE_ADMIN_ENDPOINT"] = old
        return Result(code, out.getvalue(), err.getvalue())

    def ok(self, *argv: str) -> Result:
        """The command, asserted to succeed (Danube's ``.assert().success()``)."""
        r = self(*argv)
        assert r.ok, f"{argv} ({self.syntax} syntax) exited {r.code}: {r.stdout}{r.stderr}"
        return r

    # danube-admin/tests/common
    def unique_ns(self) -> str:
        return f"ns-{int(time.time())}-{secrets.token_hex(3)}"

    def create_ns(self, ns: str) -> None:
        self.ok("namespaces", "create", ns)

    def delete_ns(self, ns: str) -> None:
        self("namespaces", "delete", ns)


@pytest.fixture(scope="session")
def admin_broker():
    with running_broker() as broker:
        yield broker


@pytest.fixture(params=SYNTAXES)
def cli(request, admin_broker) -> AdminCli:
    return AdminCli(f"http://127.0.0.1:{admin_broker.admin_port}", request.param)
