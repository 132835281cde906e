"""danube-admin/tests/topic_lifecycle_non_partitioned.rs: create, list, describe, subscriptions, delete."""

from __future__ import annotations

import json


def listed(cli, ns: str) -> list[str]:
    r = cli.ok("topics", "list", "--namespace", ns, "--output", "json")
    return [item["name"] for item in json.loads(r.stdout) if "name" in item]


def test_topic_lifecycle_non_partitioned(cli):
    ns = cli.unique_ns()
    topic = f"/{ns}/cli-e2e"
    cli.create_ns(ns)

    cli.ok("topics", "create", topic, "--dispatch-strategy", "non_reliable")
    assert topic in listed(cli, ns)

    r = cli.ok("topics", "describe", topic, "--output", "json")
    assert '"schema_id"' in r.stdout
    described = json.loads(r.stdout)
    assert described["topic"] == topic and described["delivery"] == "NonReliable"

    r = cli.ok("topics", "subscriptions", topic, "--output", "json")
    assert json.loads(r.stdout) == []

    cli.ok("topics", "delete", topic)
    assert topic not in listed(cli, ns)
    cli.delete_ns(ns)
