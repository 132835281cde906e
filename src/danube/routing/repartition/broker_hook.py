"""What the broker's edges consult for live repartition: one object per broker, built on demand.

``for_broker(broker)`` returns the broker's :class:`RepartitionRuntime` (the version fence, later
the topology hub and the delivery gate), creating it on first use and keeping it as
``broker.repartition``.  It needs the broker's metadata store and nothing else, so the batch lane
reaches it with one ``getattr`` and the broker's own code stays untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import os

from danube.metadata.embedded import EmbeddedMetadataStore
from danube.routing.repartition.controller import AdoptionReporter, Finalizer
from danube.routing.repartition.gate import DeliveryGates
from danube.routing.repartition.fence import NeedsCatchUp, PartitionFence, StaleRoutingError
from danube.routing.repartition.model import DEFAULT_ADOPTION_TIMEOUT_MS
from danube.routing.repartition.store import RepartitionStore
from danube.routing.repartition.topology import TopologyHub

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 0.5
GATE_INTERVAL_S = 0.1


class RepartitionRuntime:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.store = RepartitionStore(broker.metadata)
        self.fence = PartitionFence(self.store, next_offset=self._next_offset, owner_url=self._owner_url)
        self.hub = TopologyHub(self.fence, owner_url=self._owner_url)
        self.reporter = AdoptionReporter(broker.metadata, getattr(broker, "broker_id", "standalone"), self.hub.tracker)
        timeout = getattr(broker, "repartition_adoption_timeout_ms", None) or int(
            os.environ.get("DANUBE_REPARTITION_ADOPTION_TIMEOUT_MS", DEFAULT_ADOPTION_TIMEOUT_MS))
        self.finalizer = Finalizer(self.store, lambda: self.fence.states, is_leader=self._is_leader,
                                   live_brokers=self._live_brokers, guard=self._guard,
                                   adoption_timeout_ms=int(timeout))
        self.gates = DeliveryGates(broker, broker.metadata)
        self.fence.add_listener(lambda topic, state, revision: self.gates.install(topic, state))
        self.fence.add_listener(self._retired)
        self.fence.on_stored = lambda name: self.gates.ensure(name, self.fence.states)
        self._sweeper: asyncio.Task | None = None
        self._loops: list[asyncio.Task] = []

    def _retired(self, topic: str, state, revision: int) -> None:
        """Retired partitions served here refuse publishes (the finalizer wrote their terminated
        markers with the finalize, read by any later open); a grow that reopens one (its cutover
        deleted the marker) lifts the refusal."""
        mark = getattr(self.broker, "mark_terminated", None)
        served = getattr(self.broker, "topics", None)
        if state is None or mark is None or served is None:
            return
        for p in state.retired:
            mark(f"{topic}-part-{p}")
        for p in range(state.partitions):
            t = served.get(f"{topic}-part-{p}")
            if t is not None and getattr(t, "terminated", False):
                mark(t.name, False)

    def _is_leader(self) -> bool:
        cluster = getattr(self.broker, "cluster", None)
        if cluster is None:   # standalone (embedded store): this broker decides; cluster: not joined yet
            return isinstance(self.broker.metadata, EmbeddedMetadataStore)
        return bool(cluster.election.is_leader)

    def _live_brokers(self) -> list[str]:
        cluster = getattr(self.broker, "cluster", None)
        if cluster is None:
            return [getattr(self.broker, "broker_id", "standalone")]
        return list(cluster.view.registered)

    def _guard(self) -> list:
        cluster = getattr(self.broker, "cluster", None)
        return cluster.election.guard() if cluster is not None else []

    def _next_offset(self, name: str) -> int | None:
        topic = self.broker.topics.get(name)
        if topic is None or getattr(topic, "closed", False):
            return None
        return topic.storage.next_offset

    def _owner_url(self, name: str) -> str | None:
        cluster = getattr(self.broker, "cluster", None)
        view = getattr(cluster, "view", None)
        if view is None:
            return getattr(self.broker, "broker_url", None)
        owner = view.owner(name)
        return view.broker_url(owner) if owner else None

    def start(self) -> None:
        self.fence.start()
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
            self._loops = [asyncio.ensure_future(self.reporter.run()), asyncio.ensure_future(self.finalizer.run())]
            # the broker cancels its background tasks when it stops
            tasks = getattr(self.broker, "_tasks", None)
            if isinstance(tasks, set):
                for task in (self.fence._task, self._sweeper, *self._loops):
                    if task is not None:
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)

    async def stop(self) -> None:
        await self.fence.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []

    async def _sweep(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(GATE_INTERVAL_S)
            ticks += 1
            try:
                await self.gates.tick(self.fence.states)
                if ticks % int(SWEEP_INTERVAL_S / GATE_INTERVAL_S) == 0:
                    self.fence.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:   # noqa: BLE001
                log.warning("repartition sweep failed", exc_info=True)

    # ------------------------------------------------------------ the batch lane's publish hook

    async def admit(self, name: str, version: int):
        """The fence for one batch (see PartitionFence.admit); waits for the first snapshot once."""
        fence = self.fence
        if not fence._ready.is_set():
            self.start()
            await fence.ready()
        try:
            return fence.admit(name, version)
        except NeedsCatchUp:
            return await fence.admit_async(name, version)


def for_broker(broker: Any) -> RepartitionRuntime | None:
    runtime = getattr(broker, "repartition", None)
    if runtime is None and getattr(broker, "metadata", None) is not None:
        runtime = RepartitionRuntime(broker)
        broker.repartition = runtime
    return runtime


__all__ = ["RepartitionRuntime", "StaleRoutingError", "for_broker"]
