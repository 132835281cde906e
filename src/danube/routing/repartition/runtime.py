"""The repartition runtime of a broker: what its edges consult for live repartition, one per broker.

:func:`install` puts the broker's :class:`RepartitionRuntime` (the version fence, the topology hub
and the delivery gates) in its ``repartition`` slot (``danube.broker.contracts.RepartitionHook``):
the broker tells it of every topic it opens and asks it how many partitions a consumer reads; the
batch lane admits batches through its fence.  :func:`for_broker` returns it, installing it on
first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING

from danube.errors import NotFoundError
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.routing.repartition.controller import AdoptionReporter, Finalizer
from danube.routing.repartition.gate import DeliveryGates
from danube.routing.repartition.model import CUTOVER, DEFAULT_ADOPTION_TIMEOUT_MS
from danube.routing.repartition.store import RepartitionStore, readable_partitions
from danube.routing.repartition.topology import TopologyHub
from danube.routing.repartition.version_fence import NeedsCatchUp, StaleRoutingError, VersionFence

if TYPE_CHECKING:
    from danube.broker.contracts import RepartitionHook
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 0.5
GATE_INTERVAL_S = 0.1


class RepartitionRuntime:
    def __init__(self, broker: BrokerService, *, adoption_timeout_ms: int = DEFAULT_ADOPTION_TIMEOUT_MS) -> None:
        self.broker = broker
        self.store = RepartitionStore(broker.metadata)
        self.fence = VersionFence(self.store, next_offset=self._next_offset, owner_url=self._owner_url)
        self.hub = TopologyHub(self.fence, owner_url=self._owner_url)
        self.reporter = AdoptionReporter(broker.metadata, broker.broker_id, self.hub.tracker)
        self.finalizer = Finalizer(
            self.store,
            lambda: self.fence.states,
            is_leader=self._is_leader,
            live_brokers=self._live_brokers,
            guard=self._guard,
            adoption_timeout_ms=adoption_timeout_ms,  # the broker's repartition_adoption_timeout_ms
        )
        self.gates = DeliveryGates(broker, broker.metadata)
        self.fence.add_listener(lambda topic, state, revision: self.gates.install(topic, state))
        self.fence.add_listener(self._retired)
        self.fence.on_stored = lambda name: self.gates.ensure(name, self.fence.states)
        self._sweeper: asyncio.Task | None = None
        self._loops: list[asyncio.Task] = []
        self._opening: dict[str, asyncio.Task] = {}  # unserved partitions being opened / placed
        self._slow: dict[str, int] = {}  # partition -> batches admitted through the lock
        self._admit_locks: dict[str, asyncio.Lock] = {}

    def _retired(self, topic: str, state, revision: int) -> None:
        """A grow that covers a retired partition again deleted its terminated marker in the cutover
        (an earlier version terminated retired partitions): the owner lifts the flag."""
        if state is None:
            return
        for p in range(state.partitions):
            t = self.broker.topics.get(f"{topic}-part-{p}")
            if t is not None and t.terminated:
                self.broker.mark_terminated(t.name, False)

    def topic_opened(self, name: str) -> None:
        """The broker opened ``name``: a target of a cutover or of a pending hold gets its gate now,
        holding every subscription until the next gate pass, before a subscription can read it."""
        self.gates.ensure(name, self.fence.states)

    async def readable_partitions(self, topic: str, count: int) -> int:
        return await readable_partitions(self.broker.metadata, topic, count)

    def _is_leader(self) -> bool:
        cluster = self.broker.cluster
        if cluster is None:  # standalone (embedded store): this broker decides; cluster: not joined yet
            return isinstance(self.broker.metadata, EmbeddedMetadataStore)
        return bool(cluster.election.is_leader)

    def _live_brokers(self) -> list[str]:
        cluster = self.broker.cluster
        if cluster is None:
            return [self.broker.broker_id]
        return list(cluster.view.registered)

    def _guard(self) -> list:
        cluster = self.broker.cluster
        return cluster.election.guard() if cluster is not None else []

    def _next_offset(self, name: str) -> int | None:
        topic = self.broker.topics.get(name)
        if topic is None or topic.closed:
            return None
        return topic.storage.next_offset

    def _owner_url(self, name: str) -> str | None:
        cluster = self.broker.cluster
        if cluster is None:
            return self.broker.broker_url
        view = cluster.view
        owner = view.owner(name)
        return view.broker_url(owner) if owner else None

    def start(self) -> None:
        self.fence.start()
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
            self._loops = [asyncio.ensure_future(self.reporter.run()), asyncio.ensure_future(self.finalizer.run())]
            # the broker cancels its background tasks when it stops
            for task in (self.fence._task, self._sweeper, *self._loops):
                if task is not None:
                    self.broker.track_task(task)

    async def stop(self) -> None:
        await self.fence.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for task in [*self._loops, *self._opening.values()]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._opening.values(), return_exceptions=True)
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
                    self._open_unrecorded()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                log.warning("repartition sweep failed", exc_info=True)

    # ------------------------------------------------------------ partitions nobody serves

    def _open_unrecorded(self) -> None:
        """A source whose ``old_end`` (or a target whose ``new_start``) is missing and that no broker
        has open never gets it recorded by a fence, and the transition would wait for it forever.
        Its owner opens it (the fence's sweep then records its next offset: no old-version batch
        can land after that, every fence refuses those); one with no owner is looked up by the
        leader, so the cluster's normal placement assigns it."""
        for base, state in list(self.fence.states.items()):
            t = state.transition
            if t is None or t.phase != CUTOVER:
                continue
            missing = {s for s in t.sources if s not in t.old_end} | {x for x in t.targets if x not in t.new_start}
            for i in sorted(missing):
                name = f"{base}-part-{i}"
                if name in self.broker.topics or name in self._opening:
                    continue
                owner = self._owner(name)
                if owner == self.broker.broker_id:
                    work = self._open(base, i, t.to_version, i in t.sources)
                elif owner is None and self._is_leader():
                    work = self._place(name)
                else:
                    continue
                task = self._opening[name] = asyncio.ensure_future(work)
                task.add_done_callback(functools.partial(self._opened, name))

    def _opened(self, name: str, _task: asyncio.Future) -> None:
        self._opening.pop(name, None)

    def _owner(self, name: str) -> str | None:
        cluster = self.broker.cluster
        if cluster is None:
            return self.broker.broker_id
        return cluster.view.owner(name)

    async def _open(self, base: str, index: int, to_version: int, source: bool) -> None:
        name = f"{base}-part-{index}"
        try:
            await self.broker.topic(name)
        except NotFoundError:
            # never created: nothing was stored under the old version, and only this owner could
            # create it now, behind a fence that refuses the old version
            offsets = {"old_end": 0} if source else {"new_start": 0}
            self.fence._write(base, index, to_version, **offsets)
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - tried again on the next sweep
            log.warning("opening %s to record its repartition offsets failed", name, exc_info=True)
            return
        log.info("repartition of %s: opened %s (unserved) to record its offsets", base, name)
        self.fence.sweep()

    async def _place(self, name: str) -> None:
        cluster = self.broker.cluster
        if cluster is None or name in cluster.view.unassigned:
            return  # placement is pending already
        try:
            await cluster.lookup(name)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - tried again on the next sweep
            log.warning("placing %s to record its repartition offsets failed", name, exc_info=True)

    # ------------------------------------------------------------ the batch lane's publish hook

    async def admit(self, name: str, version: int):
        """The fence for one batch (see VersionFence.admit); waits for the first snapshot once.

        A stream's batches are appended in the order they arrive only if each reaches the broker's
        publish in that order: one that must wait (the fence reads a newer state from the store)
        makes the partition's later batches queue behind it (a FIFO lock), else a later batch of the
        same producer could be admitted first and a key's messages stored out of order."""
        fence = self.fence
        if not fence._ready.is_set():
            self.start()
            await fence.ready()
        if not self._slow.get(name):
            try:
                return fence.admit(name, version)
            except NeedsCatchUp:
                pass
        self._slow[name] = self._slow.get(name, 0) + 1
        try:
            lock = self._admit_locks.setdefault(name, asyncio.Lock())
            async with lock:
                return await fence.admit_async(name, version)
        finally:
            self._slow[name] -= 1
            if not self._slow[name]:
                del self._slow[name]
                self._admit_locks.pop(name, None)


def install(broker: BrokerService, *, adoption_timeout_ms: int = DEFAULT_ADOPTION_TIMEOUT_MS) -> RepartitionRuntime:
    """Fill the broker's ``repartition`` slot with a new runtime (not started: the batch lane starts it)."""
    runtime = RepartitionRuntime(broker, adoption_timeout_ms=adoption_timeout_ms)
    broker.repartition = runtime
    return runtime


def for_broker(broker: BrokerService) -> RepartitionRuntime:
    """The broker's runtime, installed now with the default settings if nobody installed one."""
    if isinstance(broker.repartition, RepartitionRuntime):
        return broker.repartition
    return install(broker)


if TYPE_CHECKING:

    def _is_the_brokers_hook(runtime: RepartitionRuntime) -> RepartitionHook:  # mypy: fills the slot
        return runtime


__all__ = [
    "RepartitionRuntime",
    "StaleRoutingError",
    "for_broker",
    "install",
]
