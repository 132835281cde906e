"""danube-admin/tests/namespace_lifecycle.rs: a namespace is created, listed by the brokers, deleted."""

from __future__ import annotations

import json


def test_namespace_lifecycle_creates_and_deletes(cli):
    ns = cli.unique_ns()
    cli.create_ns(ns)
    r = cli.ok("brokers", "namespaces", "--output", "json")
    assert ns in r.stdout
    assert ns in json.loads(r.stdout)
    cli.delete_ns(ns)
    assert ns not in json.loads(cli.ok("brokers", "namespaces", "--output", "json").stdout)
