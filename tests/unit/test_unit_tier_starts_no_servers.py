"""The unit tier starts no servers: no etcd, broker, gateway, S3 or Spark, no gRPC or asyncio server
on a port. Tests that need one belong in tests/integration (tests/support/recollect.py runs a unit
suite there again against a real server). A test that only stops a child process it started, or
binds a socket to check the port helpers themselves, is not starting a server."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent

# helpers whose whole job is to run a server
SERVER_MODULES = {
    "danube.cluster.etcd_server",
    "danube.server.app",
    "moto",
    "pyspark",
    "tests.support.broker",
    "tests.support.browser",
    "tests.support.cluster",
    "tests.support.danube_client_venv",
    "tests.support.etcd",
    "tests.support.gateway",
    "tests.support.inprocess",
    "tests.support.s3",
    "tests.support.tcp_proxy",
}
# single names that start one, from modules whose other helpers are fine in a unit test
SERVER_NAMES = {
    ("tests.support.fake_broker", "start_fake_server"),
    ("tests.support.processes", "running"),
}
# calls that open a listening server
SERVER_CALLS = {"add_insecure_port", "add_secure_port", "start_server", "start_unix_server", "create_server"}


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def servers_started_by(source: str) -> list[tuple[int, str]]:
    """(line, what) for every import of a server helper and every call that starts a server."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if any(alias.name == m or alias.name.startswith(m + ".") for m in SERVER_MODULES):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            for alias in node.names:
                full = f"{module}.{alias.name}"
                if any(x == m or x.startswith(m + ".") for m in SERVER_MODULES for x in (module, full)):
                    found.append((node.lineno, f"from {module} import {alias.name}"))
                elif (module, alias.name) in SERVER_NAMES:
                    found.append((node.lineno, f"from {module} import {alias.name}"))
        elif isinstance(node, ast.Call):
            called = _dotted(node.func)
            if called.rsplit(".", 1)[-1] in SERVER_CALLS or called in ("grpc.server", "grpc.aio.server", "aio.server"):
                found.append((node.lineno, f"{called}()"))
    return sorted(found)


def test_no_unit_test_module_starts_a_server():
    offenders = []
    for path in sorted(UNIT.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        for line, what in servers_started_by(path.read_text()):
            offenders.append(f"{path.relative_to(UNIT.parent.parent)}:{line}: {what}")
    assert not offenders, "unit tests that start servers (move them to tests/integration):\n" + "\n".join(offenders)


def test_the_check_sees_each_way_of_starting_a_server():
    bad = """
import tests.support.etcd
from tests.support import cluster
from tests.support.inprocess import served_broker
from tests.support.fake_broker import FakeBroker, start_fake_server
from tests.support.processes import running, stop_process
import grpc
server = grpc.aio.server()
server.add_insecure_port("127.0.0.1:0")
await asyncio.start_server(handle, "127.0.0.1", 0)
"""
    found = [what for _, what in servers_started_by(bad)]
    assert found == [
        "import tests.support.etcd",
        "from tests.support import cluster",
        "from tests.support.inprocess import served_broker",
        "from tests.support.fake_broker import start_fake_server",
        "from tests.support.processes import running",
        "grpc.aio.server()",
        "server.add_insecure_port()",
        "asyncio.start_server()",
    ]
    fine = """
from tests.support.fake_broker import FakeBroker
from tests.support.processes import stop_process
from tests.support.waiting import wait_until
from danube.metadata.embedded import EmbeddedMetadataStore
"""
    assert servers_started_by(fine) == []
