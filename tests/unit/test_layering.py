"""Layers only point down (docs/internals.md, "Layers").

The import graph of ``src/danube`` is read from the source (every ``import`` and ``from ... import``,
also those inside functions and under ``TYPE_CHECKING``: a type is a dependency too), each module is
placed in the layer of its package, and every import of another package must go to a lower layer.
The client is a column of its own: besides the rule of its layer it may import only what
``CLIENT_MAY_IMPORT`` lists, so an application that installs it loads nothing of the broker side.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "danube"

# Top first.  Packages on one line are peers: neither imports the other.
LAYERS: list[tuple[str, ...]] = [
    ("danube.cli",),  # the `danube` command
    ("danube.gateway", "danube.spark"),  # the admin gateway; the Spark data source
    ("danube.server",),  # the gRPC edge and the app that wires it all
    ("danube.cluster", "danube.routing"),  # membership, load manager; scalable topics, repartition
    ("danube.client",),  # the async client (peers of the server use it too)
    ("danube.broker",),  # topics, producers, subscriptions, dispatch
    ("danube.storage", "danube.schema", "danube.security"),  # WAL + durable segments; schemas; JWT/TLS/RBAC
    ("danube.metadata", "danube.wal"),  # the metadata store; the embeddable WAL
    (
        "danube.message_codec",
        "danube.h2frames",
        "danube.protowire",
    ),  # the frame codec; the HTTP/2 vocabulary and protobuf varint both sides speak
    ("danube._native",),  # picks the compiled module or its pure twin
    ("danube._core", "danube._pure"),  # compiled modules and their pure twins
    ("danube.model",),  # pure models the client and the broker side share
    (
        "danube.status_codes",
        "danube.tlsfiles",
        "danube.proto",
        "danube._tasks",
        "danube.processes",
        "danube._allocator",
        "danube._gctune",
        "danube.movetrace",
        "danube.settings",
    ),  # small helpers every layer may use
    ("danube.errors",),  # the one error hierarchy
]

# What the client may import besides itself: no broker-side package, nothing with a server in it.
CLIENT_MAY_IMPORT = (
    "danube.message_codec",
    "danube.h2frames",
    "danube.protowire",
    "danube._native",
    "danube._core",
    "danube._pure",
    "danube.proto",
    "danube.errors",
    "danube.status_codes",
    "danube.tlsfiles",
    "danube._tasks",
    "danube.model",
    "danube.schema.tag",
)

# Edges against the order that stay for now, each with the reason (importer, imported).
ALLOWED: dict[tuple[str, str], str] = {
    (
        "danube.gateway.cli",
        "danube.cli._client_common",
    ): "`danube-gateway` runs its event loop and maps errors to exit codes as every `danube` command does",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """The danube modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    modules = _modules()
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m == "danube" or m.startswith("danube.")}


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _rank(package: str) -> int:
    for rank, layer in enumerate(LAYERS):
        if package in layer:
            return rank
    raise AssertionError(f"{package} is in no layer: add it to LAYERS here and to docs/internals.md")


def _violations() -> tuple[list[str], set[tuple[str, str]]]:
    wrong: list[str] = []
    used: set[tuple[str, str]] = set()
    for name, path in sorted(_modules().items()):
        if name == "danube":
            continue
        source = _package(name)
        for target in sorted(_imports(name, path)):
            dest = _package(target)
            if target == "danube" or dest == source:
                continue
            bad = []
            if _rank(dest) <= _rank(source):
                bad.append("not a lower layer")
            if source == "danube.client" and not target.startswith(CLIENT_MAY_IMPORT):
                bad.append("not in CLIENT_MAY_IMPORT")
            if bad:
                if (name, target) in ALLOWED:
                    used.add((name, target))
                else:
                    wrong.append(f"{name} -> {target} ({', '.join(bad)})")
    return wrong, used


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _modules() if m != "danube"}
    for package in packages:
        _rank(package)
    listed = {p for layer in LAYERS for p in layer}
    assert listed - packages == set(), "LAYERS names packages that do not exist"


def test_imports_only_point_down():
    wrong, used = _violations()
    assert wrong == [], "imports against the layer order (docs/internals.md):\n" + "\n".join(wrong)
    assert set(ALLOWED) - used == set(), "allowed edges that no longer exist: drop them from ALLOWED"


def test_the_graph_sees_imports_inside_functions():
    # The batch lane imports the repartition runtime inside its constructor: the walk must find it,
    # or an upward import hidden in a function would pass unnoticed.
    imports = _imports("danube.server.batch_lane", _modules()["danube.server.batch_lane"])
    assert "danube.routing.repartition.runtime" in imports


def test_importing_the_client_loads_nothing_of_the_broker_side():
    code = "import sys, danube.client; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    danube = [m for m in loaded if m.startswith("danube.")]
    # (``danube.schema`` itself is the package of ``danube.schema.tag``: a docstring, no imports)
    wrong = [m for m in danube if not m.startswith(("danube.client", *CLIENT_MAY_IMPORT)) and m != "danube.schema"]
    assert wrong == [], f"importing danube.client loads the broker side: {wrong}"
    assert "danube.status_codes" in loaded  # the table it maps status codes with
