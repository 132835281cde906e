"""What the fault tests share: a 3-broker cluster on shared_fs with the WAL on the shared root, the
faults themselves, the official client's load script, and the checks every fault must pass."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import grpc

from danube.proto.danube_admin import admin_pb2 as admin_pb
from danube.proto.danube_admin import admin_pb2_grpc as admin_grpc
from tests.support.cluster import lookup
from tests.support.danube_client_venv import ensure_venv, start_script
from tests.support.processes import stop_process

TTL = 3  # lease ttl of the fault clusters (s): a kill -9 is served again within TTL + 2 s


def shared_config(base: str) -> str:
    """shared_fs with the WAL root on the shared directory (what failover without loss needs)."""
    shared = os.path.join(base, "shared")
    os.makedirs(shared, exist_ok=True)
    path = os.path.join(base, "shared.yml")
    with open(path, "w") as f:
        f.write(
            f"storage:\n  mode: shared_fs\n  local_wal_root: {shared}/wal\n  durable:\n    root: {shared}/durable\n"
        )
    return path


def owner_and_entry(cluster, topic: str):
    """(the owner's BrokerProc, another live broker's): clients start at the entry, which stays up."""
    _, owner = asyncio.run(lookup(next(p for p in cluster.procs if p.alive()).url, topic))
    victim = next(p for p in cluster.procs if p.url == owner)
    entry = next(p for p in cluster.procs if p is not victim and p.alive())
    return victim, entry


async def unload(admin_url: str, topic: str) -> None:
    async with grpc.aio.insecure_channel(admin_url.split("//")[1]) as ch:
        await admin_grpc.TopicAdminStub(ch).UnloadTopic(admin_pb.TopicRequest(name=topic), timeout=30)


async def rebalance_move(etcd_url: str, topic: str, source: str, target: str) -> None:
    """A move as the rebalancer writes it: the marker naming both brokers and the source's assignment
    deleted in one transaction (the source seals and confirms, the leader places it on ``target``)."""
    from danube.metadata import keys
    from danube.metadata.etcd import EtcdMetadataStore
    from danube.metadata.store import Op

    store = EtcdMetadataStore(etcd_url)
    try:
        marker = {"reason": "rebalance", "from_broker": source, "to_broker": target, "timestamp": int(time.time())}
        result = await store.txn(
            [], [Op.put_json(keys.unassigned(topic), marker), Op.delete(keys.broker_topic(source, topic))]
        )
        assert result.succeeded
    finally:
        await store.close()


def apply_fault(kind: str, cluster, topic: str, entry, victim) -> None:
    if kind == "unload":
        asyncio.run(unload(entry.admin_url, topic))
    elif kind == "rebalance":
        target = next(p for p in cluster.procs if p is not victim and p is not entry and p.alive())
        asyncio.run(rebalance_move(cluster.etcd.url, topic, victim.broker_id, target.broker_id))
    elif kind == "sigterm":
        stop_process(victim.proc, 30)
    elif kind == "kill9":
        victim.kill()
    elif kind == "etcd_restart":  # etcd crashes and is back within the lease ttl
        cluster.etcd.kill()
        cluster.etcd.start()
    elif kind == "etcd_down":  # etcd away for longer than the lease ttl
        cluster.etcd.kill()
        try:
            time.sleep(TTL + 2.5)
        finally:
            cluster.etcd.start()
    elif kind == "sigstop":  # a pause longer than the lease (a GC pause, a partition), then it wakes
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            time.sleep(TTL + 2.5)
        finally:
            os.kill(victim.pid, signal.SIGCONT)
    else:
        raise ValueError(kind)


@dataclass
class Outcome:
    """One client's run through a fault, checked the same way for both clients."""

    acked: list[tuple[int, float, float]]  # (i, start, end) of every acked send, in order
    received: list[tuple[int, str]]  # (offset, payload) in delivery order
    errors: list[str] = field(default_factory=list)  # what reached the application
    received_at: list[float] = field(default_factory=list)  # when each of ``received`` reached the application
    consumer_acks: list[tuple[int, float]] = field(default_factory=list)  # (offset, when its ack was answered OK)
    fault_at: list[float] = field(default_factory=list)  # when each fault began

    def redelivered_after_ok(self) -> list[int]:
        """Offsets delivered again after a fault although the consumer's ack of them was answered OK
        before that fault began (an OK ack must have been applied where the cursor lives)."""
        ok_at: dict[int, float] = {}
        for offset, t in self.consumer_acks:
            ok_at.setdefault(offset, t)
        bad = []
        for (offset, _), t in zip(self.received, self.received_at):
            acked = ok_at.get(offset)
            if acked is not None and any(acked < f < t for f in self.fault_at):
                bad.append(offset)
        return bad

    def check(self) -> dict:
        """No exception reached the application; every acked message delivered, in order per
        producer (redeliveries allowed and counted); offsets continuous.  Returns the figures."""
        assert not self.errors, f"errors reached the application: {self.errors[:3]}"
        assert self.acked, "nothing was acked"
        first: dict[int, str] = {}
        order: list[int] = []
        redelivered = 0
        for offset, payload in self.received:
            if offset in first:
                assert first[offset] == payload, f"offset {offset} holds {first[offset]} and {payload}"
                redelivered += 1
                continue
            first[offset] = payload
            order.append(offset)
        offsets = sorted(first)
        assert offsets == list(range(offsets[0], offsets[-1] + 1)), (
            f"offset gap: {sorted(set(range(offsets[0], offsets[-1] + 1)) - set(offsets))[:10]}"
        )
        seq = [int(first[o].split("-", 1)[1]) for o in offsets]
        stored_once = list(dict.fromkeys(seq))  # a message stored twice (a send retried after a crash)
        assert stored_once == sorted(stored_once), "messages of one producer stored out of order"
        delivered = set(seq)
        missing = [i for i, _, _ in self.acked if i not in delivered]
        assert not missing, f"{len(missing)} acked messages never delivered: {missing[:10]}"
        return {
            "acked": len(self.acked),
            "redelivered": redelivered,
            "stored_twice": len(seq) - len(delivered),
            "recover_s": self.recover_s(),
        }

    def recover_s(self) -> float:
        """The longest a send waited: the fault's cost to the producer."""
        return max(end - start for _, start, end in self.acked)


