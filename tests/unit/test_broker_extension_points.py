"""The layers above the broker use only what ``BrokerService`` declares (danube/broker/contracts.py).

No ``getattr(broker, ...)`` (an attribute read that mypy cannot check), no ``broker._private``, and
every attribute another layer sets on the broker is one of the slots its constructor declares.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "danube"
BROKER_PACKAGE = SRC / "broker"

# ``getattr(broker, ...)``, ``getattr(self._broker, ...)``, ``getattr(self.admin.broker, ...)``
GETATTR = re.compile(r"\bgetattr\(\s*[\w.]*\b_?broker\s*,")
# ``broker._topic(...)``, ``self._broker._producer``
PRIVATE = re.compile(r"\b_?broker\._\w")


def _outside_the_broker() -> list[Path]:
    """Modules of the other layers that name the broker at all (not the generated protocol stubs)."""
    skip = (BROKER_PACKAGE, SRC / "proto")
    return sorted(p for p in SRC.rglob("*.py") if not any(d in p.parents for d in skip) and "broker" in p.read_text())


def _hits(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in _outside_the_broker():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(SRC.parent)}:{number}: {line.strip()}")
    return found


def _declared_slots() -> set[str]:
    """The attributes ``BrokerService.__init__`` assigns (``self.x = ...``, ``self.x: T = ...``)."""
    tree = ast.parse((BROKER_PACKAGE / "service.py").read_text())
    service = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BrokerService")
    init = next(n for n in service.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    slots = set()
    for node in ast.walk(init):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                slots.add(target.attr)
    return slots


def _is_broker(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in ("broker", "_broker")


def test_the_patterns_catch_what_they_forbid():
    assert GETATTR.search('peers = getattr(broker, "peers", None)')
    assert GETATTR.search('x = getattr(self.admin.broker, "cluster", None)')
    assert PRIVATE.search("await self.broker._topic(name, reliable=None, create=False)")
    assert PRIVATE.search("load = self._broker._producer")
    assert not GETATTR.search('getattr(topic, "closed", False)')
    assert not PRIVATE.search("self._broker.producer(producer_id)")


def test_no_getattr_on_the_broker_outside_it():
    hits = _hits(GETATTR)
    assert hits == [], "declare the attribute on BrokerService (a slot, broker/contracts.py):\n" + "\n".join(hits)


def test_no_private_broker_member_used_outside_it():
    hits = _hits(PRIVATE)
    assert hits == [], "give BrokerService a public method for it:\n" + "\n".join(hits)


def test_attributes_set_on_the_broker_are_declared_slots():
    slots = _declared_slots()
    assert {"cluster", "peers", "repartition", "rebalancer", "schema_gate", "remote_publisher"} <= slots
    undeclared, seen = [], set()
    for path in _outside_the_broker():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if not (isinstance(target, ast.Attribute) and _is_broker(target.value)):
                        continue
                    seen.add(target.attr)
                    if target.attr not in slots:
                        undeclared.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: broker.{target.attr}")
    # the walk sees the slots the layers above fill (server/auth, cluster/node, routing/repartition)
    assert {"peers", "rebalancer", "remote_publisher", "repartition", "schema_gate"} <= seen
    assert undeclared == [], "set on the broker but not declared in BrokerService.__init__:\n" + "\n".join(undeclared)
