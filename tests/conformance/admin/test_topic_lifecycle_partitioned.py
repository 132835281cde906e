"""danube-admin/tests/topic_lifecycle_partitioned.rs: a partitioned topic lists its partitions, one
partition cannot be deleted alone, deleting the base deletes them all."""

from __future__ import annotations

import json

from tests.conformance.admin.test_topic_lifecycle_non_partitioned import listed


def test_topic_lifecycle_partitioned(cli):
    ns = cli.unique_ns()
    base = f"/{ns}/cli-e2e-p"
    cli.create_ns(ns)

    cli.ok("topics", "create", base, "--partitions", "2", "--dispatch-strategy", "reliable")
    part0, part1 = f"{base}-part-0", f"{base}-part-1"
    names = listed(cli, ns)
    assert part0 in names and part1 in names

    r = cli.ok("topics", "subscriptions", part0, "--output", "json")
    assert isinstance(json.loads(r.stdout), list)

    r = cli("topics", "delete", part0)
    assert not r.ok, "deleting one partition must fail"
    assert "Cannot delete individual partition" in r.stderr, r.stderr
    assert part0 in listed(cli, ns)  # refused: nothing was deleted

    cli.ok("topics", "delete", base)
    names = listed(cli, ns)
    assert part0 not in names and part1 not in names
    cli.delete_ns(ns)