def run_official_client(
    tmp: str,
    entry_url: str,
    topic: str,
    fault,
    *,
    before_s: float = 1.0,
    after_s: float = 2.0,
    hold_file: str | None = None,
    delay_ms: int = 5,
) -> Outcome:
    """The official client's load script through ``fault()`` (called once its load runs).
    ``hold_file``: the application takes nothing from its consumer while that file exists."""
    ensure_venv()
    ready, stop = os.path.join(tmp, "ready"), os.path.join(tmp, "stop")
    extra = ["--hold-file", hold_file] if hold_file else []
    proc = start_script(
        "fault_load.py",
        entry_url,
        topic,
        "--ready-file",
        ready,
        "--stop-file",
        stop,
        "--delay-ms",
        str(delay_ms),
        *extra,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the client script did not start: {proc.communicate(timeout=10)}")
            time.sleep(0.05)
        time.sleep(before_s)
        fault_at = fault() or []
        time.sleep(after_s)
        open(stop, "w").close()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"client script failed ({proc.returncode}): {err[-3000:]}"
    result = json.loads(out.strip().splitlines()[-1])
    return Outcome(
        acked=[tuple(a) for a in result["acked"]],
        received=[(r[0], r[1]) for r in result["received"]],
        errors=result["errors"] + result["ack_errors"] + result["loop_errors"],
        received_at=[r[2] for r in result["received"]],
        consumer_acks=[tuple(a) for a in result["consumer_acks"]],
        fault_at=list(fault_at),
    )


def run_danube_client(
    entry_url: str,
    topic: str,
    fault,
    *,
    before_s: float = 1.0,
    after_s: float = 2.0,
    delay_s: float = 0.005,
    hold: threading.Event | None = None,
) -> Outcome:
    """The same application on ``danube.client`` (default options, the batch lane): one producer
    sending ``p-<i>`` one at a time (each awaited), one reliable consumer acking everything.
    ``hold``: while it is set the application takes nothing from its consumer."""
    from danube.client import DanubeClient

    async def scenario() -> Outcome:
        client = DanubeClient.builder().service_url(entry_url).build()
        consumer = (
            client.new_consumer()
            .with_topic(topic)
            .with_consumer_name("fc")
            .with_subscription("faults")
            .with_reliable()
            .build()
        )
        producer = client.new_producer().with_topic(topic).with_name("fp").with_reliable().build()
        await producer.create()
        await consumer.subscribe()
        out = Outcome(acked=[], received=[])
        running = True

        async def produce():
            i = 0
            while running:
                start = time.time()
                try:
                    await producer.send_and_wait(f"p-{i}".encode())
                except Exception as exc:  # noqa: BLE001 - what reached the application
                    out.errors.append(f"send of p-{i} raised {type(exc).__name__}: {exc}")
                    return
                out.acked.append((i, start, time.time()))
                i += 1
                await asyncio.sleep(delay_s)

        async def consume():
            while hold is not None and hold.is_set():
                await asyncio.sleep(0.02)
            async for m in consumer:
                while hold is not None and hold.is_set():
                    await asyncio.sleep(0.02)
                out.received.append((m.offset, bytes(m.payload).decode()))
                out.received_at.append(time.time())
                try:
                    await consumer.ack(m)
                except Exception as exc:  # noqa: BLE001 - what reached the application
                    out.errors.append(f"ack raised {type(exc).__name__}: {exc}")

        producing, consuming = asyncio.ensure_future(produce()), asyncio.ensure_future(consume())
        await asyncio.sleep(before_s)
        await asyncio.to_thread(fault)
        await asyncio.sleep(after_s)
        running = False
        await asyncio.wait_for(producing, 90)
        wanted = {f"p-{i}" for i, _, _ in out.acked}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not wanted <= {p for _, p in out.received}:
            if consuming.done():
                break
            await asyncio.sleep(0.1)
        if consuming.done() and consuming.exception() is not None:
            out.errors.append(f"receive raised {consuming.exception()!r}")
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
        await consumer.close()
        await producer.close()
        await client.close()
        return out

    return asyncio.run(scenario())


__all__ = [
    "run_danube_client",
    "TTL",
    "Outcome",
    "apply_fault",
    "owner_and_entry",
    "run_official_client",
    "shared_config",
    "unload",
]
