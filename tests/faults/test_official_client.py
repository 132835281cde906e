"""Broker faults under danube-client 0.5.0 with its default options (a Reliable producer sending one
message at a time, an Exclusive consumer acking everything): an admin unload, a graceful stop
(SIGTERM) and a kill -9 of the topic's owner.  The client starts at another broker, which stays up
(a client whose only address is the dead broker has nowhere to go).  Nothing may reach the
application, every acked message is delivered in order, offsets stay continuous."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.faults.support import TTL, apply_fault, owner_and_entry, run_official_client, shared_config, unload
from tests.support.cluster import local_cluster, lookup
from tests.support.etcd import requires_etcd
from tests.support.waiting import wait_until

pytestmark = [requires_etcd, pytest.mark.timeout(240)]

# The longest one send may wait through each fault (loose bounds for 2 shared cores; docs/benchmarks.md
# has the measured figures of bench/faults.py)
BOUND_S = {"unload": 2.0, "rebalance": 2.0, "sigterm": 3.0, "kill9": TTL + 2 + 2.0, "sigstop": TTL + 2.5 + 3.0}


@pytest.mark.parametrize("fault", ["unload", "rebalance", "sigterm", "kill9", "sigstop"])
def test_official_client_rides_through(tmp_path, fault):
    base = str(tmp_path)
    topic = f"/default/fault-{fault}"
    with local_cluster(base, config=shared_config(base), lease_ttl=TTL) as cluster:
        # the topic exists and is placed before the client starts
        victim, entry = owner_and_entry(cluster, topic)
        outcome = run_official_client(
            base,
            entry.url,
            topic,
            lambda: apply_fault(fault, cluster, topic, entry, victim),
            after_s=TTL + 3 if fault in ("kill9", "sigstop") else 1.5,
        )
        figures = outcome.check()
        print(f"{fault}: {figures}")
        assert figures["recover_s"] < BOUND_S[fault], figures
        if fault == "sigstop":  # the woken owner was fenced: it stored and acked nothing more
            assert victim.alive()
            assert "fenced" in victim.log(), victim.log()[-3000:]


def test_a_client_connected_to_the_owner_follows_an_unload_at_once(tmp_path):
    """The client started at the owner itself (lookup answered Connect): after the unload its sends
    still go to the old owner, which forwards them to the new one instead of refusing them (the
    client would spend its 5 retries, 1.5-3 s, before looking the topic up again)."""
    base = str(tmp_path)
    topic = "/default/fault-direct"
    with local_cluster(base, config=shared_config(base), lease_ttl=TTL) as cluster:
        owner, entry = owner_and_entry(cluster, topic)
        outcome = run_official_client(
            base, owner.url, topic, lambda: apply_fault("unload", cluster, topic, owner, owner), after_s=1.5
        )
        figures = outcome.check()
        print(f"unload, client at the owner: {figures}")
        assert figures["recover_s"] < BOUND_S["unload"], figures


def test_acks_answered_ok_are_applied_across_moves(tmp_path):
    """Five unloads in a row while the consumer acks every message: an ack the broker answered OK was
    applied where the subscription's cursor lives (an ack that reached the old owner while it sealed
    the topic is held by the proxy and applied on the new owner), so no message whose ack was
    answered OK before a move is delivered again after it; the few redeliveries left are messages
    delivered but not yet acked when the move began."""
    base = str(tmp_path)
    topic = "/default/fault-acks"
    with local_cluster(base, config=shared_config(base), lease_ttl=TTL) as cluster:
        victim, entry = owner_and_entry(cluster, topic)

        def moves() -> list[float]:
            began = []
            for _ in range(5):
                _, owner = asyncio.run(lookup(entry.url, topic))
                began.append(time.time())
                asyncio.run(unload(entry.admin_url, topic))
                wait_until(lambda: asyncio.run(lookup(entry.url, topic))[1] != owner, timeout=30)
                time.sleep(0.4)
            return began

        outcome = run_official_client(base, entry.url, topic, moves, after_s=1.5)
        figures = outcome.check()
        again = outcome.redelivered_after_ok()
        print(f"5 unloads with acks in flight: {figures}, redelivered after an OK ack: {len(again)}")
        assert not again, f"delivered again although their acks were answered OK before a move: {again[:10]}"
        # at most the message being acked when each move began (it was received, its ack not yet answered)
        assert figures["redelivered"] <= 2 * 5, figures
