"""Every `danube admin` subcommand against a 3-broker cluster (real etcd), `-o json`, asked of each
broker in turn: the answers agree whichever broker is asked (forwarded to the owner or the leader
where it must act)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import time

import pytest

from danube.cli import admin as admin_cli
from tests.support.cluster import local_cluster, wait_until
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(120)]


def _run(endpoint: str, *args: str) -> tuple[int, object]:
    """`danube admin --endpoint E -o json ARGS` (the CLI's own entry point, in this process: a
    subprocess per call would cost a Python start each); (exit code, parsed JSON or stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = admin_cli.main(["--endpoint", endpoint, "-o", "json", "--timeout", "30", *args])
        except SystemExit as exc:
            code = exc.code
    return code, (json.loads(out.getvalue()) if code == 0 else err.getvalue())


def test_every_admin_subcommand_agrees_whichever_broker_is_asked(tmp_path):
    started = time.monotonic()
    with local_cluster(str(tmp_path / "c")) as cluster:
        urls = [p.admin_url for p in cluster.procs]
        ids = sorted(p.broker_id for p in cluster.procs)

        def ok(url, *args):
            code, data = _run(url, *args)
            assert code == 0, (url, args, data)
            return data

        def same(*args, key=lambda d: d):
            # Each broker answers from its own watched view of etcd, so right after start-up (or a
            # change) the views may lag by a watch event: ask again until they agree, then check.
            deadline = time.monotonic() + 10
            while True:
                answers = [key(ok(u, *args)) for u in urls]
                if all(a == answers[0] for a in answers) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert all(a == answers[0] for a in answers), (args, answers)
            return answers[0]

        # brokers
        brokers = same("brokers", "list")
        assert sorted(b["broker_id"] for b in brokers) == ids
        assert {b["admin_addr"] for b in brokers} == set(urls)
        leader = same("brokers", "leader-broker")["leader"]
        assert [b["broker_id"] for b in brokers if b["broker_role"] == "Cluster_Leader"] == [leader]
        balance = same(
            "brokers", "balance", key=lambda d: (d["strategy"], sorted(b["broker_id"] for b in d["brokers"]))
        )
        assert balance[1] == ids

        # namespaces on the shared metadata store
        assert ok(urls[0], "namespaces", "create", "adm") == {"success": True}
        assert _run(urls[1], "namespaces", "create", "adm")[0] == 1  # already exists, seen by another broker
        assert "adm" in same("namespaces", "list") and "adm" in same("brokers", "namespaces")
        assert same("namespaces", "policies", "adm") == {}

        # topics: created through one broker, placed, listed the same by every broker
        assert ok(urls[1], "topics", "create", "/adm/t1", "-s", "reliable") == {"success": True}
        assert ok(urls[2], "topics", "create", "/adm/p", "--partitions", "2") == {"success": True}
        assert _run(urls[0], "topics", "create", "/adm/t1")[0] == 1
        parts = ["/adm/p-part-0", "/adm/p-part-1"]

        def listed():
            answers = [ok(u, "topics", "list", "adm") for u in urls]
            placed = {t["name"]: t for t in answers[0] if t["broker_id"]}
            return answers[0] if all(a == answers[0] for a in answers) and {"/adm/t1", *parts} <= set(placed) else None

        topics = {t["name"]: t for t in wait_until(listed, 15, "every broker listing the placed topics")}
        assert topics["/adm/t1"]["delivery"] == "Reliable" and topics[parts[0]]["delivery"] == "NonReliable"
        owner = topics["/adm/t1"]["broker_id"]
        assert owner in ids
        assert {"/adm/t1", *parts} <= set(same("namespaces", "topics", "adm"))
        by_broker = same("topics", "list", "--broker", owner)
        assert "/adm/t1" in [t["name"] for t in by_broker] and all(t["broker_id"] == owner for t in by_broker)

        # a subscription made on the owner, seen and dropped through every broker
        asyncio.run(_subscribe(cluster.procs[0].url, "/adm/t1", "s1"))
        described = same("topics", "describe", "/adm/t1")
        assert described["broker_id"] == owner and described["delivery"] == "Reliable"
        assert described["subscriptions"] == ["s1"] and "storage" in described  # the owner's storage figures
        assert same("topics", "subscriptions", "/adm/t1") == ["s1"]
        other = next(u for p, u in zip(cluster.procs, urls) if p.broker_id != owner)
        assert ok(other, "topics", "unsubscribe", "/adm/t1", "--subscription", "s1") == {"success": True}
        assert same("topics", "subscriptions", "/adm/t1") == []

        # moves and drain through a non-owner
        assert ok(other, "topics", "unload", "/adm/t1") == {"success": True}
        wait_until(
            lambda: (lambda d: d if d["broker_id"] and d["broker_id"] != owner else None)(
                ok(urls[0], "topics", "describe", "/adm/t1")
            ),
            20,
            "the unloaded topic placed elsewhere",
        )
        dry = ok(urls[0], "brokers", "unload", ids[2], "--dry-run")
        assert dry["started"] is False and dry["total"] >= 0
        assert ok(urls[1], "brokers", "activate", ids[2]) == {"success": True}

        # deletes
        assert _run(urls[0], "namespaces", "delete", "adm")[0] == 1  # not empty
        assert ok(other, "topics", "delete", "/adm/t1") == {"success": True}
        assert ok(urls[0], "topics", "delete", "/adm/p") == {"success": True}
        assert _run(urls[1], "topics", "describe", "/adm/t1")[0] == 1
        wait_until(lambda: all(ok(u, "topics", "list", "adm") == [] for u in urls), 10, "no topic left in adm")
        assert ok(urls[2], "namespaces", "delete", "adm") == {"success": True}
        assert "adm" not in same("namespaces", "list")

        # the endpoint from DANUBE_ADMIN_ENDPOINT, through the real command line
        done = subprocess.run(
            [sys.executable, "-m", "danube.cli.main", "admin", "-o", "json", "brokers", "leader-broker"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DANUBE_ADMIN_ENDPOINT": urls[2]},
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"leader": leader}
    print(f"admin cluster test: {time.monotonic() - started:.1f} s")


async def _subscribe(service_url: str, topic: str, subscription: str) -> None:
    from danube.client import DanubeClient

    client = DanubeClient.builder().service_url(service_url).build()
    try:
        consumer = (
            client.new_consumer()
            .with_topic(topic)
            .with_consumer_name("c1")
            .with_subscription(subscription)
            .with_reliable(True)
            .build()
        )
        await consumer.subscribe()
        await consumer.close()
    finally:
        await client.close()
